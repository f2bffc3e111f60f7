// Internal helpers shared by the Gloo-backed pieces of the comm layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
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

// Waits for the next receive (kRecv) or send (kSend) completion of a bound buffer (Gloo's
// createRecvBuffer / createSendBuffer on a TCP pair) as its waitRecv() / waitSend() does, but
// until `deadline`: Gloo's bound buffers take no timeout of their own, only the pair's, fixed
// when it connected, so a wait that must end at an operation's deadline cannot be one of
// theirs. Missing the deadline fails the pair exactly as Gloo's own timeout does (every buffer
// on it gets the error, the connection closes, so peers waiting on this rank fail too) and
// throws that error (a gloo::IoException whose message says "timeout" and `what`:
// RethrowGlooError makes it a TimeoutError). `deadline` must be no later than the pair's
// timeout from now (the caller's operation has at most its timeout left). A pair in
// synchronous mode (after TakePairsOffTheDeviceThread) waits as Gloo does.
enum class BoundBufferWait { kRecv, kSend };
void WaitBoundBuffer(gloo::transport::Buffer& buffer, BoundBufferWait which,
                     std::chrono::steady_clock::time_point deadline, const std::string& what);

// Gloo buffers (and the memory they point at) of operations that failed or unwound part-way.
// Gloo's device thread may still complete or fail operations posted on them, under the pair's
// lock. A Gloo buffer's destructor waits for that, but the memory it points at must outlive
// it, and TSan cannot see the wait (docs/reliability.md). So the communicator frees what this
// holds only after DestroyPairs on every mesh: an ordering through the pair locks. One per
// communicator, shared by its collectives and point-to-point batches. Thread-safe.
class RetiredBuffers {
 public:
  void Add(std::shared_ptr<void> owned);
  std::vector<std::shared_ptr<void>> TakeAll();

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<void>> owned_ ABSL_GUARDED_BY(mu_);
};

// Destroys every pair of `context` (each one a soft close: it takes the pair's lock and takes
// its socket off the device's event loop), so that Gloo's device thread can no longer touch
// a buffer posted on them, and whatever it did to one last happened before this returns.
// The context itself stays usable only for destruction. Retired buffers keep their Gloo
// context, and so its pairs, alive: without this, the pairs would outlive the buffers.
void DestroyPairs(gloo::Context& context);

// Takes every pair of `context` off Gloo's device thread and leaves its connection open, so
// that the thread never again reads into or writes from a buffer bound to those pairs (Gloo's
// createRecvBuffer / createSendBuffer). Call it before destroying such buffers: Gloo finishes
// a half-read message on the buffer it started it with, through a raw pointer, even if that
// buffer was destroyed meanwhile; and a bound buffer's destructor needs its pair alive, so
// DestroyPairs cannot come first. This is Gloo's switch to synchronous mode, the one call that
// detaches a pair without closing it (Pair::close would reset the connection and drop what
// this rank still has queued for a peer, such as its last header). Writes Gloo still holds
// are flushed first: against a peer that stopped reading, with more queued than the two
// kernels' socket buffers hold, that blocks until the mesh's timeout (Gloo sets the socket's
// send timeout) and then gives up. At shutdown a signature mesh has at most two headers
// queued per peer (64 bytes, plus an eager payload of up to 128 KiB / (n - 1)). A pair whose
// switch fails (it had failed before, or its flush failed) is moved out of `context` and kept
// for the rest of the process, because Gloo aborts when destroying a pair whose flush failed
// (gloo_util.cc); getPair(peer) is then null, which DestroyPairs skips.
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

// Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a peer that has died raises
// SIGPIPE, whose default action kills this process (seen with a SIGKILLed peer mid-broadcast).
// Ignoring it makes the write fail with EPIPE, which surfaces as a PeerError. Only a default
// disposition is changed: a handler the application installed is left alone (CPython already
// ignores SIGPIPE). Once per process; ConnectGlooMesh calls it.
void IgnoreSigpipeUnlessHandled();

// Creates a TCP device and connects every pair of ranks through `store` (after
// IgnoreSigpipeUnlessHandled). With `device`
// given, the new mesh shares it (its listening socket and event loop thread) instead.
std::shared_ptr<gloo::Context> ConnectGlooMesh(std::shared_ptr<Store> store, int rank, int size,
                                               const GlooMeshOptions& options,
                                               std::shared_ptr<gloo::transport::Device> device = nullptr);

}  // namespace gossipcc
