// How one operation is issued (Communicator's last argument), for callers that hold a call back or
// issue CUDA work on a stream of their own. Default: issued now, on the legacy default stream.
#pragma once

#include <chrono>
#include <optional>

namespace gossipcc {

struct CallOptions {
  // When the caller issued the operation, if earlier (a future time counts as now): the deadline
  // counts the caller's wait, and with nothing left the operation fails at once naming `waited_for`.
  std::optional<std::chrono::steady_clock::time_point> issued;
  const char* waited_for = nullptr;  // what it was held back for, e.g. "earlier callbacks" (static storage)
  // CUDA buffers: the caller's cudaStream_t (nullptr: the legacy default); the operation sees what
  // was queued there before the call, nothing after. Keep the buffers alive until the Work completes.
  void* cuda_stream = nullptr;
};

}  // namespace gossipcc
