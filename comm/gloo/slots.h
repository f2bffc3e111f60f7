// The slots of the messages gossipcc posts on Gloo's pairs, apart from Gloo's own.
#pragma once

#include <cstdint>

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

}  // namespace gossipcc
