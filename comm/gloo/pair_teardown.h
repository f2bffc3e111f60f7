// Taking Gloo's pairs down so that its device thread no longer touches a buffer posted on them.
#pragma once

#include "absl/types/span.h"

namespace gloo {
class Context;
namespace transport {
class Buffer;
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace gossipcc {

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

}  // namespace gossipcc
