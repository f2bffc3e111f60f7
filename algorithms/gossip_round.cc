#include "algorithms/gossip_round.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "algorithms/elementwise.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace gossip_internal {

namespace {

// Rounds whose payload is at least this large are mixed while in flight, in parts of at
// least kMixPartBytes (one p2p segment: a part's wait is one wake-up per segment at most).
constexpr size_t kMixInFlightMinBytes = size_t{1} << 20;
constexpr size_t kMixPartBytes = size_t{256} << 10;

char* PayloadPtr(std::vector<uint64_t>& message) { return reinterpret_cast<char*>(message.data()) + kHeaderBytes; }

double ScaleOf(const std::vector<uint64_t>& message) {
  double scale;
  std::memcpy(&scale, reinterpret_cast<const char*>(message.data()) + 8, sizeof(scale));
  return scale;
}

// Calls fn(buffer, first, at, count) for each buffer's part of elements [begin, end) of the
// buffers' concatenation: the part is `count` elements from element `first` of `buffer`, at
// position `at` of the concatenation.
template <typename Fn>
void ForEachPart(const std::vector<Buffer>& host, size_t begin, size_t end, Fn&& fn) {
  size_t start = 0;
  for (const Buffer& b : host) {
    const size_t lo = std::max(begin, start), hi = std::min(end, start + b.count);
    if (lo < hi) fn(b, lo - start, lo, hi - lo);
    start += b.count;
    if (start >= end) break;
  }
}

// Elements [begin, end) of the buffers' concatenation x:
//   x <- self_coef * x + sum_j recv_coef[j] * recv[j]    (recv[j]: message j's payload)
// With `save` (message 0's payload), each old x is written there, over the value of message
// 0 just used: the pass keeps what a failed round needs to put x back.
template <typename E>
void Mix(const std::vector<Buffer>& host, size_t begin, size_t end, double self_coef,
         const std::vector<char*>& recv, const std::vector<double>& recv_coef, bool save) {
  using S = typename E::Storage;
  using C = typename E::Compute;
  const C self = static_cast<C>(self_coef);
  std::vector<C> coef(recv_coef.begin(), recv_coef.end());
  ForEachPart(host, begin, end, [&](const Buffer& b, size_t first, size_t at, size_t count) {
    S* x = static_cast<S*>(b.data) + first;
    std::vector<const S*> in(recv.size());
    for (size_t j = 0; j < recv.size(); ++j) in[j] = reinterpret_cast<const S*>(recv[j]) + at;
    S* keep = save ? reinterpret_cast<S*>(recv[0]) + at : nullptr;
    if (in.size() == 1) {
      const S* r = in[0];
      const C c = coef[0];
      if (keep != nullptr) {
        for (size_t e = 0; e < count; ++e) {
          const S old = x[e];
          x[e] = E::Store(self * E::Load(old) + c * E::Load(r[e]));
          keep[e] = old;
        }
      } else {
        for (size_t e = 0; e < count; ++e) x[e] = E::Store(self * E::Load(x[e]) + c * E::Load(r[e]));
      }
    } else {
      for (size_t e = 0; e < count; ++e) {
        const S old = x[e];
        C acc = self * E::Load(old);
        for (size_t j = 0; j < in.size(); ++j) acc += coef[j] * E::Load(in[j][e]);
        x[e] = E::Store(acc);
        if (keep != nullptr) keep[e] = old;
      }
    }
  });
}

// Puts back elements [0, end) of x that Mix saved in message 0's payload.
void Restore(const std::vector<Buffer>& host, size_t end, const char* saved, size_t element_size) {
  ForEachPart(host, 0, end, [&](const Buffer& b, size_t first, size_t at, size_t count) {
    std::memcpy(static_cast<char*>(b.data) + first * element_size, saved + at * element_size, count * element_size);
  });
}

template <typename E>
void Scale(const std::vector<Buffer>& host, double factor) {
  using S = typename E::Storage;
  using C = typename E::Compute;
  const C f = static_cast<C>(factor);
  for (const Buffer& b : host) {
    S* x = static_cast<S*>(b.data);
    for (size_t e = 0; e < b.count; ++e) x[e] = E::Store(f * E::Load(x[e]));
  }
}

// Re-raises `error` as the same comm error type with `prefix` in front of its message.
[[noreturn]] void Rethrow(std::exception_ptr error, const std::string& prefix, const std::string& suffix) {
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError& e) {
    throw MismatchError(absl::StrCat(prefix, e.what(), suffix));
  } catch (const TimeoutError& e) {
    throw TimeoutError(absl::StrCat(prefix, e.what(), suffix));
  } catch (const PeerError& e) {
    throw PeerError(absl::StrCat(prefix, e.what(), suffix));
  } catch (const AbortedError& e) {
    throw AbortedError(absl::StrCat(prefix, e.what(), suffix));
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(absl::StrCat(prefix, e.what(), suffix));
  } catch (const std::exception& e) {
    throw CommError(absl::StrCat(prefix, e.what(), suffix));
  }
}

}  // namespace

