// What every CPU collective of the data path is handed (GlooCall): the lane's mesh, tag,
// deadline, scratch memory, where failed buffers go, and the signature check when the collective
// runs it itself. Shared by the algorithms and collectives.h, which picks among them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/core/deadline.h"
#include "comm/core/reduce.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace gossipcc {

class RetiredBuffers;
class Topology;

// Memory a collective may keep between calls (one collective runs at a time per communicator).
struct CollectiveScratch {
  std::vector<uint8_t> bytes;
  WideScratch wide;
  // The ring all-reduce's receive slots, kept between calls (a fresh allocation would fault
  // its pages in on every call). A call that fails hands it to RetiredBuffers instead, since
  // a receive may still be posted on it; the next call allocates anew.
  std::shared_ptr<std::vector<uint8_t>> ring;
  // What the packed ring sent (packed_ring_allreduce.h): the float32 bytes its messages carried,
  // and the bytes those messages took, headers included. Read by Communicator::traffic() on
  // other threads.
  std::atomic<uint64_t> packed_raw_bytes{0};
  std::atomic<uint64_t> packed_wire_bytes{0};
};

// The signature check (consistency_check.h) of a collective that runs it itself, so that its
// first messages can travel while the check is in flight (ring_allreduce.h). The staged
// interface of CollectiveHandshake, bound to the collective.
class DeferredSignatureCheck {
 public:
  virtual ~DeferredSignatureCheck() = default;
  static constexpr int kEveryPeer = -1;
  // This rank's header to peer `first` only (the rest follow with SendRemainingHeaders, at
  // Finish at the latest), or with kEveryPeer to every peer at once.
  virtual void Begin(int first) = 0;
  virtual void SendRemainingHeaders() = 0;
  virtual bool PeerAgrees(int peer) = 0;
  virtual void Finish() = 0;  // throws MismatchError (the same on every rank)
};

struct GlooCall {
  std::shared_ptr<gloo::Context> context;
  uint32_t tag;
  // The collective's deadline (its issue + the timeout): every wait gets left(), what is left
  // of it then, so the whole collective ends by it, not each wait a timeout after its start.
  // Gloo's own algorithms (NewOptions) take one timeout per call: left() at their start.
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds left() const { return TimeLeft(deadline); }
  CollectiveScratch* scratch;  // the communicator's; never null
  // Where a call that fails part-way leaves its Gloo buffers (PostedBuffers). A failure
  // poisons the communicator, so scratch->bytes, which such buffers may point into, is never
  // resized after one.
  RetiredBuffers* retired;  // the communicator's; never null
  // Not null: the signature check has not run yet; the collective must run it (RunCheck)
  // before it touches the caller's memory or sends to a peer that may disagree.
  DeferredSignatureCheck* check = nullptr;
  // CommunicatorOptions::lossless_float32_allreduce.
  bool lossless_float32 = false;
  // The lane's streams per peer (striping.h): `context` first, then the lane's further meshes;
  // null or empty: `context` alone. The ring all-reduce deals its messages over them.
  const std::vector<std::shared_ptr<gloo::Context>>* streams = nullptr;
  int stream_count() const { return streams == nullptr || streams->empty() ? 1 : static_cast<int>(streams->size()); }
  gloo::Context& stream(int i) const { return i == 0 ? *context : *(*streams)[static_cast<size_t>(i)]; }
  // Not null: the hosts the ranks are on, over which large all-reduces run in two levels
  // (hierarchical_allreduce.h; CommunicatorOptions::topology).
  const Topology* hierarchy = nullptr;
};

// Runs call.check, if any, to completion.
void RunCheck(const GlooCall& call);

}  // namespace gossipcc
