// Meshes: a communicator's Gloo connections, from the rendezvous to the last pair destroyed. On
// one device: the first mesh (lane 0's collectives, point-to-point headers), one per further lane,
// one signature-check mesh per lane, with p2p_connection_per_direction one point-to-point payload
// mesh per direction, and streams_per_peer - 1 more beside each mesh that carries large payloads
// (comm/gloo/striping.h). Buffers posted on them by an operation that fails part-way go to
// retired(), which only Close frees.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "comm/core/options.h"
#include "comm/core/store.h"
#include "comm/core/topology.h"
#include "comm/gloo/call.h"
#include "comm/gloo/consistency_check.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/p2p/exchange.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace gossipcc {

// What lane i runs its CPU collectives on.
struct LaneLink {
  std::shared_ptr<gloo::Context> context;            // lane 0: the communicator's first mesh
  // The ring all-reduce's streams: `context` first, then streams_per_peer - 1 more meshes.
  std::vector<std::shared_ptr<gloo::Context>> streams;
  std::shared_ptr<gloo::Context> signature_context;  // its signature check's mesh (headers only)
  // Refers to signature_context, and is declared after it so that it is destroyed first. Its
  // staging memory outlives the mesh's pairs (Close).
  std::unique_ptr<CollectiveHandshake> handshake;
  CollectiveScratch scratch;  // for the one collective the lane runs at a time
};

class Meshes {
 public:
  Meshes(int rank, int size) : rank_(rank), size_(size), topology_(Topology::Flat(size)) {}
  ~Meshes();  // Close()
  Meshes(const Meshes&) = delete;
  Meshes& operator=(const Meshes&) = delete;

  // Rendezvous under "gloo*/" keys of `store` and connect every mesh, all within one deadline
  // (options.rendezvous_timeout, else options.timeout). Throws TimeoutError or PeerError, and
  // InvalidArgumentError naming the option and each rank's value when ranks disagree on an
  // option they must share. After a throw, Close still tears down what was connected.
  void Connect(const std::shared_ptr<Store>& store, const CommunicatorOptions& options);
  // Point-to-point on these meshes (headers on the first, payloads on the per-direction meshes
  // when there are any). After Connect.
  void StartP2P(const CommunicatorOptions& options, P2PExchange::FailureHandler on_failure);

  int lanes() const { return static_cast<int>(lanes_.size()); }
  LaneLink& lane(int i) { return *lanes_[i]; }
  const LaneLink& lane(int i) const { return *lanes_[i]; }
  P2PExchange* p2p() const { return p2p_.get(); }  // null before StartP2P
  // Which ranks share a host (after Connect), and whether large all-reduces run in two levels
  // over it (CommunicatorOptions::topology).
  const Topology& topology() const { return topology_; }
  const Topology* hierarchy() const { return hierarchical_ ? &topology_ : nullptr; }
  RetiredBuffers& retired() { return retired_; }

  // Once nothing runs on the meshes any more (lanes joined, P2PExchange::Shutdown called).
  // Idempotent.
  void Close();

 private:
  // Options every rank must share, settled by one all-gather on the fresh first mesh: a rank
  // that connects a mesh a peer does not (p2p_connection_per_direction, collective_lanes), or
  // sends its all-reduces on another ring (lossless_float32_allreduce: packed messages travel
  // on a slot of their own), would otherwise wait out the timeout at its first use.
  void AgreeOnSharedOptions(const CommunicatorOptions& options);
  // One all-gather of every rank's host key (CommunicatorOptions::host_key): sets topology_
  // and hierarchical_.
  void LearnTopology(const CommunicatorOptions& options);

  const int rank_;
  const int size_;
  // Declared before everything that adds to it (see Close).
  RetiredBuffers retired_;
  std::shared_ptr<gloo::Context> first_;
  std::vector<std::unique_ptr<LaneLink>> lanes_;
  // Point-to-point payload streams per direction (empty: on the first mesh, one stream).
  std::array<std::vector<std::shared_ptr<gloo::Context>>, 2> payload_;
  // Every mesh above, kept until Close has destroyed its pairs.
  std::vector<std::shared_ptr<gloo::Context>> meshes_;
  std::unique_ptr<P2PExchange> p2p_;
  Topology topology_;
  bool hierarchical_ = false;
  bool closed_ = false;
};

}  // namespace gossipcc
