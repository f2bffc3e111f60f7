// Communicator: one rank's handle on a group of ranks.
//
// Every collective is asynchronous: it validates its arguments on the calling thread
// (InvalidArgumentError, synchronously), then returns a Work. Collectives must be issued in the
// same order on every rank; they take effect as if run in that order (collectives on disjoint
// memory may overlap, CommunicatorOptions::collective_lanes). CPU buffers travel over Gloo's TCP
// transport, CUDA buffers over NCCL. Before any payload moves, ranks compare what each was
// asked to do (kind, dtype, element counts, op, root, device); a disagreement fails the Work
// with a MismatchError on every rank, naming each rank's value, and leaves the communicator
// usable. A timeout or a failed peer fails the Work and leaves the communicator unusable
// (later calls raise AbortedError quoting the first failure), as NCCL does after an abort.
// Such errors end with a "peer check" naming which peers are dead, stalled or shut down
// (CommunicatorOptions::heartbeat_interval).
//
// Point-to-point operations (send, recv, p2p batches) are posted at once and progress in the
// background, independently of collectives, so a gossip round of sends and receives to
// different peers cannot deadlock. A receive checks that the sender's element count and
// dtype equal its own before data lands in the buffer.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/store.h"
#include "comm/transfer_progress.h"
#include "comm/types.h"
#include "comm/work.h"

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

// A receive's peer that matches a message from any other rank (CPU buffers only).
inline constexpr int kAnySource = -1;

// One operation of a grouped point-to-point batch.
struct P2POp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind;
  Buffer buffer;
  int peer;  // for a receive in a p2p() batch on CPU buffers: kAnySource matches any sender
  uint32_t tag = 0;
  // Receives: if set, the sender's rank is written here before the Work completes.
  int* source = nullptr;
  // Sends on CPU memory only: when not empty, the message is these pieces' elements
  // concatenated (each of buffer.dtype; buffer.data unused, buffer.count their sum), and the
  // receiver sees one message of buffer.count elements. It saves the caller from packing a
  // message out of parts it already has (a header, a model's parameters, a trailer): every
  // segment of the payload that lies inside one piece is sent from that piece's memory; only
  // the few segments that straddle two pieces are copied (into a buffer the batch owns).
  std::vector<Buffer> gather;
  // CPU memory only: if set, the transport reports how much of the payload has moved while
  // the operation is in flight (comm/transfer_progress.h), so the caller can work on a large
  // message's first part before its last byte.
  std::shared_ptr<TransferProgress> progress;

  static P2POp Send(Buffer b, int peer, uint32_t tag = 0) { return {Kind::kSend, b, peer, tag}; }
  static P2POp Recv(Buffer b, int peer, uint32_t tag = 0, int* source = nullptr) {
    return {Kind::kRecv, b, peer, tag, source};
  }
  static P2POp SendGather(std::vector<Buffer> pieces, int peer, uint32_t tag = 0);
};

// Bytes this rank put on the wire since creation, by operation family (for benchmarks
// and for checking that an algorithm sends what its formula says).
struct TrafficCounters {
  uint64_t collective_payload_bytes = 0;  // payload handed to collectives (not wire bytes)
  uint64_t p2p_bytes_sent = 0;            // payload bytes of completed sends
  uint64_t p2p_bytes_received = 0;
  // Lossless packing (CommunicatorOptions::lossless_float32_allreduce): the float32 bytes the
  // packed ring sent, and the bytes it put in its messages for them (their ratio is what the
  // packing saved); both 0 with the option off.
  uint64_t packed_allreduce_raw_bytes = 0;
  uint64_t packed_allreduce_wire_bytes = 0;
};

class Communicator {
 public:
  // Rendezvous with the other `size - 1` ranks through `store` and connect a full mesh.
  // Throws TimeoutError if they do not all arrive within options.timeout.
  static std::unique_ptr<Communicator> Create(std::shared_ptr<Store> store, int rank, int size,
                                              CommunicatorOptions options = {});
  ~Communicator();

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const CommunicatorOptions& options() const;

  // In place: data <- reduce(data of every rank). float16/bfloat16 are reduced in float32
  // and rounded once. kAvg needs a floating dtype.
  std::shared_ptr<Work> allreduce(Buffer data, ReduceOp op = ReduceOp::kSum);
  // In place: data <- data of `root`.
  std::shared_ptr<Work> broadcast(Buffer data, int root);
  // output (size() * input.count elements) <- concatenation of every rank's input.
  std::shared_ptr<Work> allgather(Buffer input, Buffer output);
  // output <- concatenation of every rank's input; rank r contributes counts[r] elements
  // (input.count == counts[rank()]; output.count == sum(counts)). Every rank passes the same counts.
  std::shared_ptr<Work> allgatherv(Buffer input, Buffer output, std::vector<size_t> counts);
  // input has size() * output.count elements; rank r gets reduce over ranks of chunk r.
  std::shared_ptr<Work> reduce_scatter(Buffer input, Buffer output, ReduceOp op = ReduceOp::kSum);
  // input and output have size() equal chunks; chunk j of the input goes to rank j, and
  // chunk i of the output comes from rank i.
  std::shared_ptr<Work> alltoall(Buffer input, Buffer output);
  // As alltoall with per-peer element counts: send_counts[j] to rank j, recv_counts[i] from
  // rank i (which must equal rank i's send_counts[rank()]).
  std::shared_ptr<Work> alltoallv(Buffer input, std::vector<size_t> send_counts, Buffer output,
                                  std::vector<size_t> recv_counts);
  std::shared_ptr<Work> barrier();

  // Point to point. Messages between one pair with one tag are matched in posting order.
  std::shared_ptr<Work> send(Buffer data, int peer, uint32_t tag = 0);
  std::shared_ptr<Work> recv(Buffer data, int peer, uint32_t tag = 0);
  // Receives from whichever rank sends first with `tag` (CPU buffers); `*source` (kept alive
  // by the caller until the Work completes) gets that rank.
  std::shared_ptr<Work> recv_any_source(Buffer data, uint32_t tag, int* source);
  // Posts every operation at once; the Work completes when all have.
  std::shared_ptr<Work> p2p(absl::Span<const P2POp> ops);

  // Refuses new operations and fails pending ones with AbortedError. Idempotent; the
  // destructor calls it.
  void shutdown();

  TrafficCounters traffic() const;

  // Checks every peer's heartbeat now (takes 3-4 heartbeat intervals, see heartbeat_interval)
  // and returns the ranks that are not responding or have shut down, ascending: only those that
  // shut down when this rank's own heartbeat and every peer's stalled. Empty with the check
  // disabled.
  std::vector<int> UnresponsivePeers();

  class Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gossipcc
