#include "comm/meshes.h"

#include <gloo/context.h>

#include <chrono>
#include <map>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/core/errors.h"
#include "comm/gloo/collectives.h"
#include "comm/gloo/gloo_error.h"
#include "comm/gloo/pair_teardown.h"
#include "comm/gloo/rendezvous.h"

namespace gossipcc {
namespace {

// The tag of the all-gather that checks the mesh layout at creation, before any collective
// (whose tags count up from 0).
constexpr uint32_t kMeshLayoutTag = 0xffffffffu;

}  // namespace

Meshes::~Meshes() { Close(); }

void Meshes::Connect(const std::shared_ptr<Store>& store, const CommunicatorOptions& options) {
  // One deadline for every mesh of this communicator: Create ends within the rendezvous time.
  const auto rendezvous = options.rendezvous_timeout.count() > 0 ? options.rendezvous_timeout : options.timeout;
  const GlooMeshOptions mesh{options.hostname, options.interface, options.timeout,
                             std::chrono::steady_clock::now() + rendezvous};
  // Every mesh after the first on the first one's device.
  auto connect = [&](const std::string& prefix) {
    return ConnectGlooMesh(std::make_shared<PrefixStore>(prefix, store), rank_, size_, mesh, first_->getDevice());
  };
  first_ = ConnectGlooMesh(std::make_shared<PrefixStore>("gloo", store), rank_, size_, mesh);
  meshes_.push_back(first_);
  if (size_ > 1) {
    AgreeOnSharedOptions(options);
    LearnTopology(options);
  }
  const int lanes = size_ == 1 ? 1 : options.collective_lanes;
  const int streams = size_ == 1 ? 1 : options.streams_per_peer;
  for (int i = 0; i < lanes; ++i) {
    auto lane = std::make_unique<LaneLink>();
    // A mesh per lane, so that a lane's messages never queue behind another lane's payload.
    lane->context = i == 0 ? first_ : connect(absl::StrCat("gloo_lane", i));
    if (i > 0) meshes_.push_back(lane->context);
    lane->streams.push_back(lane->context);
    for (int s = 1; s < streams; ++s) {
      lane->streams.push_back(connect(absl::StrCat("gloo_lane", i, "_stream", s)));
      meshes_.push_back(lane->streams.back());
    }
    // The check's headers on a mesh of their own: a bound write pins its socket's send buffer,
    // which would throttle a payload sharing the socket.
    lane->signature_context = size_ == 1 ? lane->context : connect(absl::StrCat("gloo_signatures", i));
    if (size_ > 1) meshes_.push_back(lane->signature_context);
    // Created at once: its receive buffers must be registered before any peer's first header.
    lane->handshake = std::make_unique<CollectiveHandshake>(*lane->signature_context);
    lanes_.push_back(std::move(lane));
  }
  if (size_ == 1) return;
  if (options.p2p_connection_per_direction) {
    // Two meshes of their own, not lower-to-higher payloads on the first mesh: that connects
    // faster, but headers then queue behind payloads.
    for (int s = 0; s < streams; ++s) {
      const std::string suffix = s == 0 ? "" : absl::StrCat("_stream", s);
      payload_[0].push_back(connect("gloo_p2p_up" + suffix));
      payload_[1].push_back(connect("gloo_p2p_down" + suffix));
      meshes_.push_back(payload_[0].back());
      meshes_.push_back(payload_[1].back());
    }
  } else if (streams > 1) {
    // Payloads of both directions on the first mesh and k - 1 more, shared by both directions.
    payload_[0].push_back(first_);
    for (int s = 1; s < streams; ++s) {
      payload_[0].push_back(connect(absl::StrCat("gloo_p2p_stream", s)));
      meshes_.push_back(payload_[0].back());
    }
    payload_[1] = payload_[0];
  }
}

void Meshes::StartP2P(const CommunicatorOptions& options, P2PExchange::FailureHandler on_failure) {
  p2p_ = std::make_unique<P2PExchange>(first_, payload_, options.timeout, options.p2p_segment_bytes, retired_,
                                       std::move(on_failure));
}

void Meshes::AgreeOnSharedOptions(const CommunicatorOptions& options) {
  enum class Shown { kNumber, kFlag, kTopology };
  struct Agreed {
    const char* name;
    Shown shown;
  };
  static constexpr std::array<Agreed, 6> kAgreed = {{{"p2p_connection_per_direction", Shown::kFlag},
                                                     {"collective_lanes", Shown::kNumber},
                                                     {"lossless_float32_allreduce", Shown::kFlag},
                                                     {"verify_collectives", Shown::kFlag},
                                                     {"streams_per_peer", Shown::kNumber},
                                                     {"topology", Shown::kTopology}}};
  const std::array<uint8_t, kAgreed.size()> mine = {
      static_cast<uint8_t>(options.p2p_connection_per_direction ? 1 : 0),
      static_cast<uint8_t>(options.collective_lanes),
      static_cast<uint8_t>(options.lossless_float32_allreduce ? 1 : 0),
      static_cast<uint8_t>(options.verify_collectives ? 1 : 0),
      static_cast<uint8_t>(options.streams_per_peer),
      static_cast<uint8_t>(options.topology)};
  std::vector<uint8_t> all(mine.size() * size_);
  const std::string where = absl::StrCat("rank ", rank_, " of ", size_, ": ");
  CollectiveScratch scratch;
  try {
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    GlooAllgather(GlooCall{first_, kMeshLayoutTag, deadline, &scratch, &retired_},
                  Buffer{const_cast<uint8_t*>(mine.data()), mine.size(), DType::kUInt8, Device::CPU()},
                  Buffer{all.data(), all.size(), DType::kUInt8, Device::CPU()});
  } catch (const std::exception& e) {
    RethrowGlooError(where + "agreeing on the connection layout", e);
  }
  auto show = [](size_t field, uint8_t value) {
    switch (kAgreed[field].shown) {
      case Shown::kFlag:
        return std::string(value ? "true" : "false");
      case Shown::kTopology:
        return TopologyModeName(static_cast<TopologyMode>(value));
      case Shown::kNumber:
        break;
    }
    return absl::StrCat(value);
  };
  for (size_t field = 0; field < mine.size(); ++field) {
    std::map<uint8_t, std::vector<int>> ranks_by_value;  // of the ranks that differ from this one
    for (int r = 0; r < size_; ++r) {
      const uint8_t theirs = all[static_cast<size_t>(r) * mine.size() + field];
      if (theirs != mine[field]) ranks_by_value[theirs].push_back(r);
    }
    std::vector<std::string> others;  // "false on rank(s) 0, 1"
    for (const auto& [value, ranks] : ranks_by_value) {
      others.push_back(absl::StrCat(show(field, value), " on rank(s) ", absl::StrJoin(ranks, ", ")));
    }
    if (!others.empty()) {
      throw InvalidArgumentError(absl::StrCat(where, "Communicator::Create: CommunicatorOptions::", kAgreed[field].name,
                                              " is ", show(field, mine[field]), " here but ",
                                              absl::StrJoin(others, "; "), "; every rank must use the same setting"));
    }
  }
}

void Meshes::LearnTopology(const CommunicatorOptions& options) {
  // A fixed record per rank: the key's hash (ranks with equal hashes share a host) and the
  // host's name for messages, truncated.
  constexpr size_t kNameBytes = 120;
  struct Record {
    uint64_t key_hash;
    char name[kNameBytes];
  };
  const std::string key = options.host_key.empty() ? DefaultHostKey() : options.host_key;
  const std::string name = options.host_key.empty() ? DefaultHostName() : options.host_key;
  Record mine{};
  mine.key_hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : key) mine.key_hash = (mine.key_hash ^ c) * 1099511628211ull;
  name.copy(mine.name, kNameBytes - 1);
  std::vector<Record> all(static_cast<size_t>(size_));
  CollectiveScratch scratch;
  try {
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    GlooAllgather(GlooCall{first_, kMeshLayoutTag - 1, deadline, &scratch, &retired_},
                  Buffer{&mine, sizeof(Record), DType::kUInt8, Device::CPU()},
                  Buffer{all.data(), all.size() * sizeof(Record), DType::kUInt8, Device::CPU()});
  } catch (const std::exception& e) {
    RethrowGlooError(absl::StrCat("rank ", rank_, " of ", size_, ": learning which ranks share a host"), e);
  }
  std::vector<std::string> keys, names;
  for (const Record& r : all) {
    keys.push_back(absl::StrCat(r.key_hash));
    names.emplace_back(r.name, strnlen(r.name, kNameBytes));
  }
  topology_ = Topology::FromHostKeys(keys, names);
  if (options.topology == TopologyMode::kHierarchical && !topology_.uniform()) {
    throw InvalidArgumentError(absl::StrCat("rank ", rank_, " of ", size_,
                                            ": Communicator::Create: CommunicatorOptions::topology is hierarchical, "
                                            "which needs as many ranks on every host, but the ranks are on ",
                                            topology_.Describe(), " (use kFlat, or kAuto, which is flat here)"));
  }
  // kAuto: two levels only where they spare a NIC (several hosts, some holding several ranks);
  // one host has none to spare, and hosts of unequal counts fall back to the flat ring.
  hierarchical_ = options.topology == TopologyMode::kHierarchical ||
                  (options.topology == TopologyMode::kAuto && topology_.hosts() > 1 && topology_.any_host_shared() &&
                   topology_.uniform());
}

