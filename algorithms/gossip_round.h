// Internal: one fused gossip round over a list of buffers, startable and finishable apart
// (push-sum, overlapped push-sum, symmetric gossip and bilateral exchange all run on it).
//
// Every message is one contiguous buffer of the payload's dtype (e = its element size):
//   [8 bytes: int64 step]                          (8/e elements)
//   [payload: the buffers, concatenated]           (sum of counts elements)
//   [8 bytes: the push-sum weight as a double]     (8/e elements, only when a weight travels)
// So a message is exactly one copy of the data, plus the weight, plus 8 bytes of step.
// The comm layer checks every receive's element count and dtype against the sender's before
// the payload lands (a MismatchError we re-raise naming the algorithm, step and sizes); the
// step is checked here on receipt.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/types.h"

namespace gossipcc {
namespace gossip_internal {

inline constexpr size_t kStepHeaderBytes = 8;
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
  std::vector<double> send_scale;  // per send_to: the message carries send_scale * x (and * w)
  std::vector<int> recv_from;
  bool with_weight = false;        // a push-sum weight travels
  double weight = 1.0;             // its value at the start of the round
  std::shared_ptr<MessagePool> pool;  // optional: where message memory comes from and returns to
};

// Bytes of one message carrying `payload_elements` of `dtype`.
size_t MessageBytes(size_t payload_elements, DType dtype, bool with_weight);

// A round whose messages are posted; owns the message storage until it is finished or
// destroyed (the destructor waits for the transfers so no memory is freed under them).
class PendingRound {
 public:
  ~PendingRound();
  const RoundSpec& spec() const { return spec_; }
  bool is_completed() const;
  size_t payload() const { return payload_; }
  DType dtype() const { return dtype_; }

 private:
  friend std::unique_ptr<PendingRound> StartRound(Communicator&, const std::vector<Buffer>&, RoundSpec);
  friend void FinishRound(PendingRound&, const std::vector<Buffer>&, double, const std::vector<double>&, double*);
  PendingRound() = default;
  std::string Context() const;
  void WaitAll();  // throws the first failure, re-raised with the round's context

  RoundSpec spec_;
  int rank_ = 0;
  int size_ = 0;
  DType dtype_ = DType::kFloat32;
  Device device_;
  size_t payload_ = 0;
  std::vector<std::vector<uint64_t>> send_storage_;  // one per distinct scale
  std::vector<std::vector<uint64_t>> recv_storage_;  // one per recv_from
  std::shared_ptr<Work> send_work_;
  std::vector<std::shared_ptr<Work>> recv_works_;
  bool waited_ = false;
};

// Checks `buffers`, packs one message per distinct send scale and posts every send and
// receive at once. Buffers are only read (they may change after this returns).
std::unique_ptr<PendingRound> StartRound(Communicator& comm, const std::vector<Buffer>& buffers, RoundSpec spec);

// Waits for the round, checks every received step, then mixes in place:
//   x <- self_coef * x + sum_j recv_coef[j] * x_j     (and likewise *weight if set)
// `buffers` must have the sizes given to StartRound. On any error nothing is modified and the
// error (MismatchError, TimeoutError, PeerError, AbortedError) names the algorithm, rank,
// step, peers and sizes.
void FinishRound(PendingRound& round, const std::vector<Buffer>& buffers, double self_coef,
                 const std::vector<double>& recv_coef, double* weight);

// x <- factor * x, in place (any accepted dtype and device).
void ScaleBuffers(const std::string& algorithm, const std::vector<Buffer>& buffers, double factor);

}  // namespace gossip_internal
}  // namespace gossipcc
