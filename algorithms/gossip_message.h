// Internal: one fused gossip round over a list of buffers.
//
// Every message is one contiguous buffer of the payload's dtype (float32 or float64):
//   [16-byte header: int64 step, int64 payload element count]
//   [payload: the buffers, concatenated]
//   [8 bytes: the push-sum weight as a double]   (only when a weight travels)
// The comm layer checks element count and dtype of every receive (MismatchError on a
// difference); the header's step is checked here.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/types.h"

namespace gossipcc {
namespace gossip_internal {

struct RoundSpec {
  const char* algorithm = "";  // for messages, e.g. "push_sum"
  int64_t step = 0;
  uint32_t tag = 0;
  std::vector<int> send_to;
  std::vector<double> send_scale;  // per send_to: the message carries send_scale * x (and * w)
  std::vector<int> recv_from;
  std::vector<double> recv_coef;   // per recv_from
  double self_coef = 1.0;          // x <- self_coef * x + sum recv_coef_j * x_j
  double* weight = nullptr;        // if set, a push-sum weight travels and is mixed likewise
};

// Checks the buffers (CPU, float32 or float64, all one dtype, non-null) and throws
// InvalidArgumentError naming `algorithm` otherwise. Returns the dtype (kFloat32 if empty).
DType CheckBuffers(const char* algorithm, const std::vector<Buffer>& buffers);

// Runs the round: posts every send and receive as one p2p batch, waits, checks the steps,
// then updates the buffers (and *weight) in place. On any error nothing is modified.
void RunRound(Communicator& comm, const std::vector<Buffer>& buffers, const RoundSpec& spec);

}  // namespace gossip_internal
}  // namespace gossipcc
