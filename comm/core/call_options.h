// How one operation is issued, passed with the call (Communicator's last argument): for callers
// that hold a call back before the Communicator, or issue CUDA work on a stream of their own
// (the c10d backend does both). The default is a call issued now, on the legacy default stream.
#pragma once

#include <chrono>
#include <optional>

namespace gossipcc {

struct CallOptions {
  // When the caller issued the operation, if before the Communicator call: the deadline (the
  // communicator's timeout after the issue) counts the caller's wait too, and an operation with
  // nothing left fails at once naming `waited_for`. A time in the future counts as now.
  std::optional<std::chrono::steady_clock::time_point> issued;
  // What the caller held the call back for, e.g. "earlier callbacks" (static storage; null:
  // nothing named).
  const char* waited_for = nullptr;
  // CUDA buffers: the caller's stream (a cudaStream_t; nullptr: the legacy default stream). At
  // issue an event is recorded there and the communication stream waits for it, as in
  // ProcessGroupNCCL, so the operation sees what the caller queued before the call and nothing
  // after. The caller keeps the buffers alive until the Work completes. CPU buffers: unused.
  void* cuda_stream = nullptr;
};

}  // namespace gossipcc
