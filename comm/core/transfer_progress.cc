#include "comm/core/transfer_progress.h"

#include <algorithm>

namespace gossipcc {

size_t TransferProgress::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

bool TransferProgress::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

size_t TransferProgress::WaitFor(size_t at_least) const {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_ || bytes_ >= at_least; };
  mu_.Await(absl::Condition(&reached));
  return bytes_;
}

void TransferProgress::Advance(size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (!ended_) bytes_ = std::max(bytes_, bytes);
}

void TransferProgress::End() {
  absl::MutexLock lock(&mu_);
  ended_ = true;
}

}  // namespace gossipcc
