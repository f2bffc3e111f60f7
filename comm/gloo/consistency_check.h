// The handshake that starts every collective (docs/comm.md, "How collectives travel"): every
// rank sends a 64-byte header (the fingerprint of its OpSpec, fingerprint.h), optionally
// followed by an eager payload of at most EagerCollectiveMaxBytes(size), to every peer. Every
// rank then holds the whole table: a disagreement raises the same MismatchError on every rank
// before any payload reaches the caller's memory. Headers land in Gloo bound buffers, two per
// peer alternating between handshakes, sized for header + the eager maximum so no message can
// overflow one: a rank writes a peer's buffer of parity i % 2 (header i + 2) only after it has
// the peer's header i + 1, so no receive is announced.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "comm/core/op_spec.h"
#include "comm/gloo/call.h"

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
  // One per lane, on the lane's signature mesh (which carries nothing else and must outlive
  // it), created as soon as the mesh is connected; one thread at a time. Every wait ends at
  // the collective's deadline given to Begin or Run.
  explicit CollectiveHandshake(gloo::Context& mesh);
  ~CollectiveHandshake();

  // Exchanges this rank's header (+ `payload`, may be empty) with every peer; MismatchError
  // (the same on every rank) when they disagree, Gloo's exception when the exchange fails.
  void Run(const OpSpec& spec, absl::Span<const uint8_t> payload, std::chrono::steady_clock::time_point deadline);

  // Run in stages, for a collective that sends while the check is in flight (ring_allreduce.h):
  // Begin sends the header to every peer, or to `first` only until SendRemainingHeaders (or
  // Finish); PeerAgrees waits for one peer's header and says whether it equals this rank's;
  // Finish waits for the rest and throws as Run does. Begin, any others, Finish: once each.
  static constexpr int kEveryPeer = -1;
  void Begin(const OpSpec& spec, absl::Span<const uint8_t> payload, std::chrono::steady_clock::time_point deadline,
             int first = kEveryPeer);
  void SendRemainingHeaders();
  bool PeerAgrees(int peer);
  void Finish();

  // After a successful Run: rank r's payload and its length (this rank's own: the copy sent).
  const uint8_t* payload(int rank) const;
  size_t payload_bytes(int rank) const;

  // At shutdown, while the pairs exist: takes them off Gloo's device thread (a peer's header
  // may be half-way into a bound buffer), destroys the bound buffers and returns the unbound
  // ones, for the owner to free once the pairs are gone. Once; no Run afterwards.
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

// Tests only: `hook` (null: none) runs after every passed signature check, before the data
// exchange, with the checking rank; set it before any check runs.
void SetAfterSignatureCheckHookForTesting(void (*hook)(int rank));

// A lane's handshake in stages, bound to one collective: what a collective that runs its own
// signature check (GlooCall::check) is handed. `handshake` and `spec` must outlive it.
class StagedHandshake final : public DeferredSignatureCheck {
 public:
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
