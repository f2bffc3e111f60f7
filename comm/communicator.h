// Communicator: one rank's handle on a group of ranks (docs/comm.md). CPU buffers travel over
// Gloo's TCP transport, CUDA buffers over NCCL.
//  - Collectives check their arguments on the calling thread (InvalidArgumentError) and return a
//    Work. Every rank issues them in one order; they take effect as if run in that order.
//  - Before any payload moves, the ranks compare what each was asked to do; a disagreement fails
//    the Work with the same MismatchError on every rank and leaves the communicator usable.
//  - An operation fails by CommunicatorOptions::timeout after its issue (CallOptions::issued); a
//    timeout or a failed peer poisons the communicator (later calls: AbortedError), and the error
//    ends with a peer check naming the dead or stalled ranks.
//  - Point-to-point operations are posted at once and progress independently of each other and
//    of collectives (no order of sends and receives deadlocks); a receive checks the sender's
//    count and dtype before data lands.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/core/call_options.h"
#include "comm/core/options.h"
#include "comm/core/p2p_op.h"
#include "comm/core/store.h"
#include "comm/core/topology.h"
#include "comm/core/types.h"
#include "comm/core/work.h"

namespace gossipcc {

// Bytes this rank handed to each operation family since creation.
struct TrafficCounters {
  uint64_t collective_payload_bytes = 0;  // payload handed to collectives (not wire bytes)
  uint64_t p2p_bytes_sent = 0;            // payload bytes of completed sends
  uint64_t p2p_bytes_received = 0;
  // The packed ring's float32 bytes, and the bytes of its messages for them.
  uint64_t packed_allreduce_raw_bytes = 0;
  uint64_t packed_allreduce_wire_bytes = 0;
};

class Communicator {
 public:
  // Rendezvous through `store` and connect; TimeoutError if not every rank arrives in time.
  static std::unique_ptr<Communicator> Create(std::shared_ptr<Store> store, int rank, int size,
                                              CommunicatorOptions options = {});
  ~Communicator();

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const CommunicatorOptions& options() const;

  // Every operation takes a CallOptions last (comm/core/call_options.h; default: issued now).

  // In place: data <- reduce(data of every rank). Half precision on CPU accumulates in float32
  // (on CUDA, NCCL's own arithmetic). kAvg needs a floating dtype.
  std::shared_ptr<Work> allreduce(Buffer data, ReduceOp op = ReduceOp::kSum, const CallOptions& call = {});
  // In place: data <- data of `root`.
  std::shared_ptr<Work> broadcast(Buffer data, int root, const CallOptions& call = {});
  // output (size() * input.count elements) <- concatenation of every rank's input.
  std::shared_ptr<Work> allgather(Buffer input, Buffer output, const CallOptions& call = {});
  // output <- concatenation of every rank's input; rank r contributes counts[r] elements
  // (input.count == counts[rank()]; output.count == sum(counts)). Every rank passes the same counts.
  std::shared_ptr<Work> allgatherv(Buffer input, Buffer output, std::vector<size_t> counts,
                                   const CallOptions& call = {});
  // input has size() * output.count elements; rank r gets reduce over ranks of chunk r.
  std::shared_ptr<Work> reduce_scatter(Buffer input, Buffer output, ReduceOp op = ReduceOp::kSum,
                                       const CallOptions& call = {});
  // size() equal chunks: input chunk j goes to rank j, output chunk i comes from rank i.
  std::shared_ptr<Work> alltoall(Buffer input, Buffer output, const CallOptions& call = {});
  // As alltoall with per-peer element counts: send_counts[j] to rank j, recv_counts[i] from
  // rank i (which must equal rank i's send_counts[rank()]).
  std::shared_ptr<Work> alltoallv(Buffer input, std::vector<size_t> send_counts, Buffer output,
                                  std::vector<size_t> recv_counts, const CallOptions& call = {});
  std::shared_ptr<Work> barrier(const CallOptions& call = {});

  // Point to point. Messages between one pair with one tag are matched in posting order. On
  // CPU the deadline counts from CallOptions::issued too; on CUDA each wait has the timeout.
  std::shared_ptr<Work> send(Buffer data, int peer, uint32_t tag = 0, const CallOptions& call = {});
  std::shared_ptr<Work> recv(Buffer data, int peer, uint32_t tag = 0, const CallOptions& call = {});
  // Receives from whichever rank sends first with `tag` (CPU buffers); `*source` (kept alive
  // by the caller until the Work completes) gets that rank.
  std::shared_ptr<Work> recv_any_source(Buffer data, uint32_t tag, int* source, const CallOptions& call = {});
  // Posts every operation at once; the Work completes when all have.
  std::shared_ptr<Work> p2p(absl::Span<const P2POp> ops, const CallOptions& call = {});

  // Refuses new operations and fails pending ones with AbortedError. Idempotent; also on destruction.
  void shutdown();

  // Keeps `memory` alive until the connections are gone: for an algorithm built on these calls
  // whose operation failed part-way, with a receive perhaps still posted on its buffers.
  void KeepUntilClosed(std::shared_ptr<void> memory);

  TrafficCounters traffic() const;

  // Which ranks share a host (CommunicatorOptions::host_key), and whether large all-reduces run
  // in two levels over those hosts (CommunicatorOptions::topology; comm/gloo/hierarchical_allreduce.h).
  const Topology& topology() const;
  bool hierarchical() const;

  // Runs the peer check now (3-4 heartbeat intervals): the ranks not responding or shut down,
  // ascending (only those shut down when every heartbeat stalled; none with the check off).
  std::vector<int> UnresponsivePeers();

  class Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gossipcc