size_t MessageBytes(size_t payload_elements, DType dtype, bool with_weight) {
  return kHeaderBytes + payload_elements * ElementSize(dtype) + (with_weight ? kWeightBytes : 0);
}

std::vector<uint64_t> MessagePool::Take(size_t words) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity() >= words) {
        std::vector<uint64_t> v = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        v.resize(words);
        return v;
      }
    }
  }
  return std::vector<uint64_t>(words);
}

void MessagePool::Give(std::vector<uint64_t> storage) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < 8) free_.push_back(std::move(storage));
}

PendingRound::~PendingRound() {
  if (!waited_) {
    // The transfers write into (or read from) our storage: let them end first.
    try {
      if (send_work_) send_work_->wait();
    } catch (...) {
    }
    for (auto& w : recv_works_) {
      try {
        w->wait();
      } catch (...) {
      }
    }
  }
  if (spec_.pool) {
    if (!payload_copy_.empty()) spec_.pool->Give(std::move(payload_copy_));
    for (auto& v : recv_storage_) spec_.pool->Give(std::move(v));
  }
}

bool PendingRound::is_completed() const {
  if (send_work_ && !send_work_->is_completed()) return false;
  for (const auto& w : recv_works_) {
    if (!w->is_completed()) return false;
  }
  return true;
}

std::string PendingRound::Context() const {
  return absl::StrCat(spec_.algorithm, " step ", spec_.step, " on rank ", rank_, " of ", size_, " (sends to {",
                      absl::StrJoin(spec_.send_to, ","), "}, receives from {", absl::StrJoin(spec_.recv_from, ","),
                      "}, ", payload_, " x ", DTypeName(dtype_), " per message",
                      spec_.with_weight ? " + push-sum weight" : "", "): ");
}

