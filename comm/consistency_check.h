// The handshake that starts every collective: a cross-rank check of its signature, which
// can carry a small collective's whole payload.
//
// Every rank sends a 64-byte header (a fingerprint of its OpSpec, fingerprint.h) to every
// peer and receives theirs: one message latency. Every rank then holds the whole table, so on
// a disagreement all ranks raise the same MismatchError listing each rank's value
// (CompareFingerprints), and none has touched the caller's data: the communicator stays
// usable. This file moves the headers; fingerprint.h encodes and compares them. Raw Gloo
// instead aborts the process when a message is longer than the posted receive and silently
// truncates when it is shorter.
//
// Eager collectives: a rank may append up to EagerCollectiveMaxBytes(size) bytes of payload
// to its header. Every rank posts receives of header + that maximum from every peer, whatever
// it was asked to do, so no message can overflow a receive even when ranks disagree; the
// payloads are used only once the headers agree. A small all-reduce, broadcast, all-gather or
// reduce-scatter then completes in this one exchange (eager_collectives.h) instead of paying
// the signature round trip plus Gloo's 2(n-1) (ring) or log n (tree) message latencies.
//
// The headers travel in Gloo's bound buffers: each rank registers, per peer, two receive
// buffers (header + the eager maximum, alternating between handshakes) once, when the lane's
// signature mesh is connected, and a header is one write into the peer's buffer. Gloo's unbound
// buffers would need the receiver to announce every receive and the sender to announce every
// send first: three writes per header instead of one, each a trip through the network stack.
// No announcement is needed because a rank overwrites a peer's buffer of parity i % 2 (with
// header i + 2) only after the peer has finished handshake i: this rank must first have
// received the peer's header i + 1, which the peer sends only once collective i is done,
// payloads read. The handshakes are numbered by this object, not by the collective's
// sequence number, because not every collective runs one (CommunicatorOptions::
// verify_collectives).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "comm/gloo_call.h"
#include "comm/op_spec.h"

namespace gloo {
class Context;
namespace transport {
class Buffer;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace gossipcc {

class CollectiveHandshake {
 public:
  // One per lane of a communicator, on the lane's signature mesh (a mesh that carries nothing
  // else: a bound send pins its socket's send buffer, docs/comm.md), created as soon as that
  // mesh is connected (its receive buffers must be registered before any peer's first header
  // arrives); used by one thread at a time (a lane runs one collective at a time). Every wait
  // of a check ends at the `deadline` given to Begin (or Run): the communicator passes the
  // collective's own (its issue + CommunicatorOptions::timeout), so a check started late, or
  // begun by a collective that ran part of its data path first, waits only what is left.
  // Every exchange runs on `mesh`, which must outlive this object.
  explicit CollectiveHandshake(gloo::Context& mesh);
  ~CollectiveHandshake();

  // Sends this rank's header for `spec`, followed by `payload` (at most
  // EagerCollectiveMaxBytes(size) bytes; may be empty), to every peer and receives theirs.
  // Throws MismatchError (the same on every rank) when the headers disagree, or Gloo's
  // exception when the exchange itself fails.
  void Run(const OpSpec& spec, absl::Span<const uint8_t> payload, std::chrono::steady_clock::time_point deadline);

  // Run in stages, for a collective that sends its first messages while the check is still
  // in flight (ring_allreduce.h). Begin sends this rank's header (spec must outlive Finish):
  // to every peer, or with `first` a peer, to that peer only, the others following with
  // SendRemainingHeaders (at Finish at the latest), so that the collective's own first
  // message need not queue behind n - 2 headers. PeerAgrees waits for `peer`'s header only
  // and says whether it is identical to this rank's (then the peer takes the same path with
  // the same buffer layout); Finish waits for the rest and throws as Run does. Begin, then
  // any PeerAgrees and SendRemainingHeaders, then Finish, exactly once.
  static constexpr int kEveryPeer = -1;
  void Begin(const OpSpec& spec, absl::Span<const uint8_t> payload, std::chrono::steady_clock::time_point deadline,
             int first = kEveryPeer);
  void SendRemainingHeaders();
  bool PeerAgrees(int peer);
  void Finish();

