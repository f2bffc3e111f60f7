// PowerSGD's checkpoints: the byte format of PowerSGDCheckpoint (its Serialize and
// Deserialize are defined in power_sgd_checkpoint.cc) and the conversion between a
// checkpoint's tensors and PowerSGD's live per-key state. Internal to compression/:
// PowerSGD::SaveState, GetTensorState and LoadState call these.
#pragma once

#include "compression/power_sgd.h"
#include "compression/power_sgd_math.h"
#include "compression/power_sgd_steps.h"

namespace gossipcc {
namespace compression {
namespace internal {

// `state` as a checkpoint holds it: its arrays copied to the host (empty where it has none).
PowerSGDTensorState SaveKeyState(const KeyState& state);

// Every tensor of `checkpoint` checked (the same rank and error feedback as `options`, a valid
// shape and floating-point dtype, a non-negative step count, error memory and Q of the sizes
// the shape and rank give) and made a KeyState in `cpu`'s memory. Throws InvalidArgumentError
// ("PowerSGD::LoadState: ..." naming the key) on the first problem, having built nothing the
// caller keeps.
KeyStates LoadKeyStates(const PowerSGDCheckpoint& checkpoint, const PowerSGDOptions& options, MathBackend& cpu);

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
