#include "comm/gloo_util.h"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/buffer.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/unbound_buffer.h>

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

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "comm/errors.h"
#include "comm/listen_address.h"

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

void RetiredBuffers::Add(std::shared_ptr<void> owned) {
  absl::MutexLock lock(&mu_);
  owned_.push_back(std::move(owned));
}

std::vector<std::shared_ptr<void>> RetiredBuffers::TakeAll() {
  absl::MutexLock lock(&mu_);
  return std::move(owned_);
}

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
// tests/comm:gloo_util_test GivesUpFlushingToAPeerThatStoppedReading). The cost: one socket
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

PostedBuffers::PostedBuffers(gloo::Context& context, RetiredBuffers& retired)
    : context_(context), retired_(retired), exceptions_at_start_(std::uncaught_exceptions()) {}

PostedBuffers::~PostedBuffers() {
  if (std::uncaught_exceptions() > exceptions_at_start_) {
    for (auto& owned : owned_) retired_.Add(std::move(owned));
  }
}

gloo::transport::UnboundBuffer& PostedBuffers::Create(void* data, size_t bytes) {
  std::shared_ptr<gloo::transport::UnboundBuffer> ub = context_.createUnboundBuffer(data, bytes);
  gloo::transport::UnboundBuffer& ref = *ub;
  owned_.push_back(std::move(ub));
  return ref;
}

uint8_t* PostedBuffers::Allocate(size_t bytes) {
  // Not zeroed: every user receives into it before reading, and zeroing a ring's scratch
  // would cost a pass over memory per call.
  std::shared_ptr<uint8_t> memory(new uint8_t[bytes], std::default_delete<uint8_t[]>());
  uint8_t* data = memory.get();
  owned_.push_back(std::move(memory));
  return data;
}

void RethrowGlooError(const std::string& context, const std::exception& e) {
  const std::string what = e.what();
  if (absl::StrContains(what, "Timed out") || absl::StrContains(what, "timeout") ||
      absl::StrContains(what, "Timeout")) {
    throw TimeoutError(absl::StrCat(context, ": timed out: ", what));
  }
  if (dynamic_cast<const CommError*>(&e) != nullptr) {
    throw CommError(absl::StrCat(context, ": ", what));
  }
  throw PeerError(absl::StrCat(context, ": transport error: ", what));
}

namespace {

// A TCP bound buffer's completion counts, lock, condition variables and error, and its pair's
// failure, all protected in Gloo: read here through pointers to members named in a derived
// class (which C++ permits for protected members; nothing of these types is constructed) so
// that WaitBoundBuffer waits on them as Buffer::waitRecv / waitSend do, under the same lock.
// Debian's Gloo (bookworm's 2022-05 and trixie's 2023-12 snapshots have the same tcp/buffer.h;
// tcp/pair.h needs third_party:gloo_missing_headers): a Gloo that renamed them fails to compile
// here.
namespace tcp = gloo::transport::tcp;
struct TcpBufferState : tcp::Buffer {
  static std::mutex& Mutex(tcp::Buffer& b) { return b.*(&TcpBufferState::m_); }
  static std::condition_variable& Cv(tcp::Buffer& b, BoundBufferWait w) {
    return w == BoundBufferWait::kRecv ? b.*(&TcpBufferState::recvCv_) : b.*(&TcpBufferState::sendCv_);
  }
  // The completion has come, the pair has failed, or (a send) nothing is pending: Gloo's own
  // wait then returns, throws or enforces at once.
  static bool Ready(tcp::Buffer& b, BoundBufferWait w) {
    if (b.*(&TcpBufferState::ex_) != nullptr) return true;
    if (w == BoundBufferWait::kRecv) return b.*(&TcpBufferState::recvCompletions_) > 0;
    return b.*(&TcpBufferState::sendCompletions_) > 0 || (b.*(&TcpBufferState::sendPending_)).load() == 0;
  }
  static tcp::Pair& PairOf(tcp::Buffer& b) { return *(b.*(&TcpBufferState::pair_)); }
};
struct TcpPairState : tcp::Pair {
  static bool IsSync(tcp::Pair& p) { return (p.*(&TcpPairState::isSync))(); }
  static std::exception_ptr Fail(tcp::Pair& p, const std::string& message) {
    return (p.*(&TcpPairState::signalExceptionExternal))(message);
  }
};

}  // namespace

void WaitBoundBuffer(gloo::transport::Buffer& buffer, BoundBufferWait which,
                     std::chrono::steady_clock::time_point deadline, const std::string& what) {
  auto* b = dynamic_cast<tcp::Buffer*>(&buffer);
  if (b != nullptr && !TcpPairState::IsSync(TcpBufferState::PairOf(*b))) {
    std::unique_lock<std::mutex> lock(TcpBufferState::Mutex(*b));
    if (!TcpBufferState::Cv(*b, which).wait_until(lock, deadline, [&] { return TcpBufferState::Ready(*b, which); })) {
      lock.unlock();  // as Gloo does: the pair's lock is taken without the buffer's
      const char* kind = which == BoundBufferWait::kRecv ? "Read" : "Write";
      std::rethrow_exception(TcpPairState::Fail(
          TcpBufferState::PairOf(*b), absl::StrCat(kind, " timeout at the operation's deadline: ", what)));
    }
  }
  if (which == BoundBufferWait::kRecv) {
    buffer.waitRecv();  // at once (or the pair's error)
  } else {
    buffer.waitSend();
  }
}

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
