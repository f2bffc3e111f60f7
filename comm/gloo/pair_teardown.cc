#include "comm/gloo/pair_teardown.h"

#include <gloo/context.h>
#include <gloo/transport/pair.h>

#include <exception>
#include <memory>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"

namespace gossipcc {

void DestroyPairs(gloo::Context& context) {
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer != context.rank) context.getPair(peer).reset();
  }
}

void ClosePairsWith(absl::Span<gloo::Context* const> contexts, int peer) {
  for (gloo::Context* context : contexts) {
    if (peer == context->rank) continue;
    auto& pair = context->getPair(peer);
    if (pair) pair->close();
  }
}

namespace {

// Keeps a pair alive for the rest of the process. Used for pairs whose switch to synchronous
// mode failed: Gloo's setSync takes the socket off its event loop before flushing, and when
// the flush fails (a peer that stopped reading past the send timeout, or reset the
// connection) it throws without marking the pair synchronous, so the pair's destructor would
// take the socket off the loop a second time; epoll_ctl fails and Gloo throws from the
// destructor, which aborts the process (Debian's Gloo 2022-05;
// tests/comm:gloo_mesh_test GivesUpFlushingToAPeerThatStoppedReading). The cost: one socket
// and the pair's memory per such failure. Reachable from here, so leak checkers stay quiet.
void KeepForever(std::unique_ptr<gloo::transport::Pair> pair) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static auto* kept = new std::vector<std::unique_ptr<gloo::transport::Pair>>();
  absl::MutexLock lock(&mu);
  kept->push_back(std::move(pair));
}

}  // namespace

void TakePairsOffTheDeviceThread(gloo::Context& context) {
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer == context.rank || !context.getPair(peer)) continue;
    try {
      context.getPair(peer)->setSync(/*sync=*/true, /*busyPoll=*/false);
    } catch (const std::exception&) {
      // The pair had failed (Gloo closed it, which took it off the device thread) or failed
      // flushing (off the thread, but not destructible: see KeepForever). The failure was, or
      // will be, reported by whoever waits on the pair. Buffers bound to it stay destructible:
      // they point at the pair, which lives on.
      KeepForever(std::move(context.getPair(peer)));
    }
  }
}

}  // namespace gossipcc
