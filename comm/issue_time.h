// When a collective was issued, for callers that queue a call themselves before it reaches the
// Communicator: gossipcc's per-call issue time (set like ScopedCudaStream, cuda_stream.h).
//
// A collective's deadline is CommunicatorOptions::timeout after its issue time. By default that
// is the moment the Communicator's call is made. A caller that held the call back first (the c10d
// backend: its wait for the completion callbacks of earlier collectives, its queue behind its own
// algorithm tasks) sets the time its own call began with a ScopedIssueTime around the
// Communicator call, so that the time it held the call counts against the same timeout: the
// collective gets only what is left (its signature check and data exchange included), and one
// with nothing left fails at once when its turn comes, with a TimeoutError that names
// `waited_for`, as any timeout does (it poisons the communicator, so every rank's collectives
// stay in step). Only the issue of collectives reads it; point-to-point operations do not.
#pragma once

#include <chrono>

namespace gossipcc {

struct IssueTime {
  std::chrono::steady_clock::time_point issued;
  // What the caller held the call back for, e.g. "earlier callbacks": a string with static
  // storage (read only when the collective fails; nothing is copied per call).
  const char* waited_for;
};

// Sets the calling thread's issue time for the guard's lifetime. `issued` must not be in the
// future. Guards nest (the innermost applies).
class ScopedIssueTime {
 public:
  ScopedIssueTime(std::chrono::steady_clock::time_point issued, const char* waited_for);
  ~ScopedIssueTime();
  ScopedIssueTime(const ScopedIssueTime&) = delete;
  ScopedIssueTime& operator=(const ScopedIssueTime&) = delete;

 private:
  IssueTime time_;
  const IssueTime* previous_;
};

// The calling thread's issue time; nullptr where no guard is set (a collective issued now).
const IssueTime* CurrentIssueTime();

// What is left of `deadline`, for one Gloo wait: at least 1 ms (Gloo reads 0 as its default
// timeout), so a wait that starts past the deadline fails at once.
inline std::chrono::milliseconds TimeLeft(std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left > std::chrono::milliseconds(1) ? left : std::chrono::milliseconds(1);
}

}  // namespace gossipcc
