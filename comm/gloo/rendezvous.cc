#include "comm/gloo/rendezvous.h"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/core/errors.h"
#include "comm/core/listen_address.h"
#include "comm/gloo/gloo_error.h"

namespace gossipcc {

namespace {

// Presents a gossipcc Store to Gloo's rendezvous (connectFullMesh).
class StoreToGloo : public gloo::rendezvous::Store {
 public:
  StoreToGloo(std::shared_ptr<gossipcc::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_->set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_->get(key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  // Gloo passes its context's timeout (the mesh's operation timeout); a peer's key may take the
  // whole rendezvous time to appear (a rank that starts late), which ConnectWithDeadline bounds.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, std::max(timeout, timeout_));
  }

 private:
  std::shared_ptr<gossipcc::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

namespace {

std::shared_ptr<gloo::transport::Device> CreateDevice(int rank, const ListenAddress& where) {
  gloo::transport::tcp::attr attr;
  if (!where.interface.empty()) {
    attr.iface = where.interface;
  } else {
    attr.hostname = where.hostname;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw InvalidArgumentError(absl::StrCat("rank ", rank, ": cannot listen on ", where.description, ": ", e.what()));
  }
}

// Runs `work` (which must not throw) on a detached thread and waits at most `bound` for its
// result: nullopt if it has not returned by then. The thread keeps what `work` captured and ends
// on its own whenever `work` returns; its result is then dropped.
template <typename T>
std::optional<T> RunDetachedFor(std::function<T()> work, std::chrono::milliseconds bound) {
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<T> result;
  };
  auto slot = std::make_shared<Slot>();
  std::thread([work = std::move(work), slot] {
    T result = work();
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->result = std::move(result);
    slot->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(slot->mu);
  slot->cv.wait_for(lock, bound, [&] { return slot->result.has_value(); });
  return slot->result;
}

// What the store says about a rendezvous that missed its deadline.
struct RendezvousDiagnosis {
  std::string store_error;           // the store's error if it is unreachable, else empty
  std::vector<std::string> missing;  // the ranks that never published an address
};

// Asks the store whether it is still there and which peers never published their address.
// Gloo's key for rank r is "<r>" in Debian's Gloo (tcp::Context::createAndConnectAllPairs) and
// "rank_<r>" in the newer Gloo inside torch's libtorch_cpu, whose symbols the Python extension
// may bind to instead: either counts.
RendezvousDiagnosis DiagnoseRendezvous(Store& store, int rank, int size) {
  RendezvousDiagnosis d;
  try {
    store.set(absl::StrCat("deadline_probe_", rank), {1});
  } catch (const std::exception& e) {
    d.store_error = e.what();
    return d;
  }
  auto is_set = [&](const std::string& key) {
    try {
      store.wait({key}, std::chrono::milliseconds(1));
      return true;
    } catch (const std::exception&) {
      return false;
    }
  };
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (!is_set(std::to_string(r)) && !is_set(absl::StrCat("rank_", r))) d.missing.push_back(std::to_string(r));
  }
  return d;
}

// The least time the probes above are given after a missed deadline, whatever the timeout: a
// store on another host answers within a few round trips.
constexpr std::chrono::milliseconds kMinProbeTime{250};

// Gloo's connect waits 5 x the timeout for a pair to connect (its "longer timeout when waiting
// for initial connect"), so a peer at an unreachable address, or one that died after publishing
// its address, would hold every rank for 5 timeouts. The connect runs on a thread of its own
// and this rank gives up at the deadline (timeout + slack), then spends at most
// max(slack, kMinProbeTime) finding out why; the thread (holding what it uses) ends on its own
// when Gloo gives up.
// Gloo's connectFullMesh takes the store by reference (bookworm's and trixie's Gloo) or by
// shared_ptr (later Gloo, Debian forky's): whichever this Gloo declares.
template <typename Context, typename Device>
auto ConnectFullMesh(Context& context, const std::shared_ptr<StoreToGloo>& store, Device& device, int)
    -> decltype(context.connectFullMesh(std::shared_ptr<gloo::rendezvous::Store>(store), device), void()) {
  context.connectFullMesh(std::shared_ptr<gloo::rendezvous::Store>(store), device);
}
template <typename Context, typename Device>
void ConnectFullMesh(Context& context, const std::shared_ptr<StoreToGloo>& store, Device& device, long) {
  context.connectFullMesh(*store, device);
}

void ConnectWithDeadline(const std::shared_ptr<gloo::rendezvous::Context>& context,
                         std::shared_ptr<StoreToGloo> store, const std::shared_ptr<Store>& raw_store,
                         std::shared_ptr<gloo::transport::Device> device, std::chrono::milliseconds timeout, int rank,
                         int size) {
  // The store waits inside are bounded by `timeout` already; a little slack lets their own
  // (more specific) error arrive first.
  const auto slack = std::min(timeout / 10, std::chrono::milliseconds(2000));
  const std::optional<std::exception_ptr> outcome = RunDetachedFor<std::exception_ptr>(
      [context, store, device]() mutable -> std::exception_ptr {  // (Gloo takes the device by reference)
        try {
          ConnectFullMesh(*context, store, device, 0);
          return nullptr;
        } catch (...) {
          return std::current_exception();
        }
      },
      timeout + slack);
  if (outcome.has_value()) {
    if (*outcome) std::rethrow_exception(*outcome);
    return;
  }
  // Why, from the store. The probes run on a thread of their own: the store's client may
  // serialise its calls (torch's TCPStore does), and Gloo's thread above may still be blocked in
  // one, so they could wait behind it well past the deadline. Without an answer in time, the
  // error says so instead of naming ranks.
  const auto probe_time = std::max(slack, kMinProbeTime);
  const std::optional<RendezvousDiagnosis> diagnosis = RunDetachedFor<RendezvousDiagnosis>(
      [raw_store, rank, size] { return DiagnoseRendezvous(*raw_store, rank, size); }, probe_time);
  const std::string what =
      absl::StrCat("rank ", rank, " of ", size, ": rendezvous did not complete within ", timeout.count(), " ms");
  if (!diagnosis.has_value()) {
    throw TimeoutError(absl::StrCat(what, " (did every rank start? the rendezvous store did not answer a probe within ",
                                    probe_time.count(), " ms more, so which ranks are missing is not known)"));
  }
  if (!diagnosis->store_error.empty()) {
    throw TimeoutError(absl::StrCat(what, ", and the rendezvous store is now unreachable (its host, rank 0 for env://, ",
                                    "may have failed and exited): ", diagnosis->store_error));
  }
  throw TimeoutError(absl::StrCat(
      what, ": ",
      diagnosis->missing.empty()
          ? "every rank published its address, but a connection to or from a peer was not established (a peer "
            "unreachable at the address it published, behind a firewall, or gone)"
          : absl::StrCat("rank(s) ", absl::StrJoin(diagnosis->missing, ", "),
                         " never published an address (did every rank start?)")));
}

std::string HostName() {
  char name[256] = {0};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("?");
}

// When a connection failed: the peers that listen on a loopback address on another host (as
// they published at creation), which no other host can reach, and what to set instead.
std::string LoopbackHint(Store& store, int rank, int size, const std::string& error) {
  std::vector<std::string> loopback_peers;
  const std::string me = HostName();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    try {
      const std::vector<char> v = store.get(absl::StrCat("listen_", r), std::chrono::milliseconds(100));
      const std::string text(v.begin(), v.end());
      if (absl::StartsWith(text, "loopback ") && text.substr(9) != me) {
        loopback_peers.push_back(absl::StrCat(r, " (host ", text.substr(9), ")"));
      }
    } catch (const std::exception&) {
    }
  }
  if (loopback_peers.empty() && !MentionsLoopbackAddress(error)) return "";
  return absl::StrCat(" (", loopback_peers.empty() ? "a peer" : absl::StrCat("rank(s) ", absl::StrJoin(loopback_peers, ", ")),
                      " listen(s) on a loopback address, which only its own host can reach: on a job across hosts "
                      "set GOSSIPCC_SOCKET_IFNAME or GLOO_SOCKET_IFNAME to the network interface to use, or make each "
                      "host's name resolve to its routable address)");
}

}  // namespace

void IgnoreSigpipeUnlessHandled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

std::shared_ptr<gloo::Context> ConnectGlooMesh(std::shared_ptr<Store> store, int rank, int size,
                                               const GlooMeshOptions& options,
                                               std::shared_ptr<gloo::transport::Device> device) {
  IgnoreSigpipeUnlessHandled();
  if (!device) {
    const ListenAddress where = ChooseListenAddress(options.interface, options.hostname);
    device = CreateDevice(rank, where);
    // Whether this rank listens on a loopback address, and on which host: a peer that fails
    // to connect reads it to say why (LoopbackHint).
    try {
      const std::string text = absl::StrCat(where.loopback ? "loopback " : "routable ", HostName());
      store->set(absl::StrCat("listen_", rank), std::vector<char>(text.begin(), text.end()));
    } catch (const std::exception&) {
      // Only a hint: the rendezvous below reports a store that does not work.
    }
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(options.timeout);
  const auto now = std::chrono::steady_clock::now();
  const auto left = options.connect_deadline
                        ? std::chrono::duration_cast<std::chrono::milliseconds>(*options.connect_deadline - now)
                        : options.timeout;
  if (left.count() <= 0) {
    throw TimeoutError(absl::StrCat("rank ", rank, " of ", size, ": rendezvous did not complete within its time: ",
                                    "none was left for this mesh"));
  }
  auto gloo_store = std::make_shared<StoreToGloo>(store, left);
  try {
    ConnectWithDeadline(context, gloo_store, store, device, left, rank, size);
  } catch (const TimeoutError& e) {
    if (absl::StrContains(e.what(), "rendezvous did not complete")) throw;
    throw TimeoutError(absl::StrCat("rank ", rank, " of ", size, ": rendezvous did not complete within ",
                                    options.timeout.count(), " ms (did every rank start?): ", e.what()));
  } catch (const std::exception& e) {
    const std::string hint = LoopbackHint(*store, rank, size, e.what());
    try {
      RethrowGlooError(absl::StrCat("rank ", rank, " of ", size, ": connecting the mesh"), e);
    } catch (const PeerError& p) {
      throw PeerError(p.what() + hint);
    } catch (const TimeoutError& t) {
      throw TimeoutError(t.what() + hint);
    }
  }
  return context;
}

}  // namespace gossipcc
