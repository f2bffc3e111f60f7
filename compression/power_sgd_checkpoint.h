// PowerSGD's checkpoints (internal to compression/): the byte format of PowerSGDCheckpoint and
// the conversion between a checkpoint's tensors and the live per-key state.
#pragma once

#include "compression/power_sgd.h"
#include "compression/power_sgd_math.h"
#include "compression/power_sgd_steps.h"

namespace gossipcc {
namespace compression {
namespace internal {

// `state` as a checkpoint holds it: its arrays copied to the host (empty where it has none).
PowerSGDTensorState SaveKeyState(const KeyState& state);

// Every tensor checked against `options` (rank, error feedback, shape, dtype, step, array sizes)
// and made a KeyState; InvalidArgumentError naming the key on the first problem.
KeyStates LoadKeyStates(const PowerSGDCheckpoint& checkpoint, const PowerSGDOptions& options, MathBackend& cpu);

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
