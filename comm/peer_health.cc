#include "comm/peer_health.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace {

// Set when the process starts exiting. A Python job usually exits without destroying its
// process group, so its communicator's heartbeat thread is still running while exit() runs
// static destructors; from then on the thread must not touch the store (or anything else).
std::atomic<bool> g_process_exiting{false};

void StopHeartbeatsAtExit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { g_process_exiting.store(true); }); });
}

}  // namespace

struct PeerHealth::Finding {
  std::vector<int> silent;  // heartbeat did not advance (or never appeared)
  std::vector<int> down;    // shut down its communicator
  std::string store_error;  // the store could not be read
  // Neither this rank's own heartbeat nor any peer's advanced enough (every thread starved,
  // or the store stalled): a peer's silence is no evidence then, and `silent` stays empty.
  bool own_heartbeat_stalled = false;
  uint64_t own_beats_in_window = 0;
};

PeerHealth::PeerHealth(std::shared_ptr<Store> store, int rank, int size, const CommunicatorOptions& options)
    : rank_(rank), size_(size) {
  const auto configured = options.heartbeat_interval;
  if (configured.count() < 0 || size_ == 1) return;
  interval_ = configured.count() > 0
                  ? configured
                  : std::clamp(options.timeout / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  store_ = std::make_shared<PrefixStore>("health", std::move(store));
}

PeerHealth::~PeerHealth() { Stop(); }

std::string PeerHealth::Key(int rank) const { return absl::StrCat("heartbeat/", rank); }

void PeerHealth::Start() {
  if (!store_) return;
  StopHeartbeatsAtExit();
  Beat();
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
      if (g_process_exiting.load()) return;
      lock.unlock();
      Beat();
      lock.lock();
    }
  });
}

void PeerHealth::Beat() {
  std::string error = SetHealth(absl::StrCat(beats_++));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error.empty()) ++beats_written_;
    error_ = std::move(error);
  }
  cv_.notify_all();  // Check counts this rank's beats (the thread's own wait ignores it)
}

std::string PeerHealth::SetHealth(const std::string& value) {
  try {
    store_->set(Key(rank_), std::vector<char>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void PeerHealth::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (!g_process_exiting.load()) SetHealth("down");
}

// Returns how many heartbeats this rank wrote after `written_before`: `beats` of them, or
// fewer when kOwnBeatsCap intervals passed first.
uint64_t PeerHealth::AwaitOwnBeats(uint64_t written_before, uint64_t beats) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, kOwnBeatsCap * interval_, [&] { return beats_written_ >= written_before + beats; });
  return beats_written_ - written_before;
}

PeerHealth::Finding PeerHealth::Check() {
  Finding health;
  if (!store_) return health;
  auto read_all = [&](std::map<int, std::string>* out) {
    for (int r = 0; r < size_ && health.store_error.empty(); ++r) {
      if (r == rank_) continue;
      try {
        std::vector<char> v = store_->get(Key(r), interval_);
        (*out)[r] = std::string(v.begin(), v.end());
      } catch (const TimeoutError&) {
        (*out)[r] = "";  // never wrote a heartbeat
      } catch (const std::exception& e) {
        health.store_error = e.what();
      }
    }
  };
  std::map<int, std::string> first, second;
  read_all(&first);
  uint64_t written_before;  // after the first read, so that the window's beats all follow it
  {
    std::lock_guard<std::mutex> lock(mu_);
    written_before = beats_written_;
  }
  health.own_beats_in_window = AwaitOwnBeats(written_before, kWindowBeats);
  read_all(&second);
  if (!health.store_error.empty()) return health;
  // One pass: each peer is down, silent (no heartbeat, or the same one twice) or advanced.
  std::vector<int> silent;
  bool any_peer_advanced = false;
  for (const auto& [r, value] : second) {
    if (value == "down") {
      health.down.push_back(r);
    } else if (value.empty() || value == first.at(r)) {
      silent.push_back(r);
    } else {
      any_peer_advanced = true;
    }
  }
  health.own_heartbeat_stalled = health.own_beats_in_window < kMinOwnBeats && !any_peer_advanced;
  if (!health.own_heartbeat_stalled) health.silent = std::move(silent);
  return health;
}

std::string PeerHealth::Report() {
  std::lock_guard<std::mutex> lock(report_mu_);
  if (report_done_) return report_;
  report_done_ = true;
  if (!store_) return report_;
  std::string own_error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    own_error = error_;
  }
  if (!own_error.empty()) {
    // E.g. a write-once store (WrapGlooStore): peers' heartbeats would look frozen too.
    report_ = absl::StrCat(" [peer check on rank ", rank_, " unavailable: this rank's heartbeat cannot be written: ",
                           own_error, "]");
    return report_;
  }
  const Finding h = Check();
  auto ranks = [](const std::vector<int>& v) {
    return absl::StrCat(v.size() == 1 ? "rank " : "ranks ", absl::StrJoin(v, ", "));
  };
  std::vector<std::string> parts;
  if (!h.store_error.empty()) {
    parts.push_back(absl::StrCat("store unreachable (", h.store_error, ")"));
  } else {
    if (h.own_heartbeat_stalled) {
      parts.push_back(absl::StrCat("this rank's own heartbeat advanced only ", h.own_beats_in_window, " times (",
                                   kMinOwnBeats, " needed) in ", (kOwnBeatsCap * interval_).count(),
                                   " ms and no peer's advanced (an overloaded machine or a stalled store), so a "
                                   "peer's silent heartbeat is no evidence against it"));
    }
    if (!h.silent.empty()) {
      parts.push_back(absl::StrCat(ranks(h.silent), h.silent.size() == 1 ? " is" : " are",
                                   " not responding (no heartbeat for ", (3 * interval_).count(),
                                   " ms or more, while other heartbeats kept going: killed, stopped or hung)"));
    }
    if (!h.down.empty()) {
      parts.push_back(absl::StrCat(ranks(h.down), h.down.size() == 1 ? " has shut down its communicator"
                                                                     : " have shut down their communicators"));
    }
    if (parts.empty()) parts.push_back("every peer's heartbeat is advancing (peers alive; a slow peer or ranks out of step?)");
  }
  report_ = absl::StrCat(" [peer check on rank ", rank_, ": ", absl::StrJoin(parts, "; "), "]");
  return report_;
}

std::exception_ptr PeerHealth::Annotate(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const AbortedError&) {
    return error;
  } catch (const TimeoutError& e) {
    return std::make_exception_ptr(TimeoutError(e.what() + Report()));
  } catch (const PeerError& e) {
    return std::make_exception_ptr(PeerError(e.what() + Report()));
  } catch (const CommError& e) {
    return std::make_exception_ptr(CommError(e.what() + Report()));
  } catch (...) {
    return error;
  }
}

std::vector<int> PeerHealth::UnresponsivePeers() {
  Finding h = Check();
  std::vector<int> out = h.silent;
  out.insert(out.end(), h.down.begin(), h.down.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace gossipcc
