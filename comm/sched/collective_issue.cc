#include "comm/sched/collective_issue.h"

#include <algorithm>
#include <utility>


namespace gossipcc {

std::shared_ptr<Work> IssueCollective(const CollectiveIssue& call, OpLane& lane, IssueFn issue) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = call.called + call.timeout;
  Clock::time_point issued = call.called;
  const char* waited_for = "the process group's algorithm tasks";
  if (call.ordering != nullptr) {
    // Until the deadline at most (`called` was a moment ago); rounded up, so that a wait that
    // times out ends at or past it.
    const auto limit = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (call.ordering->WaitForEarlierTasks(std::max(limit, std::chrono::milliseconds(0)))) {
      waited_for = "the completion callbacks of earlier collectives, then the process group's algorithm tasks";
    } else {
      // Past the deadline: issued all the same, for the communicator to fail at once (nothing
      // is left: the issue time is a whole timeout ago at least) and so poison itself, naming
      // the callbacks. Skipped, it would leave this rank one collective behind its peers.
      issued = std::min(issued, Clock::now() - call.timeout);
      waited_for = "the completion callbacks of earlier collectives, which did not return within the timeout; "
                   "with nested collectives ordered, a collective starts only after them";
    }
  }
  // A CUDA collective follows the caller's current stream (CallOptions::cuda_stream) as it is
  // when the communicator issues it: issued later (queued behind the group's algorithm tasks),
  // it may wait for more of the caller's work, never for less.
  CallOptions options;
  options.issued = issued;
  options.waited_for = waited_for;
  options.cuda_stream = call.stream;
  return lane.Issue(call.description, deadline, [options, issue = std::move(issue)] { return issue(options); });
}

}  // namespace gossipcc
