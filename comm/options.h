// CommunicatorOptions and the limits and thresholds of the comm layer that callers see.
// A header of its own, below both the Communicator (comm/communicator.h, which re-exports it)
// and the algorithms that read a threshold (direct_allreduce.cc, consistency_check.cc,
// gloo_collectives.cc), so that no file in comm/ includes the facade for a constant.
// docs/comm.md has the options as a table (default, values, meaning, must every rank agree?),
// and docs/benchmarks.md what the defaults measure. Options
// marked "every rank must agree (checked)" are all-gathered at creation (meshes.h), so that a
// rank that differs fails Create instead of waiting out the timeout at first use.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace gossipcc {

struct CommunicatorOptions {
  // Deadline of every operation, counted from its issue, rendezvous included (a collective's
  // issue: its call, or the caller's earlier issue time, comm/issue_time.h).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // How long Create may take in all, every mesh's rendezvous and connection included; zero:
  // `timeout`. The c10d backend passes what is left of init_process_group's timeout, so that a
  // rank fails init within its timeout even where torch's store took part of it.
  std::chrono::milliseconds rendezvous_timeout{0};
  // Network interface to listen on (Gloo TCP), e.g. "eth0"; it must exist.
  std::string interface;
  // Else the name or address to listen on; it must resolve to an address of this host.
  // Both empty: as PyTorch's ProcessGroupGloo, this host's name if it resolves to an address
  // this host can bind, else the loopback address with a warning (comm/listen_address.h).
  std::string hostname;
  // Compare each collective's signature across ranks before moving data (one 64-byte message
  // to every peer per collective). Off trusts the caller: a mismatch may then corrupt memory or
  // abort the process, as in raw Gloo. Eager collectives (EagerCollectiveMaxBytes) carry their
  // data in that exchange, so they check either way.
  bool verify_collectives = true;
  // CUDA device this rank uses for CUDA buffers, or -1 to infer it from the first CUDA buffer.
  // Point-to-point on CUDA needs it set (NCCL's communicator is created collectively).
  int cuda_device = -1;
  // The peer check (comm/peer_health.h): a heartbeat in the store every interval (zero:
  // timeout / 10, clamped to [50 ms, 1 s]), read when an operation fails with a timeout or a
  // transport error, so that every survivor's error names the dead, stalled or shut-down peer,
  // not merely the neighbour it waited on. Adds 3-4 intervals to a failure (6 when this rank's
  // own heartbeat is slow). Negative: no heartbeat thread and no check.
  std::chrono::milliseconds heartbeat_interval{0};
  // Point-to-point payloads larger than this travel as segments of this many bytes, a few
  // posted at a time, so that both directions of an exchange flow at once (docs/comm.md). The
  // receiver follows the sender's setting (it travels in the header), so ranks may differ.
  // 0: one message per payload; otherwise in [kMinP2PSegmentBytes, kMaxP2PSegmentBytes].
  size_t p2p_segment_bytes = size_t{256} << 10;
  // Point-to-point payloads on two extra meshes, one per direction, so that a receive's
  // announcement never queues behind this rank's own payload on one socket (p2p_exchange.h).
  // Costs two more mesh connects at creation.
  // Every rank must agree (checked).
  bool p2p_connection_per_direction = true;
  // Collective k (in issue order) runs on lane k % collective_lanes (comm/lanes.h). Each lane
  // has its own mesh, signature check, scratch and worker thread, so collectives on disjoint
  // memory (DDP's buckets) are on the wire at once, as on ProcessGroupGloo's two threads.
  // Results stay those of issue order: a collective starts only after every earlier one on
  // overlapping memory; barriers and CUDA collectives are fences. Each lane beyond the first
  // costs a mesh connect and a thread. In [1, kMaxCollectiveLanes]; every rank must agree
  // (checked).
  int collective_lanes = 2;
  // float32 all-reduces above kDirectAllreduceMaxBytes on a ring whose messages are packed
  // losslessly (packed_ring_allreduce.h): the same result bits on fewer bytes, for some CPU per
  // value; worth it where the link, not the CPU, is the bottleneck (docs/comm.md, "Lossless
  // packing", has the figures). Every rank must agree (checked).
  bool lossless_float32_allreduce = false;
};

inline constexpr int kMaxCollectiveLanes = 8;

// Small CPU collectives go "eager": a rank whose payload is at most this many bytes (a
// function of the group size only: 128 KiB / (size - 1)) sends it to every peer inside the
// signature check that starts every collective, and all-reduce, broadcast, all-gather(v),
// reduce-scatter and barrier then complete in that one message latency. Eager reductions
// combine the ranks in rank order, so every rank gets a bitwise identical result. Always 0 for
// size 1.
size_t EagerCollectiveMaxBytes(int size);

// CPU all-reduces above the eager limit and up to this many bytes run as a direct
// reduce-scatter + all-gather (2 exchanges; comm/direct_allreduce.h), larger ones on a ring,
// whose pipelining overlaps reduction with transfer, needs no staging memory and receives from
// one peer at a time (several streams arriving at one port slow a rate-limited link).
// float16/bfloat16 go direct at every size (in slices), so they accumulate in float32 without
// sending float32 on the wire.
inline constexpr size_t kDirectAllreduceMaxBytes = size_t{512} << 10;
// The direct algorithm handles larger buffers in slices of this many bytes (reduce-scatter:
// of all blocks together), which bounds its staging memory to one slice.
inline constexpr size_t kDirectSliceBytes = size_t{4} << 20;

inline constexpr size_t kMinP2PSegmentBytes = size_t{1} << 10;
inline constexpr size_t kMaxP2PSegmentBytes = size_t{1} << 30;

// Throws InvalidArgumentError naming the first option out of its range (timeouts,
// p2p_segment_bytes, collective_lanes, cuda_device). Communicator::Create calls it.
void ValidateCommunicatorOptions(const CommunicatorOptions& options);

}  // namespace gossipcc
