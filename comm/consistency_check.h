// Cross-rank check of a collective's signature, run before any payload moves.
//
// Every rank sends a 48-byte fingerprint of its OpSpec to every peer and receives theirs
// (one message latency). Every rank then holds the whole table, so on a disagreement all
// ranks raise the same MismatchError listing each rank's value, and none has touched data:
// the communicator stays usable. Raw Gloo instead aborts the process when a message is longer
// than the posted receive and silently truncates when it is shorter.
#pragma once

#include <chrono>
#include <memory>

#include "comm/op_spec.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace gossipcc {

void VerifyAcrossRanks(gloo::Context& context, const OpSpec& spec, std::chrono::milliseconds timeout);

}  // namespace gossipcc
