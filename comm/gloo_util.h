// Internal helpers shared by the Gloo-backed pieces of the comm layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"
#include "comm/store.h"

namespace gloo {
class Context;
namespace transport {
class Buffer;
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace gossipcc {

// Slot prefixes for the messages gossipcc posts itself. Gloo's own algorithms use
// prefixes 0x01..0x08 (gloo/types.h); ours start at 0x40 so they can never collide.
inline constexpr uint8_t kFingerprintSlotPrefix = 0x40;
inline constexpr uint8_t kP2PHeaderSlotPrefix = 0x41;
inline constexpr uint8_t kP2PDataSlotPrefix = 0x42;
inline constexpr uint8_t kReduceScatterSlotPrefix = 0x43;
inline constexpr uint8_t kVerdictSlotPrefix = 0x44;
inline constexpr uint8_t kDirectAllreduceScatterSlotPrefix = 0x45;
inline constexpr uint8_t kDirectAllreduceGatherSlotPrefix = 0x46;
inline constexpr uint8_t kRingAllreduceSlotPrefix = 0x47;
inline constexpr uint8_t kPackedRingAllreduceSlotPrefix = 0x48;

inline uint64_t MakeSlot(uint8_t prefix, uint32_t tag) {
  return (static_cast<uint64_t>(prefix) << 56) | tag;
}

// Rethrows a Gloo exception as TimeoutError or PeerError, prefixed with `context`.
[[noreturn]] void RethrowGlooError(const std::string& context, const std::exception& e);

// Waits for a bound buffer's next receive or send completion as waitRecv()/waitSend() do, but
// until `deadline` (no later than the pair's timeout from now). Missing it fails the pair as
// Gloo's own timeout does and throws that error (RethrowGlooError: a TimeoutError).
enum class BoundBufferWait { kRecv, kSend };
void WaitBoundBuffer(gloo::transport::Buffer& buffer, BoundBufferWait which,
                     std::chrono::steady_clock::time_point deadline, const std::string& what);

// Gloo buffers (and their memory) of operations that failed part-way, which Gloo's device
// thread may still touch: freed only after DestroyPairs on every mesh (docs/architecture.md,
// "Shutdown"). One per communicator. Thread-safe.
class RetiredBuffers {
 public:
  void Add(std::shared_ptr<void> owned);
  std::vector<std::shared_ptr<void>> TakeAll();

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<void>> owned_ ABSL_GUARDED_BY(mu_);
};

// Destroys every pair of `context` under its lock, so Gloo's device thread no longer touches a
// buffer posted on them; the context is then good for destruction only.
void DestroyPairs(gloo::Context& context);

// Hard-closes this rank's pair with `peer` in each of `contexts` (Gloo's Pair::close: a reset,
// under the pair's lock). When it returns, Gloo's device thread is not reading into or writing
// from any buffer posted on those pairs, and never will: what a failed operation abandons (a
// receive posted into the caller's memory) cannot land there after the failure is reported.
// The pairs fail every later operation; for a communicator that the failure poisoned.
void ClosePairsWith(absl::Span<gloo::Context* const> contexts, int peer);

// Takes every pair of `context` off Gloo's device thread, leaving the connection open (Gloo's
// switch to synchronous mode), before bound buffers on them are destroyed: Gloo would finish a
// half-read message on a destroyed buffer. Queued writes are flushed first, up to the mesh's
// timeout; a pair whose switch fails is kept for the rest of the process (Gloo aborts when
// destroying it) and its getPair(peer) becomes null (docs/reliability.md, "ThreadSanitizer").
void TakePairsOffTheDeviceThread(gloo::Context& context);

// Owns the Gloo buffers (and scratch memory) one collective call posts operations on. On
// normal return every operation was waited for and they are freed; when the call unwinds
// with an exception they go to `retired` instead.
class PostedBuffers {
 public:
  PostedBuffers(gloo::Context& context, RetiredBuffers& retired);
  ~PostedBuffers();
  PostedBuffers(const PostedBuffers&) = delete;
  PostedBuffers& operator=(const PostedBuffers&) = delete;

  gloo::transport::UnboundBuffer& Create(void* data, size_t bytes);
  // Scratch memory of `bytes` (uninitialised) that lives as long as the buffers do.
  uint8_t* Allocate(size_t bytes);

 private:
  gloo::Context& context_;
  RetiredBuffers& retired_;
  const int exceptions_at_start_;
  std::vector<std::shared_ptr<void>> owned_;
};

struct GlooMeshOptions {
  std::string hostname;
  std::string interface;
  std::chrono::milliseconds timeout;  // of every operation on the mesh
  // By when the rendezvous and connection must be done (unset: `timeout` from the call).
  std::optional<std::chrono::steady_clock::time_point> connect_deadline;
};

// Gloo writes without MSG_NOSIGNAL: a write to a dead peer would kill this process with
// SIGPIPE. Ignores SIGPIPE if its disposition is the default (so the write fails as a
// PeerError); an application's handler is left alone. Once per process.
void IgnoreSigpipeUnlessHandled();

// Creates a TCP device and connects every pair of ranks through `store` (after
// IgnoreSigpipeUnlessHandled). With `device`
// given, the new mesh shares it (its listening socket and event loop thread) instead.
std::shared_ptr<gloo::Context> ConnectGlooMesh(std::shared_ptr<Store> store, int rank, int size,
                                               const GlooMeshOptions& options,
                                               std::shared_ptr<gloo::transport::Device> device = nullptr);

}  // namespace gossipcc