// The order, and why. When an operation fails part-way (a dead peer, a timeout), Gloo's device
// thread may still complete or fail operations posted on its buffers, under the pair's lock. So
// the buffers of failed operations were retired, not freed, and may be freed only once every
// pair is gone (DestroyPairs: each under the pair's lock, off the event loop), an ordering
// through the pair locks that ThreadSanitizer can see (docs/reliability.md). Destroying the
// contexts would not do: each retired buffer holds its context, and so the pairs, alive.
//  1. p2p_ first: its destructor waits for batches still in flight, which may fail and retire
//     their buffers meanwhile.
//  2. The signature checks' buffers: their bound buffers' destructors need the pairs alive, but
//     must run only after the signature meshes' pairs are off the device thread (Gloo finishes
//     a half-read message on the bound buffer it started it with, even a destroyed one, and a
//     peer's header can be half-way in when this rank shuts down); TakeRetiredBuffers does
//     both, in that order. Their unbound buffers join the retired ones.
//  3. Every pair of every mesh destroyed.
//  4. Only then the contexts and the retired buffers.
void Meshes::Close() {
  if (closed_) return;
  closed_ = true;
  p2p_.reset();
  for (auto& lane : lanes_) {
    for (auto& b : lane->handshake->TakeRetiredBuffers()) retired_.Add(std::move(b));
  }
  std::vector<std::shared_ptr<void>> retired = retired_.TakeAll();
  for (const auto& mesh : meshes_) DestroyPairs(*mesh);
  meshes_.clear();
  for (auto& lane : lanes_) {
    lane->context.reset();
    lane->signature_context.reset();
    lane->streams.clear();
  }
  payload_ = {};
  first_.reset();
  retired.clear();
}

}  // namespace gossipcc
