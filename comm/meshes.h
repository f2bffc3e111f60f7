// Meshes: a communicator's Gloo connections, from the rendezvous to the last pair destroyed.
//
// Connect makes, on one device (one listening socket and event loop): the first mesh (lane 0's
// collectives and point-to-point headers), one mesh per further lane (so that a lane's
// messages never queue behind another lane's payload on one socket), one signature mesh per
// lane carrying only its check's headers (a bound write pins its socket's send buffer, which
// would throttle a payload sharing the socket), and, with p2p_connection_per_direction, two
// meshes for point-to-point payloads, one per direction. With streams_per_peer = k > 1, every
// mesh that carries large payloads (each lane's, and each point-to-point payload direction's)
// gets k - 1 more meshes beside it, so that each peer pair has k TCP connections to deal those
// payloads over (comm/gloo/striping.h). Right after the first mesh, one all-gather settles the
// options every rank must share (AgreeOnSharedOptions).
//
// Close tears them down in the one order that is safe (see Close). Everything that posts Gloo
// buffers on these meshes hands them, when an operation fails part-way, to retired(), which
// only Close frees.
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
