// Connecting a full mesh of Gloo pairs through a store, within a deadline, and saying why not.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comm/core/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace gossipcc {

struct GlooMeshOptions {
  std::string hostname;
  std::string interface;
  std::chrono::milliseconds timeout;  // of every operation on the mesh
  // By when the rendezvous and connection must be done (unset: `timeout` from the call).
  std::optional<std::chrono::steady_clock::time_point> connect_deadline;
};

// Gloo writes without MSG_NOSIGNAL: a write to a dead peer would kill this process with
// SIGPIPE. Ignores SIGPIPE if its disposition is the default (so the write fails as a
// PeerError); an application's handler is left alone. Once per process.
void IgnoreSigpipeUnlessHandled();

// Creates a TCP device and connects every pair of ranks through `store` (after
// IgnoreSigpipeUnlessHandled). With `device`
// given, the new mesh shares it (its listening socket and event loop thread) instead.
std::shared_ptr<gloo::Context> ConnectGlooMesh(std::shared_ptr<Store> store, int rank, int size,
                                               const GlooMeshOptions& options,
                                               std::shared_ptr<gloo::transport::Device> device = nullptr);

}  // namespace gossipcc
