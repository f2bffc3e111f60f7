// Internal: one fused gossip round over a list of buffers, startable and finishable apart
// (push-sum, overlapped push-sum, symmetric gossip and bilateral exchange all run on it).
//
// A message, in elements of the payload's dtype (element size e), stands for s * (payload, w):
//   [8 bytes: int64 step][8 bytes: the sender's scale s as a double]   (16/e elements)
//   [payload: the buffers, concatenated, unscaled]                     (sum of counts elements)
//   [8 bytes: the push-sum weight w as a double]                       (8/e elements, only with_weight)
// The comm layer checks each receive's count and dtype against the sender's before the payload
// lands (MismatchError, re-raised naming the algorithm, step and sizes); the step is checked here.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/elementwise.h"
#include "comm/communicator.h"
#include "comm/core/transfer_progress.h"
#include "comm/core/types.h"

namespace gossipcc {
namespace gossip_internal {

inline constexpr size_t kHeaderBytes = 16;  // step and scale
inline constexpr size_t kWeightBytes = 8;

// Reusable message memory. An algorithm object keeps one so that its rounds do not allocate
// (and fault in) fresh pages for every message; thread-safe; keeps at most 8 buffers.
class MessagePool {
 public:
  std::vector<uint64_t> Take(size_t words);  // contents unspecified
  void Give(std::vector<uint64_t> storage);

 private:
  std::mutex mu_;
  std::vector<std::vector<uint64_t>> free_;
};

struct RoundSpec {
  std::string algorithm;  // for messages, e.g. "push_sum"
  int64_t step = 0;
  uint32_t tag = 0;
  std::vector<int> send_to;
  std::vector<double> send_scale;  // per send_to: the message stands for send_scale * x (and * w)
  std::vector<int> recv_from;
  // The caller leaves the buffers unchanged until FinishRound (a synchronous round): they are
  // then sent from their own memory. Otherwise StartRound copies the payload once, and the
  // buffers may change as soon as it returns (overlapped push-sum's local steps).
  bool send_in_place = false;
  bool with_weight = false;        // a push-sum weight travels
  double weight = 1.0;             // its value at the start of the round
  std::shared_ptr<MessagePool> pool;  // optional: where message memory comes from and returns to
};

// Bytes of one message carrying `payload_elements` of `dtype`.
size_t MessageBytes(size_t payload_elements, DType dtype, bool with_weight);

// A round whose messages are posted; owns the message storage until it is finished or
// destroyed (the destructor waits for the transfers so no memory is freed under them, the
// caller's buffers included when they are sent in place).
class PendingRound {
 public:
  ~PendingRound();
  const RoundSpec& spec() const { return spec_; }
  bool is_completed() const;
  size_t payload() const { return payload_; }
  DType dtype() const { return dtype_; }
  // Payload elements FinishRound mixed while transfers were still in flight (0 when the
  // round was small, on a CUDA device, or had arrived whole by then); for tests and
  // benchmarks. After a failed FinishRound: those it mixed, then put back.
  size_t elements_mixed_in_flight() const { return mixed_in_flight_; }

 private:
  friend std::unique_ptr<PendingRound> StartRound(Communicator&, const std::vector<Buffer>&, RoundSpec);
  friend void FinishRound(PendingRound&, const std::vector<Buffer>&, double, const std::vector<double>&, double*);
  PendingRound() = default;
  std::string Context() const;
  void WaitAll();  // throws the first failure, re-raised with the round's context
  // Mixes the prefix of the (CPU) buffers every transfer has passed, keeping the old values in
  // message 0. Stops at completion, at a transfer ended short, or at a message of another step.
  void MixInFlight(const std::vector<Buffer>& buffers, double self_coef, const std::vector<double>& recv_coef);
  // StartRound's steps, once spec_, dtype_, device_, payload_ and staging_ are set. With
  // `track_progress` (a large CPU round) receives not from kAnySource and in-place sends report
  // their progress for MixInFlight. One receive per in-peer, into recv_storage_.
  void PostReceives(Communicator& comm, bool track_progress);
  // The payload as sent: the buffers (CUDA ones via staging_), or unless send_in_place a copy.
  std::vector<Buffer> SendPayload();
  // One message per out-peer, all sharing the payload.
  void PostSends(Communicator& comm, bool track_progress);

  RoundSpec spec_;
  int rank_ = 0;
  int size_ = 0;
  DType dtype_ = DType::kFloat32;
  Device device_;
  size_t payload_ = 0;
  std::unique_ptr<HostStaging> staging_;  // the buffers as host memory, while they are sent
  std::vector<std::array<uint64_t, 2>> headers_;     // step and scale, one per distinct scale
  uint64_t weight_word_ = 0;                         // the weight, as a double's bytes
  std::vector<uint64_t> payload_copy_;               // the payload, unless it is sent in place
  std::vector<std::vector<uint64_t>> recv_storage_;  // one per recv_from
  std::shared_ptr<Work> send_work_;
  std::vector<std::shared_ptr<Work>> recv_works_;
  // Large CPU rounds: how far each receive has landed and, when the buffers are sent in
  // place, how far each send has read them (FinishRound mixes what both have passed).
  std::vector<std::shared_ptr<TransferProgress>> recv_progress_;
  std::vector<std::shared_ptr<TransferProgress>> send_progress_;
  size_t mixed_in_flight_ = 0;
  bool waited_ = false;
};

// Checks `buffers`, announces every receive, then posts one message per out-peer (sharing
// the payload). Buffers are only read; unless spec.send_in_place they may change after this
// returns.
std::unique_ptr<PendingRound> StartRound(Communicator& comm, const std::vector<Buffer>& buffers, RoundSpec spec);

// Waits for the round, checks every received step, then mixes in place:
//   x <- self_coef * x + sum_j recv_coef[j] * x_j     (and likewise *weight if set)
// `buffers` must have the sizes given to StartRound. On any error nothing is modified and the
// error (MismatchError, TimeoutError, PeerError, AbortedError) names the algorithm, rank,
// step, peers and sizes. (A large CPU round is mixed part by part while in flight; if it then
// fails, the old values, kept meanwhile, are put back.)
void FinishRound(PendingRound& round, const std::vector<Buffer>& buffers, double self_coef,
                 const std::vector<double>& recv_coef, double* weight);

// x <- factor * x, in place (any accepted dtype and device).
void ScaleBuffers(const std::string& algorithm, const std::vector<Buffer>& buffers, double factor);

}  // namespace gossip_internal
}  // namespace gossipcc
