#include "algorithms/async_bilateral_exchange.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "comm/core/errors.h"

namespace gossipcc {

using gossip_internal::CheckBuffers;
using gossip_internal::DispatchFloating;
using gossip_internal::TotalCount;

namespace {

constexpr int64_t kDone = -1;

// The request (or "done") message: one int64.
Buffer RequestView(int64_t* value) { return Buffer{value, 1, DType::kInt64, Device::CPU()}; }

// x as one message: the buffer itself when there is one, else packed into `storage`.
Buffer PackedPayload(const std::vector<Buffer>& buffers, DType dtype, std::vector<uint64_t>* storage) {
  if (buffers.size() == 1) return buffers[0];
  const size_t count = TotalCount(buffers);
  storage->resize((count * ElementSize(dtype) + 7) / 8);
  char* out = reinterpret_cast<char*>(storage->data());
  for (const Buffer& b : buffers) {
    if (b.count > 0) std::memcpy(out, b.data, b.bytes());
    out += b.bytes();
  }
  return Buffer{storage->data(), count, dtype, Device::CPU()};
}

// Where a peer's x lands: `storage`, sized for it.
Buffer IncomingPayload(const std::vector<Buffer>& buffers, DType dtype, std::vector<uint64_t>* storage) {
  const size_t count = TotalCount(buffers);
  storage->resize((count * ElementSize(dtype) + 7) / 8);
  return Buffer{storage->data(), count, dtype, Device::CPU()};
}

// x <- (x + y) / 2 with y a peer's x, packed.
void AverageWith(const std::vector<Buffer>& buffers, DType dtype, const void* packed) {
  DispatchFloating(dtype, [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    using C = typename E::Compute;
    const S* y = static_cast<const S*>(packed);
    for (const Buffer& b : buffers) {
      S* x = static_cast<S*>(b.data);
      for (size_t i = 0; i < b.count; ++i) x[i] = E::Store((E::Load(x[i]) + E::Load(y[i])) / C(2));
      y += b.count;
    }
  });
}

DType CheckCpu(const char* what, const std::vector<Buffer>& buffers) {
  DType dtype = CheckBuffers(what, buffers);
  if (!buffers.empty() && buffers[0].device.is_cuda()) {
    throw InvalidArgumentError(absl::StrCat(what, ": buffers are on ", buffers[0].device.ToString(),
                                            "; asynchronous bilateral exchange supports CPU buffers only"));
  }
  return dtype;
}

}  // namespace

AsyncBilateralExchange::AsyncBilateralExchange(uint32_t tag) : tag_(tag) {}

std::vector<int> AsyncBilateralExchange::PassivePeers(int rank, int n) {
  if (n < 1 || rank < 0 || rank >= n) {
    throw InvalidArgumentError(absl::StrCat("async_bilateral_exchange: rank ", rank, " out of range [0, ", n, ")"));
  }
  std::set<int> peers;
  std::vector<int64_t> offsets = {1, -1};
  for (int64_t pw = 2; 1 + pw < n; pw *= 2) {
    offsets.push_back(1 + pw);
    offsets.push_back(-(1 + pw));
  }
  for (int64_t o : offsets) {
    int p = static_cast<int>(((rank + o) % n + n) % n);
    if (p != rank && !IsActive(p)) peers.insert(p);
  }
  return std::vector<int>(peers.begin(), peers.end());
}

int AsyncBilateralExchange::Exchange(Communicator& comm, std::vector<Buffer> buffers) {
  const int rank = comm.rank();
  const DType dtype = CheckCpu("async_bilateral_exchange", buffers);
  if (!IsActive(rank)) {
    throw InvalidArgumentError(absl::StrCat("async_bilateral_exchange: rank ", rank,
                                            " is passive (even); passive ranks call Serve, not Exchange"));
  }
  if (finished_) {
    throw InvalidArgumentError(absl::StrCat("async_bilateral_exchange: rank ", rank, " already called Finish"));
  }
  std::vector<int> peers = PassivePeers(rank, comm.size());
  const int peer = peers[static_cast<size_t>(exchanges_ % static_cast<int64_t>(peers.size()))];
  // The request number goes ahead on its own, so the passive rank learns who asks before x
  // arrives and sends its answer while x is still on the way: both directions at once.
  int64_t request = exchanges_, answer = -2;
  const Buffer mine = PackedPayload(buffers, dtype, &outgoing_);
  const Buffer theirs = IncomingPayload(buffers, dtype, &incoming_);
  const std::string where = absl::StrCat("async_bilateral_exchange request ", exchanges_, " from active rank ",
                                         rank, " to passive rank ", peer, " (", TotalCount(buffers), " x ",
                                         DTypeName(dtype), "): ");
  try {
    comm.p2p({P2POp::Send(RequestView(&request), peer, tag_), P2POp::Send(mine, peer, tag_ + 2),
              P2POp::Recv(RequestView(&answer), peer, tag_ + 1), P2POp::Recv(theirs, peer, tag_ + 3)})
        ->wait();
  } catch (const MismatchError& e) {
    throw MismatchError(where + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(where + e.what() + " (is the passive rank serving?)");
  }
  if (answer != exchanges_) throw MismatchError(absl::StrCat(where, "the answer is for request ", answer));
  AverageWith(buffers, dtype, incoming_.data());
  ++exchanges_;
  return peer;
}

void AsyncBilateralExchange::Finish(Communicator& comm, std::vector<Buffer> buffers) {
  CheckCpu("async_bilateral_exchange", buffers);  // the same arguments as Exchange, though only a number is sent
  if (!IsActive(comm.rank())) {
    throw InvalidArgumentError(absl::StrCat("async_bilateral_exchange: rank ", comm.rank(),
                                            " is passive; only active ranks call Finish"));
  }
  if (finished_) return;
  int64_t done = kDone;
  std::vector<P2POp> ops;
  for (int p : PassivePeers(comm.rank(), comm.size())) ops.push_back(P2POp::Send(RequestView(&done), p, tag_));
  if (!ops.empty()) comm.p2p(ops)->wait();
  finished_ = true;
}

bool AsyncBilateralExchange::all_active_finished(const Communicator& comm) const {
  int expected = 0;
  for (int a = 1; a < comm.size(); a += 2) {
    std::vector<int> peers = PassivePeers(a, comm.size());
    if (std::binary_search(peers.begin(), peers.end(), comm.rank())) ++expected;
  }
  return finished_peers_ >= expected;
}

int AsyncBilateralExchange::Serve(Communicator& comm, std::vector<Buffer> buffers, int max_requests) {
  const int rank = comm.rank();
  const DType dtype = CheckCpu("async_bilateral_exchange", buffers);
  if (IsActive(rank)) {
    throw InvalidArgumentError(absl::StrCat("async_bilateral_exchange: rank ", rank,
                                            " is active (odd); active ranks call Exchange, not Serve"));
  }
  int answered = 0;
  while ((max_requests < 0 || answered < max_requests) && !all_active_finished(comm)) {
    int source = -1;
    int64_t h = 0;
    auto where = [&] {
      return absl::StrCat("async_bilateral_exchange: passive rank ", rank, " serving (", TotalCount(buffers), " x ",
                          DTypeName(dtype), ", ", answered, " answered so far", source >= 0 ? ", request from rank " : "",
                          source >= 0 ? std::to_string(source) : "", "): ");
    };
    try {
      comm.recv_any_source(RequestView(&h), tag_, &source)->wait();
      if (h == kDone) {
        ++finished_peers_;
        continue;
      }
      // x from before the exchange goes out while the requester's x comes in.
      const Buffer mine = PackedPayload(buffers, dtype, &outgoing_);
      const Buffer theirs = IncomingPayload(buffers, dtype, &incoming_);
      comm.p2p({P2POp::Send(RequestView(&h), source, tag_ + 1), P2POp::Send(mine, source, tag_ + 3),
                P2POp::Recv(theirs, source, tag_ + 2)})
          ->wait();
    } catch (const CommError& e) {
      if (dynamic_cast<const MismatchError*>(&e)) throw MismatchError(where() + e.what());
      if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(where() + e.what());
      throw;
    }
    AverageWith(buffers, dtype, incoming_.data());
    ++answered;
    ++exchanges_;
  }
  return answered;
}

void AsyncBilateralExchange::Restore(int64_t exchanges) {
  if (exchanges < 0) {
    throw InvalidArgumentError(absl::StrCat("async_bilateral_exchange: restore with negative count ", exchanges));
  }
  exchanges_ = exchanges;
}

}  // namespace gossipcc
