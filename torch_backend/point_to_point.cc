// ProcessGroupGossipcc's point-to-point calls (send, recv, recvAnysource) and the monitored
// barrier built on them.
#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/core/errors.h"
#include "torch_backend/gossipcc_work.h"
#include "torch_backend/process_group_gossipcc.h"
#include "torch_backend/tensor_buffer.h"

namespace gossipcc {
namespace torch_backend {
namespace {

using ::c10d::OpType;

void CheckPeer(int peer, int size, const char* op) {
  if (peer < 0 || peer >= size) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": peer rank " + std::to_string(peer) +
                               " is out of range [0, " + std::to_string(size) + ")");
  }
}

uint32_t ToTag(int tag, const char* op) {
  if (tag < 0) throw InvalidArgumentError(std::string("gossipcc ") + op + ": tag must be >= 0, got " + std::to_string(tag));
  const uint32_t t = static_cast<uint32_t>(tag);
  if (t >= ProcessGroupGossipcc::kReservedTagBegin && t < ProcessGroupGossipcc::kReservedTagEnd) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": tag " + std::to_string(tag) +
                               " is in the range reserved for gossipcc's algorithms [" +
                               std::to_string(ProcessGroupGossipcc::kReservedTagBegin) + ", " +
                               std::to_string(ProcessGroupGossipcc::kReservedTagEnd) + ")");
  }
  return t;
}

}  // namespace

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  const at::Tensor& t = SingleTensor(tensors, "send", "");
  CheckPeer(dst_rank, size_, "send");
  CallOptions call;
  call.cuda_stream = CallerStream(t);
  auto work = communicator_->send(ToBuffer(t, "send", "tensor"), dst_rank, ToTag(tag, "send"), call);
  return Wrap(rank_, Unordered(), OpType::SEND, "gossipcc:send", std::move(work), tensors);
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  const at::Tensor& t = SingleTensor(tensors, "recv", "");
  CheckPeer(src_rank, size_, "recv");
  CallOptions call;
  call.cuda_stream = CallerStream(t);
  auto work = communicator_->recv(ToBuffer(t, "recv", "tensor"), src_rank, ToTag(tag, "recv"), call);
  return Wrap(rank_, Unordered(), OpType::RECV, "gossipcc:recv", std::move(work), tensors);
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = SingleTensor(tensors, "recv (any source)", "");
  auto source = std::make_shared<int>(-1);
  auto inner = communicator_->recv_any_source(ToBuffer(t, "recv (any source)", "tensor"), ToTag(tag, "recv"),
                                              source.get());
  return Wrap(rank_, Unordered(), OpType::RECVANYSOURCE, "gossipcc:recvAnysource", std::move(inner), tensors, nullptr,
              source);
}

// As ProcessGroupGloo's: point to point with rank 0, which alone enforces the timeout (so the
// other ranks do not time out first and end the job without saying which rank is missing).
// Ranks 1.. send to rank 0 and wait for its release; rank 0 waits for every rank's arrival
// until one deadline (the call + timeout; Gloo gives each rank the whole timeout with
// wait_all_ranks), then releases them. Without wait_all_ranks rank 0 raises naming the first
// rank (in rank order) that did not arrive; with it, every such rank.
void ProcessGroupGossipcc::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const auto start = std::chrono::steady_clock::now();
  const std::chrono::milliseconds timeout = opts.timeout == ::c10d::kUnsetTimeout ? options_.timeout : opts.timeout;
  if (timeout.count() <= 0) {
    throw InvalidArgumentError(c10::str("gossipcc monitored_barrier on rank ", rank_, ": timeout must be > 0, got ",
                                        timeout.count(), " ms"));
  }
  uint32_t call;
  {
    std::lock_guard<std::mutex> lock(monitored_barrier_mu_);
    call = monitored_barrier_calls_++;
  }
  const uint32_t arrive_tag = kMonitoredBarrierTag + 2 * (call % 0x8000);
  const uint32_t release_tag = arrive_tag + 1;
  // Buffers of operations that may still be posted when this call fails outlive it.
  auto retain = [this](const std::vector<at::Tensor>& buffers) {
    std::lock_guard<std::mutex> lock(monitored_barrier_mu_);
    for (const auto& b : buffers) monitored_barrier_retained_.push_back(b);
  };
  auto token = [this] { return at::full({1}, static_cast<int64_t>(rank_), at::kLong); };
  if (size_ == 1) return;
  if (rank_ != 0) {
    at::Tensor out = token(), in = token();
    auto send_work = communicator_->send(ToBuffer(out, "monitored_barrier", "token"), 0, arrive_tag);
    auto recv_work = communicator_->recv(ToBuffer(in, "monitored_barrier", "token"), 0, release_tag);
    try {
      send_work->wait();  // each bounded by the group's timeout (a point-to-point operation's)
      recv_work->wait();
    } catch (const std::exception& e) {
      retain({out, in});
      throw CommError(c10::str("Rank ", rank_, " successfully reached monitoredBarrier, but received errors while ",
                               "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n ",
                               "Original exception: \n", e.what()));
    }
    return;
  }
  const auto deadline = start + timeout;
  auto left = [&deadline] {
    const auto l = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return std::max(l, std::chrono::milliseconds(1));  // wait(0) would wait without a bound
  };
  std::vector<at::Tensor> tokens;
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 1; r < size_; ++r) {
    tokens.push_back(token());
    works.push_back(communicator_->recv(ToBuffer(tokens.back(), "monitored_barrier", "token"), r, arrive_tag));
  }
  // Every rank's arrival, then every rank's release. With wait_all_ranks a rank that failed
  // does not stop the wait for the later ones (within the same deadline), so all are named.
  auto wait_loop = [&](const char* what) {
    std::vector<int> failed;
    std::string first_error;
    for (int r = 1; r < size_; ++r) {
      try {
        works[r - 1]->wait(left());
      } catch (const std::exception& e) {
        failed.push_back(r);
        if (first_error.empty()) first_error = e.what();
        if (!wait_all_ranks) break;
      }
    }
    if (failed.empty()) return;
    retain(tokens);
    if (!wait_all_ranks) {
      throw TimeoutError(c10::str("[Rank 0]: Rank ", failed[0], " failed to pass monitoredBarrier in ", timeout.count(),
                                  " ms (", what, ")\n Original exception: \n", first_error));
    }
    throw TimeoutError(c10::str("[Rank 0]: Ranks ", c10::Join(", ", failed), " failed to pass monitoredBarrier in ",
                                timeout.count(), " ms (", what, ")"));
  };
  wait_loop("no arrival");
  works.clear();
  for (int r = 1; r < size_; ++r) {
    works.push_back(communicator_->send(ToBuffer(tokens[r - 1], "monitored_barrier", "token"), r, release_tag));
  }
  wait_loop("release not delivered");
}

}  // namespace torch_backend
}  // namespace gossipcc