void PendingRound::WaitAll() {
  waited_ = true;
  std::exception_ptr first;
  try {
    if (send_work_) send_work_->wait();
  } catch (...) {
    first = std::current_exception();
  }
  std::vector<bool> ok(recv_works_.size(), false);
  for (size_t j = 0; j < recv_works_.size(); ++j) {
    try {
      recv_works_[j]->wait();
      ok[j] = true;
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  // A step disagreement is the most useful thing to report, even if another transfer failed.
  for (size_t j = 0; j < recv_storage_.size(); ++j) {
    if (!ok[j]) continue;
    int64_t step;
    std::memcpy(&step, recv_storage_[j].data(), sizeof(step));
    if (step != spec_.step) {
      throw MismatchError(absl::StrCat(Context(), "received a message from rank ", spec_.recv_from[j],
                                       " sent at its step ", step, " but this rank is at step ", spec_.step,
                                       "; every rank must call with the same step number (nothing was modified)"));
    }
  }
  if (first) {
    bool mismatch = false;
    try {
      std::rethrow_exception(first);
    } catch (const MismatchError&) {
      mismatch = true;
    } catch (...) {
    }
    Rethrow(first, Context(),
            mismatch ? "; nothing was modified (every rank must pass the same total element count and dtype)"
                     : "; nothing was modified (a rank calling with a different step number on a time-varying "
                       "graph leaves a receive unmatched, which shows as a timeout or a closed connection)");
  }
}

// Each part of x is mixed once every message's copy of it has landed and (sent in place) every
// send has read it, so that after the last byte only the last part is left.
void PendingRound::MixInFlight(const std::vector<Buffer>& buffers, double self_coef,
                               const std::vector<double>& recv_coef) {
  const size_t e = ElementSize(dtype_);
  const size_t message_bytes = MessageBytes(payload_, dtype_, spec_.with_weight);
  const size_t part = std::max<size_t>(1, kMixPartBytes / e);
  std::vector<TransferProgress*> gates;
  for (auto& p : recv_progress_) gates.push_back(p.get());
  for (auto& p : send_progress_) gates.push_back(p.get());
  std::vector<char*> recv;
  for (auto& message : recv_storage_) recv.push_back(PayloadPtr(message));
  std::vector<double> coef;
  size_t& mixed = mixed_in_flight_;
  while (mixed < payload_ && !is_completed()) {
    const size_t want = kHeaderBytes + std::min(payload_, mixed + part) * e;
    size_t passed = message_bytes;
    for (TransferProgress* gate : gates) passed = std::min(passed, gate->WaitFor(want));
    const size_t upto = passed <= kHeaderBytes ? 0 : std::min(payload_, (passed - kHeaderBytes) / e);
    // Every gate reached `want` (so upto > mixed) unless one ended short of it: the round
    // failed, and WaitAll says how.
    if (upto <= mixed) break;
    if (coef.empty()) {  // every header has landed: check the steps, then take the scales
      for (auto& message : recv_storage_) {
        int64_t step;
        std::memcpy(&step, message.data(), sizeof(step));
        if (step != spec_.step) return;  // WaitAll reports it
      }
      coef.resize(recv_coef.size());
      for (size_t j = 0; j < coef.size(); ++j) coef[j] = recv_coef[j] * ScaleOf(recv_storage_[j]);
    }
    DispatchFloating(dtype_, [&](auto el) {
      Mix<decltype(el)>(buffers, mixed, upto, self_coef, recv, coef, /*save=*/true);
    });
    mixed = upto;
  }
}

void PendingRound::PostReceives(Communicator& comm, bool track_progress) {
  const RoundSpec& s = spec_;
  const size_t e = ElementSize(dtype_);
  const size_t bytes = MessageBytes(payload_, dtype_, s.with_weight);
  const size_t words = (bytes + 7) / 8;
  for (size_t j = 0; j < s.recv_from.size(); ++j) {
    recv_storage_.push_back(s.pool ? s.pool->Take(words) : std::vector<uint64_t>(words));
    const Buffer view{recv_storage_.back().data(), bytes / e, dtype_, Device::CPU()};
    // (A p2p batch would take kAnySource as any sender; recv() names it a bad peer.)
    if (track_progress && s.recv_from[j] != kAnySource) {
      P2POp op = P2POp::Recv(view, s.recv_from[j], s.tag);
      op.progress = std::make_shared<TransferProgress>();
      recv_works_.push_back(comm.p2p(absl::MakeConstSpan(&op, 1)));
      recv_progress_.push_back(std::move(op.progress));
    } else {
      recv_works_.push_back(comm.recv(view, s.recv_from[j], s.tag));
    }
  }
}

std::vector<Buffer> PendingRound::SendPayload() {
  const RoundSpec& s = spec_;
  if (s.send_in_place || device_.is_cuda()) return staging_->host();
  const size_t e = ElementSize(dtype_);
  payload_copy_ = s.pool ? s.pool->Take((payload_ * e + 7) / 8) : std::vector<uint64_t>((payload_ * e + 7) / 8);
  char* out = reinterpret_cast<char*>(payload_copy_.data());
  for (const Buffer& b : staging_->host()) {
    if (b.count > 0) std::memcpy(out, b.data, b.bytes());
    out += b.bytes();
  }
  return {Buffer{payload_copy_.data(), payload_, dtype_, Device::CPU()}};
}

void PendingRound::PostSends(Communicator& comm, bool track_progress) {
  const RoundSpec& s = spec_;
  const size_t e = ElementSize(dtype_);
  const std::vector<Buffer> payload = SendPayload();
  const double weight = s.weight;
  std::memcpy(&weight_word_, &weight, kWeightBytes);
  // One header per distinct scale (uniform mixing: one for every peer); the headers' memory
  // must not move once a send points at it.
  std::map<double, size_t> by_scale;
  headers_.reserve(s.send_to.size());
  std::vector<P2POp> sends;
  for (size_t j = 0; j < s.send_to.size(); ++j) {
    const double scale = s.send_scale[j];
    auto it = by_scale.find(scale);
    if (it == by_scale.end()) {
      std::array<uint64_t, 2> header;
      std::memcpy(&header[0], &s.step, 8);
      std::memcpy(&header[1], &scale, 8);
      headers_.push_back(header);
      it = by_scale.emplace(scale, headers_.size() - 1).first;
    }
    std::vector<Buffer> pieces;
    pieces.reserve(payload.size() + 2);
    pieces.push_back(Buffer{headers_[it->second].data(), kHeaderBytes / e, dtype_, Device::CPU()});
    pieces.insert(pieces.end(), payload.begin(), payload.end());
    if (s.with_weight) pieces.push_back(Buffer{&weight_word_, kWeightBytes / e, dtype_, Device::CPU()});
    sends.push_back(P2POp::SendGather(std::move(pieces), s.send_to[j], s.tag));
    if (track_progress && s.send_in_place) {
      sends.back().progress = std::make_shared<TransferProgress>();
      send_progress_.push_back(sends.back().progress);
    }
  }
  send_work_ = comm.p2p(sends);
}

std::unique_ptr<PendingRound> StartRound(Communicator& comm, const std::vector<Buffer>& buffers, RoundSpec spec) {
  const DType dtype = CheckBuffers(spec.algorithm, buffers);
  std::unique_ptr<PendingRound> round(new PendingRound());
  round->rank_ = comm.rank();
  round->size_ = comm.size();
  round->dtype_ = dtype;
  round->device_ = buffers.empty() ? Device::CPU() : buffers[0].device;
  round->payload_ = TotalCount(buffers);
  // Staged copies of device buffers first: that is the step that can fail before anything
  // is posted.
  if (!spec.send_to.empty()) round->staging_ = std::make_unique<HostStaging>(spec.algorithm, buffers);
  round->spec_ = std::move(spec);
  const RoundSpec& s = round->spec_;
  const bool mix_in_flight = !round->device_.is_cuda() && !s.recv_from.empty() &&
                             round->payload_ * ElementSize(dtype) >= kMixInFlightMinBytes;
  try {
    // Receives are announced before this rank posts its own messages: Gloo sends a payload
    // only once its receive is announced, so every in-peer can start sending at once.
    round->PostReceives(comm, mix_in_flight);
    if (!s.send_to.empty()) round->PostSends(comm, mix_in_flight);
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    // The prefix first: `s` lives in the round, which reset() destroys.
    const std::string prefix = absl::StrCat(s.algorithm, " step ", s.step, " on rank ", comm.rank(), ": ");
    round.reset();  // waits for whatever was posted
    Rethrow(error, prefix, "");
  }
  return round;
}

void FinishRound(PendingRound& round, const std::vector<Buffer>& buffers, double self_coef,
                 const std::vector<double>& recv_coef, double* weight) {
  const RoundSpec& spec = round.spec_;
  const DType dtype = CheckBuffers(spec.algorithm, buffers);
  if (TotalCount(buffers) != round.payload_ || (!buffers.empty() && dtype != round.dtype_)) {
    throw InvalidArgumentError(absl::StrCat(spec.algorithm, " step ", spec.step, " on rank ", round.rank_,
                                            ": the round was started on ", round.payload_, " x ",
                                            DTypeName(round.dtype_), " but is finished on ", TotalCount(buffers),
                                            " x ", DTypeName(dtype)));
  }
  if (recv_coef.size() != spec.recv_from.size()) {
    throw InvalidArgumentError(absl::StrCat(spec.algorithm, ": ", recv_coef.size(), " receive coefficients for ",
                                            spec.recv_from.size(), " in-peers"));
  }
  std::vector<char*> recv;
  for (auto& message : round.recv_storage_) recv.push_back(PayloadPtr(message));
  if (!round.recv_progress_.empty() && !buffers.empty() && !buffers[0].device.is_cuda() && !round.is_completed()) {
    round.MixInFlight(buffers, self_coef, recv_coef);
  }
  const size_t mixed = round.mixed_in_flight_;  // [0, mixed) mixed, old values saved in message 0
  try {
    round.WaitAll();
  } catch (...) {
    if (mixed > 0) Restore(buffers, mixed, recv[0], ElementSize(round.dtype_));
    throw;
  }
  round.staging_.reset();  // sent: a device buffer's staged copy is not needed any more
  // Each message stands for scale * (payload, weight): the scale goes into its coefficient.
  std::vector<double> coef(recv_coef.size());
  for (size_t j = 0; j < coef.size(); ++j) coef[j] = recv_coef[j] * ScaleOf(round.recv_storage_[j]);
  HostStaging staging(spec.algorithm, buffers);
  DispatchFloating(dtype, [&](auto e) {
    Mix<decltype(e)>(staging.host(), mixed, round.payload_, self_coef, recv, coef, /*save=*/false);
  });
  staging.WriteBack();
  if (weight != nullptr) {
    double w = self_coef * *weight;
    const size_t offset = round.payload_ * ElementSize(round.dtype_);
    for (size_t j = 0; j < recv.size(); ++j) {
      double wj;
      std::memcpy(&wj, recv[j] + offset, kWeightBytes);
      w += coef[j] * wj;
    }
    *weight = w;
  }
}

void ScaleBuffers(const std::string& algorithm, const std::vector<Buffer>& buffers, double factor) {
  const DType dtype = CheckBuffers(algorithm, buffers);
  HostStaging staging(algorithm, buffers);
  DispatchFloating(dtype, [&](auto e) { Scale<decltype(e)>(staging.host(), factor); });
  staging.WriteBack();
}

}  // namespace gossip_internal
}  // namespace gossipcc
