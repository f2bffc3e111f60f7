// How much of one point-to-point payload has moved while the operation is still in flight.
//
// A consumer that works on a message piece by piece (gossip mixes each part of a large
// message as it lands, instead of all of it after the last byte) attaches one to a P2POp
// (P2POp::progress) and reads it from its own thread while the transport advances it.
// Progress is a prefix of the payload in bytes:
//   receive: [0, bytes()) has landed in the op's buffer and will not be written again;
//   send:    the transport has finished reading [0, bytes()) of the message: with a send
//            from the caller's own memory, that part may be changed.
// It only grows, and stops when the operation ends (ended()), which every operation that
// p2p() returned a Work for does: complete (bytes() is then the whole payload), failed or
// mismatched (anything less, possibly 0). A p2p() call that throws leaves it as it was. The
// operation's Work is still what says whether it succeeded.
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
