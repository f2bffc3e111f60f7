#include "comm/gloo/ring_common.h"

#include <memory>
#include <utility>
#include <vector>

#include "comm/core/errors.h"
#include "comm/gloo/posted_buffers.h"


namespace gossipcc {

void WithRingSlots(const GlooCall& call, size_t bytes, const std::function<void(uint8_t* slots)>& ring) {
  std::shared_ptr<std::vector<uint8_t>>& kept = call.scratch->ring;
  if (!kept || kept->size() < bytes) kept = std::make_shared<std::vector<uint8_t>>(bytes);
  std::shared_ptr<std::vector<uint8_t>> slots = kept;
  try {
    ring(slots->data());
  } catch (...) {
    kept.reset();
    call.retired->Add(std::move(slots));
    throw;
  }
}

void RunOverlappedCheck(const GlooCall& call, int left, int right, const std::function<void()>& send_ahead,
                        const std::function<void(bool left_sent)>& drain) {
  if (call.check == nullptr) return;
  // The left neighbour sends its first messages here only once this rank's header is in, and
  // the right neighbour's first reduction waits for this rank's first messages: both go before
  // the headers that only the verdict needs (it has milliseconds of slack before anything is
  // written).
  call.check->Begin(left);
  if (call.check->PeerAgrees(right)) send_ahead();
  call.check->SendRemainingHeaders();
  const bool left_sent = call.check->PeerAgrees(left);
  try {
    call.check->Finish();
  } catch (const MismatchError&) {
    drain(left_sent);
    throw;
  }
}

}  // namespace gossipcc
