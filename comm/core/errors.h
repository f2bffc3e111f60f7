// Exceptions raised at the comm layer's boundary. Every message names the rank, the
// operation and, where there is one, the peer and the sizes involved.
#pragma once

#include <stdexcept>
#include <string>

namespace gossipcc {

// Base of every error the comm layer raises.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

// The caller passed something invalid (bad peer, null data, unsupported dtype/op/device).
// Raised synchronously, before anything is sent.
class InvalidArgumentError : public CommError {
 public:
  using CommError::CommError;
};

// Ranks disagree about an operation (element counts, dtypes, ops, roots, kinds).
// Detected before any payload moves, on every rank.
class MismatchError : public CommError {
 public:
  using CommError::CommError;
};

// An operation (or a wait on it) did not finish within its timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A peer failed: connection closed or reset, or an I/O error on the link to it.
class PeerError : public CommError {
 public:
  using CommError::CommError;
};

// The communicator was shut down, or an earlier failure left it unusable.
class AbortedError : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace gossipcc
