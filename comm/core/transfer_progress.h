// How much of one point-to-point payload has moved while the operation is in flight (set as
// P2POp::progress): a prefix in bytes, for a receive landed and final, for a send read (and so
// free to change). It only grows and always ends (ended()) once p2p() returned a Work: at the
// whole payload on success, short of it on failure. The Work still says whether it succeeded.
#pragma once

#include <cstddef>

#include "absl/synchronization/mutex.h"

namespace gossipcc {

class TransferProgress {
 public:
  TransferProgress() = default;
  TransferProgress(const TransferProgress&) = delete;
  TransferProgress& operator=(const TransferProgress&) = delete;

  size_t bytes() const;
  bool ended() const;
  // Blocks until bytes() >= at_least or the operation ended; returns bytes().
  size_t WaitFor(size_t at_least) const;

  // The transport's side: a longer prefix moved (smaller values are ignored), and the end.
  void Advance(size_t bytes);
  void End();

 private:
  mutable absl::Mutex mu_;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gossipcc
