// CommunicatorOptions and the limits and thresholds of the comm layer that callers see.
// A header of its own, below both the Communicator (comm/communicator.h, which re-exports it)
// and the algorithms that read a threshold (direct_allreduce.cc, consistency_check.cc,
// gloo_collectives.cc), so that no file in comm/ includes the facade for a constant.
// docs/comm.md has the options as a table.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace gossipcc {

struct CommunicatorOptions {
  // Deadline of every operation, rendezvous included.
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
  // Compare each collective's signature across ranks before moving data. Costs one
  // exchange of a 64-byte message with every peer per collective; turning it off trusts the
  // caller (a mismatch may then corrupt memory or abort the process, as in raw Gloo). Eager
  // collectives (EagerCollectiveMaxBytes) carry their data in that exchange, so they check
  // either way.
  bool verify_collectives = true;
  // CUDA device this rank uses for CUDA buffers, or -1 to infer it from the first CUDA buffer.
  // Point-to-point on CUDA needs it set (NCCL's communicator is created collectively).
  int cuda_device = -1;
  // Peer health check. Each rank writes a heartbeat counter to the store every
  // `heartbeat_interval` (zero: timeout / 10, clamped to [50 ms, 1 s]) and "down" when it shuts
  // down. When an operation fails with a timeout or a transport error, the rank reads every
  // peer's heartbeat twice, 4 of its own heartbeats apart (3-4 intervals), and appends the
  // finding to the error message ("peer check: rank 2 is not responding (...): killed, stopped
  // or hung"), so that every survivor names the dead or stalled peer, not merely the neighbour
  // it was waiting on. The window is counted in this rank's own heartbeats so that a stall of
  // every heartbeat at once (a starved machine, a stalled store) names nobody: if this rank's
  // own heartbeat advanced fewer than 2 times in 6 intervals and no peer's advanced, no peer is
  // named from its silence and the message says why. That adds 3-4 intervals (<= 40% of a
  // short timeout, 4 s at most) to a failure, 6 when this rank's own heartbeat is slow. A peer
  // whose heartbeat thread alone is starved for 3 intervals is still named. Negative: no
  // heartbeat thread and no check.
  std::chrono::milliseconds heartbeat_interval{0};
  // Point-to-point payloads larger than this travel as consecutive segments of this many
  // bytes (the last one shorter) instead of one Gloo message; the receiver keeps a few
  // segments posted at a time, so both directions of an exchange flow at once
  // (docs/benchmarks_history.md (c)). The receiver follows the sender's setting (it travels in the
  // message header), so ranks may differ. 0: one message per payload. Otherwise in
  // [kMinP2PSegmentBytes, kMaxP2PSegmentBytes].
  size_t p2p_segment_bytes = size_t{256} << 10;
  // Point-to-point payloads travel on two extra meshes, one per direction (lower to higher
  // rank, higher to lower), so a receive's announcement never queues behind this rank's own
  // payload on the same socket (p2p_exchange.h). An exchange of 16 MB each way at 1 Gbit/s
  // then takes ~1.07 message times (1.1-1.4 without), 1.2 MB at 100 Mbit/s 1.07 (1.86
  // without). Costs two more full-mesh connects at creation. Every rank must agree.
  bool p2p_connection_per_direction = true;
  // Collectives run on this many lanes: collective k (in issue order) on lane
  // k % collective_lanes. Each lane has its own mesh of connections, signature check, scratch
  // memory and worker thread, so consecutive collectives on disjoint memory (DDP's gradient
  // buckets) are on the wire at once, as on ProcessGroupGloo's two threads, and fill the link
  // time one ring leaves idle. Results are those of running the collectives in issue order: a
  // collective starts only once every earlier one whose memory overlaps its own has completed,
  // and barriers and CUDA collectives wait for every earlier collective and hold back every
  // later one. Each lane beyond the first costs one more full-mesh connect at creation and a
  // thread. 1: one collective at a time. In [1, kMaxCollectiveLanes]; every rank must agree.
  int collective_lanes = 2;
  // float32 all-reduces above kDirectAllreduceMaxBytes run a ring whose messages are packed
  // losslessly (packed_ring_allreduce.h): the same result bits, about two thirds of the bytes
  // for gradients (0.87 for normal random values, never more than the plain ring's + 16 bytes
  // a segment), for about 1 ns of CPU per value packed or unpacked. Worth it where the link,
  // not the CPU, is the bottleneck (1 Gbit/s and slower); off by default. Every rank must
  // agree (checked at creation).
  bool lossless_float32_allreduce = false;
};

inline constexpr int kMaxCollectiveLanes = 8;

// Small CPU collectives go "eager": a rank whose payload is at most this many bytes (a
// function of the group size only: 128 KiB / (size - 1), so 128 KiB on 2 ranks, 42 KiB on 4,
// 18 KiB on 8) sends it to every peer inside the signature check that starts every collective,
// and all-reduce, broadcast, all-gather(v), reduce-scatter and barrier then complete in that
// one message latency; larger ones run Gloo's algorithms after the check. Eager reductions
// combine the ranks in rank order, so every rank gets a bitwise identical result. Always 0 for
// size 1.
size_t EagerCollectiveMaxBytes(int size);

// CPU all-reduces above the eager limit and up to this many bytes run as a direct
// reduce-scatter + all-gather (2 exchanges; comm/direct_allreduce.h), larger ones on Gloo's
// ring, whose pipelining overlaps reduction with transfer and needs no staging memory (direct
// needs (n-1)/n of the buffer) and receives from one peer at a time: on a rate-limited link
// three streams arriving at once at one port made 1 MB buckets slower than the ring
// (docs/benchmarks_history.md explains both thresholds). Up to here direct measured 0.4-0.65x of
// Gloo's time on 4 local ranks. float16/bfloat16 go direct at every size (in slices), so they
// accumulate in float32 without sending float32 on the wire.
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
