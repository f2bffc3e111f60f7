// Communicator: one rank's handle on a group of ranks.
//
// Every collective is asynchronous: it validates its arguments on the calling thread
// (InvalidArgumentError, synchronously), then returns a Work. Collectives must be issued in the
// same order on every rank; they take effect as if run in that order (collectives on disjoint
// memory may overlap, CommunicatorOptions::collective_lanes). CPU buffers travel over Gloo's TCP
// transport, CUDA buffers over NCCL. Before any payload moves, ranks compare what each was
// asked to do (kind, dtype, element counts, op, root, device); a disagreement fails the Work
// with a MismatchError on every rank, naming each rank's value, and leaves the communicator
// usable. A collective's deadline is CommunicatorOptions::timeout after its issue (the call, or
// the caller's earlier issue time: comm/issue_time.h); a CPU collective fails with TimeoutError
// by then whatever it waits for (earlier collectives, its signature check, its data), a CUDA
// one's NCCL stage within the timeout of its wait (nccl_transport.h). A timeout or a failed
// peer fails the Work and leaves the communicator unusable
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
#include "comm/options.h"
#include "comm/p2p_op.h"
#include "comm/store.h"
#include "comm/types.h"
#include "comm/work.h"

namespace gossipcc {

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

  // In place: data <- reduce(data of every rank). float16/bfloat16 CPU buffers are reduced in
  // float32 and rounded once; CUDA buffers with NCCL's native half-precision arithmetic
  // (rounded per hop). kAvg needs a floating dtype.
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

  // Keeps `memory` alive until this communicator's connections are gone. For an algorithm
  // built on these calls whose operation failed part-way: a receive may still be posted on
  // its buffers, which must then outlive the connections, not the call.
  void KeepUntilClosed(std::shared_ptr<void> memory);

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
