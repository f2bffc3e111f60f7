// Taking Gloo's pairs down so that its device thread no longer touches a buffer posted on them.
#pragma once

#include "absl/types/span.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace gossipcc {

// Destroys every pair of `context` under its lock; the context is then good for destruction only.
void DestroyPairs(gloo::Context& context);

// Hard-closes this rank's pair with `peer` in each of `contexts` (Gloo's Pair::close): on return no
// buffer posted on them is or will be touched by Gloo's device thread, so an abandoned receive
// cannot land after the failure is reported. Later operations there fail (a poisoned communicator).
void ClosePairsWith(absl::Span<gloo::Context* const> contexts, int peer);

// Takes every pair of `context` off Gloo's device thread, connections left open (Gloo's synchronous
// mode), so that bound buffers on them may then be destroyed; queued writes are flushed first, up
// to the mesh's timeout. A pair whose switch fails is kept for the rest of the process (Gloo aborts
// destroying it) and its getPair(peer) becomes null (docs/reliability.md, "ThreadSanitizer").
void TakePairsOffTheDeviceThread(gloo::Context& context);

}  // namespace gossipcc