  // After a successful Run: rank r's payload and its length (this rank's own is the copy
  // that was sent, so it stays valid even if the caller's input aliases its output).
  const uint8_t* payload(int rank) const;
  size_t payload_bytes(int rank) const;

  // At shutdown, while the mesh's pairs still exist: takes them off Gloo's device thread
  // (TakePairsOffTheDeviceThread: Gloo may be half-way through reading a peer's header into a
  // bound buffer, and would finish on a destroyed one), destroys the bound buffers, and
  // returns the unbound ones (after a failed exchange Gloo may still reference them; their
  // memory is this object's), which the owner destroys only once the pairs are gone. Call
  // once; Run must not be called afterwards.
  std::vector<std::shared_ptr<void>> TakeRetiredBuffers();

 private:
  void AwaitHeader(int peer);  // returns once peer's header of the current check is in
  void SendHeader(int peer);
  void ExchangeVerdicts(const OpSpec& spec, const void* mine, size_t bytes);
  const uint8_t* Header(int rank) const;  // rank's header, then its payload

  gloo::Context& mesh_;
  const int size_;
  const int own_rank_;
  const size_t stride_;  // bytes per peer in incoming_: header + the eager maximum
  std::vector<uint8_t> outgoing_;  // header + payload (alltoallv: one header per peer)
  // Handshake i lands in incoming_[i % 2]: size_ x stride_; this rank's own slot is unused.
  std::vector<uint8_t> incoming_[2];
  uint64_t runs_ = 0;  // handshakes started on a mesh of more than one rank; the next one's index
  int current_ = 0;    // the last handshake's parity: the incoming_ that Header reads
  // The check in progress (Begin .. Finish).
  const OpSpec* spec_ = nullptr;
  std::chrono::steady_clock::time_point deadline_;  // Begin's: every wait ends by it
  std::vector<bool> arrived_;  // per rank: its header is in (this rank's own: always)
  size_t own_offset_ = 0;  // this rank's header in outgoing_
  size_t send_bytes_ = 0;  // header (+ payload) per peer
  int sent_only_to_ = kEveryPeer;  // Begin's `first`, until SendRemainingHeaders
  std::vector<uint8_t> verdicts_in_, verdict_out_;  // alltoallv's second round
  // Registered at construction, reused by every Run. in_[parity][p]: peer p's slot of
  // incoming_[parity]; out_[parity][p]: outgoing_, written into peer p's in_[parity][me].
  std::vector<std::unique_ptr<gloo::transport::Buffer>> in_[2], out_[2];
  std::shared_ptr<gloo::transport::UnboundBuffer> verdicts_in_ub_, verdict_out_ub_;
};

// Fault injection, for tests only: `hook` (null: none, the default) runs on the collective's
// thread at the end of every signature check that passed, with the checking rank, before the
// collective's data exchange; a test blocks in it to stall a rank whose header went out (the
// deferred check of a ring may have sent its first message too). Set it before any check runs.
void SetAfterSignatureCheckHookForTesting(void (*hook)(int rank));

// A lane's handshake in stages, bound to one collective: what a collective that runs its own
// signature check (GlooCall::check) is handed. `handshake` and `spec` must outlive it.
class StagedHandshake final : public DeferredSignatureCheck {
 public:
  // `deadline`: the collective's (not counted from Begin, which may come after part of its
  // data path).
  StagedHandshake(CollectiveHandshake& handshake, const OpSpec& spec, std::chrono::steady_clock::time_point deadline)
      : handshake_(handshake), spec_(spec), deadline_(deadline) {}
  static_assert(kEveryPeer == CollectiveHandshake::kEveryPeer, "Begin passes `first` through");
  void Begin(int first) override { handshake_.Begin(spec_, {}, deadline_, first); }
  void SendRemainingHeaders() override { handshake_.SendRemainingHeaders(); }
  bool PeerAgrees(int peer) override { return handshake_.PeerAgrees(peer); }
  void Finish() override { handshake_.Finish(); }

 private:
  CollectiveHandshake& handshake_;
  const OpSpec& spec_;
  const std::chrono::steady_clock::time_point deadline_;
};

}  // namespace gossipcc
