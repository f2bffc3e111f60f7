#include "torch_backend/communicator_environment.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/errors.h"

namespace gossipcc {
namespace torch_backend {
namespace {

std::string TransportHostname() {
  for (const char* name : {"GOSSIPCC_HOSTNAME"}) {
    if (const char* v = std::getenv(name)) return v;
  }
  return "";
}

// GOSSIPCC_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME. Both take gloo's comma-separated list;
// gossipcc listens on the first interface (ProcessGroupGloo makes a device per interface and
// spreads its pairs over them; gossipcc's lanes and meshes share one listening device).
std::string TransportInterface() {
  for (const char* name : {"GOSSIPCC_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    const std::string list(v);
    const std::string first = list.substr(0, list.find(','));
    if (first.empty()) throw InvalidArgumentError(absl::StrCat(name, "='", list, "' names no interface first"));
    return first;
  }
  return "";
}

// Environment variable `name` as a decimal number (absl::SimpleAtoi) into `value`; unset or
// empty leaves it. `what` names the expected value in the error.
template <typename T>
void ApplyNumberFromEnvironment(const char* name, const char* what, T& value) {
  const char* v = std::getenv(name);
  if (!v || !*v) return;
  T parsed;
  if (!absl::SimpleAtoi(v, &parsed)) {
    throw InvalidArgumentError(absl::StrCat(name, " must be ", what, ", got '", v, "'"));
  }
  value = parsed;
}

// A 0/1 environment variable into `flag`; unset or empty leaves it.
void ApplyFlagFromEnvironment(const char* name, bool& flag) {
  const char* v = std::getenv(name);
  if (!v || !*v) return;
  const std::string text(v);
  if (text != "0" && text != "1") {
    throw InvalidArgumentError(absl::StrCat(name, " must be 0 or 1, got '", text, "'"));
  }
  flag = text == "1";
}

}  // namespace

CommunicatorOptions CommunicatorOptionsFromEnvironment(CommunicatorOptions c, std::chrono::milliseconds timeout) {
  c.timeout = timeout;
  // The Communicator checks the ranges (p2p_segment_bytes: 0 is off; heartbeat_interval:
  // 0 is the default, negative turns the peer check off; collective_lanes). Every rank must
  // agree on p2p_connection_per_direction and collective_lanes.
  uint64_t segment_bytes = c.p2p_segment_bytes;
  ApplyNumberFromEnvironment("GOSSIPCC_P2P_SEGMENT_BYTES", "a byte count", segment_bytes);
  c.p2p_segment_bytes = static_cast<size_t>(segment_bytes);
  int64_t heartbeat_ms = c.heartbeat_interval.count();
  ApplyNumberFromEnvironment("GOSSIPCC_HEARTBEAT_INTERVAL_MS", "a whole number of milliseconds", heartbeat_ms);
  c.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  ApplyFlagFromEnvironment("GOSSIPCC_P2P_CONNECTION_PER_DIRECTION", c.p2p_connection_per_direction);
  ApplyFlagFromEnvironment("GOSSIPCC_VERIFY_COLLECTIVES", c.verify_collectives);
  ApplyNumberFromEnvironment("GOSSIPCC_COLLECTIVE_LANES", "a lane count", c.collective_lanes);
  ApplyFlagFromEnvironment("GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE", c.lossless_float32_allreduce);
  // The CUDA device whose NCCL communicator is created at init (needed before any CUDA
  // point-to-point; collectives create it lazily otherwise). Communicator::Create checks it.
  ApplyNumberFromEnvironment("GOSSIPCC_CUDA_DEVICE", "a CUDA device ordinal", c.cuda_device);
  const std::string iface = TransportInterface();
  const std::string host = TransportHostname();
  if (!iface.empty()) c.interface = iface;
  if (!host.empty()) c.hostname = host;
  return c;
}

}  // namespace torch_backend
}  // namespace gossipcc
