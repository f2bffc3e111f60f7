// ReceiveTurns: on each (peer, tag), receives take their payloads one at a time, in the order
// their headers were matched. Gloo matches headers in posting order, but each receive posts
// its payload's segments from its own thread: without turns, two receives outstanding on one
// (peer, tag) could take each other's segments (Gloo aborts on the length mismatch) or
// payloads. A named receive draws its ticket when posted (the order its header is matched
// in); a receive from any source draws one when its header arrives. Every ticket is given back
// on every path (ReceiveTurn's destructor), so a failed receive never blocks the next.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gossipcc {

class ReceiveTurns {
 public:
  using Key = std::pair<int, uint32_t>;  // (peer, tag)

  // The next ticket on `key`; a receive holding it must give it back (Finish).
  uint64_t Draw(const Key& key);
  // Returns when every ticket drawn on `key` before `ticket` has been given back.
  void Wait(const Key& key, uint64_t ticket);
  void Finish(const Key& key, uint64_t ticket);

 private:
  struct Turns {
    uint64_t next = 0;            // the ticket the next receive draws
    uint64_t serving = 0;         // the ticket whose receive may take its payload
    std::set<uint64_t> finished;  // given back out of order, ahead of `serving`
  };
  absl::Mutex mu_;
  std::map<Key, Turns> turns_ ABSL_GUARDED_BY(mu_);  // idle keys are dropped
};

// One receive's ticket, given back when it goes out of scope.
class ReceiveTurn {
 public:
  // Holds `ticket` on (peer, tag) when `has_ticket` (a named receive), else none yet.
  ReceiveTurn(ReceiveTurns& turns, bool has_ticket, int peer, uint32_t tag, uint64_t ticket);
  ReceiveTurn(const ReceiveTurn&) = delete;
  ReceiveTurn& operator=(const ReceiveTurn&) = delete;
  ~ReceiveTurn();

  // A receive from any source, once its header named the sender; no-op if one is held.
  void Draw(int peer, uint32_t tag);
  // Returns when every earlier receive on (peer, tag) has taken its payload (or failed).
  void Wait();

 private:
  ReceiveTurns& turns_;
  ReceiveTurns::Key key_;
  uint64_t ticket_ = 0;
  bool held_ = false;
};

}  // namespace gossipcc
