// Point-to-point messages over Gloo with size and dtype checking (docs/comm.md): a 32-byte
// header, then the payload in segments (wire.h) on a mesh per direction. A receive checks
// the header against its buffer before posting any payload receive, so no message overruns or
// passes short (a mismatch: MismatchError naming both sides, the buffer untouched). Batches are
// posted on the caller's thread and each progresses on its own thread, each receive
// independently, so an exchange only waits for peers to post: no order of sends and receives
// deadlocks. Receives on one (peer, tag) take their payloads in header order (turns.h).
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "comm/core/p2p_op.h"
#include "comm/core/work.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/p2p/turns.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace gossipcc {

class P2PExchange {
 public:
  // `on_failure` is told about transport failures (not mismatches), which leave the
  // p2p message stream out of step; the batch fails with the error it returns (the same,
  // or one with more detail).
  using FailureHandler = std::function<std::exception_ptr(std::exception_ptr)>;
  using Streams = std::vector<std::shared_ptr<gloo::Context>>;
  // Headers on `context`, payloads (segments of `segment_bytes`, 0: whole) on the streams of
  // payload_streams[0] upwards and [1] downwards (segment i on stream i % size, striping.h;
  // empty: `context` alone). Failed batches' buffers go to `retired`, which must outlive this
  // exchange.
  P2PExchange(std::shared_ptr<gloo::Context> context, std::array<Streams, 2> payload_streams,
              std::chrono::milliseconds timeout, size_t segment_bytes, RetiredBuffers& retired,
              FailureHandler on_failure);
  ~P2PExchange();

  // Ops were validated by the caller (CPU buffers, peers in range and not self).
  // Every wait of the batch ends by `issued` + the timeout.
  std::shared_ptr<Work> Post(absl::Span<const P2POp> ops, std::string description,
                             std::chrono::steady_clock::time_point issued);
  void Shutdown(const std::string& reason);

  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Message;
  struct Batch;
  struct ReceiveOutcome;
  // The meshes of the payload's direction, or `context_` alone if none.
  absl::Span<gloo::Context* const> PayloadStreams(int from, int to) const;

  ReceiveOutcome ReceiveOne(Message& m, Clock::time_point deadline, const std::string& description);
  // False if the batch failed (its buffers then go to `retired_`, not freed).
  bool Complete(Batch& batch);
  void RunBatch(std::unique_ptr<Batch> batch);

  std::shared_ptr<gloo::Context> context_;
  std::array<Streams, 2> payload_streams_;  // owned
  std::array<std::vector<gloo::Context*>, 2> payload_meshes_;  // of payload_streams_, or context_
  const std::chrono::milliseconds timeout_;
  const size_t segment_bytes_;
  RetiredBuffers& retired_;
  FailureHandler on_failure_;

  mutable absl::Mutex mu_;
  int active_batches_ ABSL_GUARDED_BY(mu_) = 0;  // the destructor waits for these
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_received_ ABSL_GUARDED_BY(mu_) = 0;
  ReceiveTurns turns_;  // tickets drawn under mu_, in header posting order
};

}  // namespace gossipcc
