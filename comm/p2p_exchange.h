// Point-to-point messages over Gloo with size and dtype checking.
//
// Each message is a 32-byte header (element count, dtype, tag) followed by the payload on
// a second slot. Sends post both at once. A receive waits for the header, checks it against
// its own buffer, and only then posts the payload receive with the exact size, so a longer
// message can never overrun the buffer (raw Gloo aborts the process) and a shorter one
// cannot pass for a full one (raw Gloo reports success). On a mismatch the payload is
// drained into scratch memory and the receive fails with a MismatchError naming both sides.
//
// A payload larger than the segment size travels as consecutive segments (p2p_wire.h: the
// header and the segments, moved with their progress). Gloo sends a payload only once its
// receive is announced, and a pair writes announcements in order with its own payloads on one
// socket: with whole payloads on the collectives' mesh the two directions of an exchange would
// run one after the other. So payloads travel on a mesh per
// direction (lower to higher rank, higher to lower): each socket carries payloads one way and
// announcements the other. Headers stay on the collectives' mesh (a receive from any source
// waits on one Gloo buffer for every peer's header). Receives on one (peer, tag) take their
// payloads in header order (p2p_turns.h), so their segments never interleave. Counters count
// payload bytes.
//
// Batches are posted on the caller's thread; each then progresses on a thread of its own,
// its receives independently of each other, and completes as soon as its own messages
// have: no batch or receive waits behind another. Because every send is posted at once
// and every receive advances on its own, an exchange only ever waits for peers to post,
// never for this rank to make progress elsewhere: a gossip round cannot deadlock, and
// neither can nonblocking sends/receives issued in any order (as MPI guarantees).
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
#include "comm/gloo_util.h"
#include "comm/p2p_op.h"
#include "comm/p2p_turns.h"
#include "comm/work.h"

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
  // `segment_bytes`: payloads larger than this are sent as segments of this size (0: whole).
  // Headers travel on `context`. Payloads from a lower to a higher rank travel on
  // `payload_contexts[0]`, from higher to lower on `payload_contexts[1]` (both null: on
  // `context`); see PayloadContext.
  // The buffers of batches that fail (or fail to post) go to `retired`, which must outlive
  // this exchange.
  P2PExchange(std::shared_ptr<gloo::Context> context,
              std::array<std::shared_ptr<gloo::Context>, 2> payload_contexts, std::chrono::milliseconds timeout,
              size_t segment_bytes, RetiredBuffers& retired, FailureHandler on_failure);
  ~P2PExchange();

  // Ops were validated by the caller (CPU buffers, peers in range and not self).
  std::shared_ptr<Work> Post(absl::Span<const P2POp> ops, std::string description);
  void Shutdown(const std::string& reason);

  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Message;
  struct Batch;
  struct ReceiveOutcome;
  // Where the payload from `from` to `to` travels: the mesh of its direction (see above: on
  // one connection per pair, an announcement queues behind the receiver's own payload to the
  // same peer, so the two directions of an exchange take turns), or `context_` if none.
  gloo::Context& PayloadContext(int from, int to) const;

  ReceiveOutcome ReceiveOne(Message& m, Clock::time_point deadline, const std::string& description);
  // False if the batch failed (its buffers then go to `retired_`, not freed).
  bool Complete(Batch& batch);
  void RunBatch(std::unique_ptr<Batch> batch);

  std::shared_ptr<gloo::Context> context_;
  std::array<std::shared_ptr<gloo::Context>, 2> payload_contexts_;
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
