#include "algorithms/async_bilateral_exchange.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "comm/errors.h"

namespace gossipcc {

using gossip_internal::CheckBuffers;
using gossip_internal::DispatchFloating;
using gossip_internal::TotalCount;

namespace {

constexpr size_t kHeader = 8;
constexpr int64_t kDone = -1;

struct Message {
  std::vector<uint64_t> storage;
  Buffer view;
};

Message MakeMessage(const std::vector<Buffer>& buffers, DType dtype) {
  const size_t payload = TotalCount(buffers) * ElementSize(dtype);
  Message m;
  m.storage.assign((kHeader + payload + 7) / 8, 0);
  m.view = Buffer{m.storage.data(), (kHeader + payload) / ElementSize(dtype), dtype, Device::CPU()};
  return m;
}

void Pack(Message& m, const std::vector<Buffer>& buffers, int64_t header) {
  std::memcpy(m.storage.data(), &header, kHeader);
  char* out = reinterpret_cast<char*>(m.storage.data()) + kHeader;
  for (const Buffer& b : buffers) {
    if (b.count > 0) std::memcpy(out, b.data, b.bytes());
    out += b.bytes();
  }
}

int64_t Header(const Message& m) {
  int64_t h;
  std::memcpy(&h, m.storage.data(), kHeader);
  return h;
}

// x <- (x + y) / 2 with y the message's payload.
void Average(const std::vector<Buffer>& buffers, DType dtype, const Message& m) {
  DispatchFloating(dtype, [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    using C = typename E::Compute;
    const S* y = reinterpret_cast<const S*>(reinterpret_cast<const char*>(m.storage.data()) + kHeader);
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
  Message request = MakeMessage(buffers, dtype), answer = MakeMessage(buffers, dtype);
  Pack(request, buffers, exchanges_);
  const std::string where = absl::StrCat("async_bilateral_exchange request ", exchanges_, " from active rank ",
                                         rank, " to passive rank ", peer, " (", TotalCount(buffers), " x ",
                                         DTypeName(dtype), "): ");
  try {
    comm.p2p({P2POp::Send(request.view, peer, tag_), P2POp::Recv(answer.view, peer, tag_ + 1)})->wait();
  } catch (const MismatchError& e) {
    throw MismatchError(where + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(where + e.what() + " (is the passive rank serving?)");
  }
  if (Header(answer) != exchanges_) {
    throw MismatchError(absl::StrCat(where, "the answer is for request ", Header(answer)));
  }
  Average(buffers, dtype, answer);
  ++exchanges_;
  return peer;
}

void AsyncBilateralExchange::Finish(Communicator& comm, std::vector<Buffer> buffers) {
  const DType dtype = CheckCpu("async_bilateral_exchange", buffers);
  if (!IsActive(comm.rank())) {
    throw InvalidArgumentError(absl::StrCat("async_bilateral_exchange: rank ", comm.rank(),
                                            " is passive; only active ranks call Finish"));
  }
  if (finished_) return;
  Message done = MakeMessage(buffers, dtype);
  Pack(done, buffers, kDone);
  std::vector<P2POp> ops;
  for (int p : PassivePeers(comm.rank(), comm.size())) ops.push_back(P2POp::Send(done.view, p, tag_));
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
  Message request = MakeMessage(buffers, dtype), answer = MakeMessage(buffers, dtype);
  while ((max_requests < 0 || answered < max_requests) && !all_active_finished(comm)) {
    int source = -1;
    try {
      comm.recv_any_source(request.view, tag_, &source)->wait();
    } catch (const CommError& e) {
      const std::string where = absl::StrCat("async_bilateral_exchange: passive rank ", rank, " serving (",
                                             TotalCount(buffers), " x ", DTypeName(dtype), ", ", answered,
                                             " answered so far): ");
      if (dynamic_cast<const MismatchError*>(&e)) throw MismatchError(where + e.what());
      if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(where + e.what());
      throw;
    }
    const int64_t h = Header(request);
    if (h == kDone) {
      ++finished_peers_;
      continue;
    }
    Pack(answer, buffers, h);
    comm.send(answer.view, source, tag_ + 1)->wait();
    Average(buffers, dtype, request);
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
