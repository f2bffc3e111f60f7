#include "comm/p2p/turns.h"

namespace gossipcc {

uint64_t ReceiveTurns::Draw(const Key& key) {
  absl::MutexLock lock(&mu_);
  return turns_[key].next++;
}

void ReceiveTurns::Wait(const Key& key, uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto mine = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return turns_.at(key).serving == ticket; };
  mu_.Await(absl::Condition(&mine));
}

void ReceiveTurns::Finish(const Key& key, uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = turns_.find(key);
  Turns& t = it->second;
  t.finished.insert(ticket);
  while (!t.finished.empty() && *t.finished.begin() == t.serving) {
    t.finished.erase(t.finished.begin());
    ++t.serving;
  }
  if (t.serving == t.next) turns_.erase(it);  // idle: keeps the map small
}

ReceiveTurn::ReceiveTurn(ReceiveTurns& turns, bool has_ticket, int peer, uint32_t tag, uint64_t ticket)
    : turns_(turns), key_(peer, tag), ticket_(ticket), held_(has_ticket) {}

ReceiveTurn::~ReceiveTurn() {
  if (held_) turns_.Finish(key_, ticket_);
}

void ReceiveTurn::Draw(int peer, uint32_t tag) {
  if (held_) return;
  key_ = {peer, tag};
  ticket_ = turns_.Draw(key_);
  held_ = true;
}

void ReceiveTurn::Wait() { turns_.Wait(key_, ticket_); }

}  // namespace gossipcc
