// PeerHealth: whether the peers are alive, for the message of an error.
//
// Each rank writes a heartbeat counter to the store every interval (a thread of its own) and
// "down" when it shuts down. When an operation fails with a timeout or a transport error,
// Annotate reads every peer's heartbeat twice, kWindowBeats of this rank's own heartbeats
// apart, and appends the finding to the error ("peer check: rank 2 is not responding ...:
// killed, stopped or hung"), so that every survivor names the dead or stalled peer, not merely
// the neighbour it was waiting on. The window is counted in this rank's own heartbeats, not in
// wall time: when the whole machine is starved, or the store stalls, every heartbeat stops at
// once, and a live peer must not be named for it (CommunicatorOptions::heartbeat_interval).
//
// The store is best effort: a store that is gone (its host died) never takes this rank down.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/core/options.h"
#include "comm/core/store.h"

namespace gossipcc {

class PeerHealth {
 public:
  // Keys go under "health/" of `store`. Disabled (no thread, no check, empty reports) with a
  // negative heartbeat_interval or a single rank.
  PeerHealth(std::shared_ptr<Store> store, int rank, int size, const CommunicatorOptions& options);
  ~PeerHealth();  // Stop()
  PeerHealth(const PeerHealth&) = delete;
  PeerHealth& operator=(const PeerHealth&) = delete;

  // Writes the first heartbeat (before Create returns, so that a peer that fails at once finds
  // this rank's key), then starts the thread.
  void Start();
  // Joins the thread and writes "down", so that peers that fail next name this rank as shut
  // down. Idempotent. Writes nothing once the process has begun exiting (the store may be
  // gone with the static destructors).
  void Stop();

  // A timeout, peer or transport error (the same type) with the peer check appended; any other
  // error as it is. One check per communicator: concurrent failures share its report.
  std::exception_ptr Annotate(std::exception_ptr error);

  // Checks now (3-4 heartbeat intervals) and returns the peers not responding or shut down,
  // ascending; empty when disabled.
  std::vector<int> UnresponsivePeers();

 private:
  struct Finding;
  std::string Key(int rank) const;
  void Beat();
  std::string SetHealth(const std::string& value);  // returns the store's error, if any
  uint64_t AwaitOwnBeats(uint64_t written_before, uint64_t beats);
  Finding Check();
  std::string Report();

  // The window: kWindowBeats of this rank's heartbeats (the first may come at once, so >= 3
  // full intervals), at most kOwnBeatsCap intervals. The heartbeats count as working (and a
  // silent peer is named) if this rank beat at least kMinOwnBeats times in the window, or any
  // peer's heartbeat advanced: under sanitizers on a loaded machine a rank's own heartbeats
  // come late (2 of 4 in 6 intervals was seen in CI) while a killed peer's stop for good.
  static constexpr int kWindowBeats = 4;
  static constexpr int kOwnBeatsCap = 6;
  static constexpr int kMinOwnBeats = 2;

  const int rank_;
  const int size_;
  std::chrono::milliseconds interval_{0};
  std::shared_ptr<Store> store_;  // null: disabled
  uint64_t beats_ = 0;            // the heartbeat thread only (and Start before it)
  std::thread thread_;
  std::mutex mu_;  // std::mutex: the thread waits with a timeout
  std::condition_variable cv_;  // stop requests, and every heartbeat written
  uint64_t beats_written_ = 0;  // guarded by mu_: heartbeats the store took
  bool stop_ = false;           // guarded by mu_
  std::string error_;           // guarded by mu_: the last heartbeat's store error
  std::mutex report_mu_;
  bool report_done_ = false;
  std::string report_;
};

}  // namespace gossipcc
