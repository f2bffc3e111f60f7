// CommunicatorOptions and the comm layer's thresholds that callers see (communicator.h includes
// it). docs/comm.md tables every option; a "checked" one that differs across ranks fails Create.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gossipcc {

// How collectives use which ranks share a host (comm/core/topology.h).
enum class TopologyMode : uint8_t {
  kFlat,          // every rank as a host of its own
  kHierarchical,  // large all-reduces in two levels: inside each host, then across hosts
  kAuto,          // hierarchical on several hosts of as many ranks each, some more than one
};

struct CommunicatorOptions {
  // Deadline of every operation, counted from its issue (CallOptions::issued), rendezvous included.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Bound on Create as a whole (every mesh's rendezvous and connection); zero: `timeout`.
  std::chrono::milliseconds rendezvous_timeout{0};
  // Where to listen (comm/core/listen_address.h): an interface, else a name or address of this host.
  std::string interface;
  std::string hostname;
  // Compare each collective's signature across ranks before data moves. Checked.
  bool verify_collectives = true;
  // CUDA device for CUDA buffers; -1: the first CUDA buffer's. Point-to-point on CUDA needs it.
  int cuda_device = -1;
  // Peer check's heartbeat (comm/peer_health.h); 0: timeout / 10 in [50 ms, 1 s]; < 0: off.
  std::chrono::milliseconds heartbeat_interval{0};
  // Point-to-point segment size (0: unsegmented); the receiver follows the sender's.
  size_t p2p_segment_bytes = size_t{256} << 10;
  // Point-to-point payloads on a mesh per direction (comm/p2p/exchange.h). Checked.
  bool p2p_connection_per_direction = true;
  // Collective k runs on lane k % collective_lanes (comm/lanes.h). Checked.
  int collective_lanes = 2;
  // Large float32 all-reduces on the packed ring (packed_ring_allreduce.h). Checked.
  bool lossless_float32_allreduce = false;
  // TCP connections per peer pair for large payloads (the ring all-reduce's messages, point-to-point
  // payloads of several segments; comm/gloo/striping.h). Checked.
  int streams_per_peer = 1;
  // Two-level all-reduces over hosts (hierarchical_allreduce.h); kHierarchical on hosts of unequal
  // rank counts fails Create naming them. Checked.
  TopologyMode topology = TopologyMode::kAuto;
  // Which host this rank is on: ranks with equal keys share one (and its name in messages).
  // Empty: this machine's boot id and network namespace (DefaultHostKey).
  std::string host_key;
};

std::string TopologyModeName(TopologyMode mode);  // "flat", "hierarchical" or "auto"

inline constexpr int kMaxCollectiveLanes = 8;
inline constexpr int kMaxStreamsPerPeer = 16;

// CPU collectives whose per-rank payload is at most this (128 KiB / (size - 1); 0 for size 1)
// travel inside the signature check and complete in one exchange, reduced in rank order.
size_t EagerCollectiveMaxBytes(int size);

// CPU all-reduces above the eager limit and up to this run direct (direct_allreduce.h), larger
// ones on the ring; float16/bfloat16 run direct at every size, in slices of kDirectSliceBytes.
inline constexpr size_t kDirectAllreduceMaxBytes = size_t{512} << 10;
inline constexpr size_t kDirectSliceBytes = size_t{4} << 20;

inline constexpr size_t kMinP2PSegmentBytes = size_t{1} << 10;
inline constexpr size_t kMaxP2PSegmentBytes = size_t{1} << 30;

// Throws InvalidArgumentError naming the first option out of its range. Create calls it.
void ValidateCommunicatorOptions(const CommunicatorOptions& options);

}  // namespace gossipcc
