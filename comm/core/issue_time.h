// A collective's issue time, for callers that hold a call back before the Communicator (the
// c10d backend): set with a ScopedIssueTime around the call, the deadline (timeout after the
// issue) then counts that wait too, and a collective with nothing left fails at once naming
// `waited_for`. Read by the issue of collectives only.
#pragma once

#include <chrono>

namespace gossipcc {

struct IssueTime {
  std::chrono::steady_clock::time_point issued;
  // What the call was held back for, e.g. "earlier callbacks" (static storage).
  const char* waited_for;
};

// The thread's issue time while alive (not in the future); nests, the innermost applies.
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

// What is left of `deadline` for one Gloo wait, at least 1 ms (Gloo reads 0 as its default).
inline std::chrono::milliseconds TimeLeft(std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left > std::chrono::milliseconds(1) ? left : std::chrono::milliseconds(1);
}

}  // namespace gossipcc
