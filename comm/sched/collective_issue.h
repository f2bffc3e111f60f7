// How a plain collective is issued beside an OpLane (the c10d backend's rule): in the group's
// program order and within one group timeout of the call (docs/reliability.md, "Timeouts"). On the
// way it may wait for earlier collectives' callbacks (order_nested_collectives) and for the
// group's algorithm tasks; each wait, and the communicator's own deadline (CallOptions::issued),
// ends at the call's deadline with a TimeoutError naming what it waited for. A collective is
// always issued, even one that timed out waiting: the communicator then fails it and poisons
// itself, so this rank never pairs its next collective with the peers' copy of a skipped one.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/core/call_options.h"
#include "comm/core/work.h"
#include "comm/sched/callback_executor.h"
#include "comm/sched/op_lane.h"

namespace gossipcc {

struct CollectiveIssue {
  std::string description;  // e.g. "gossipcc allreduce on rank 0"
  std::chrono::steady_clock::time_point called;  // the c10d call
  std::chrono::milliseconds timeout;             // the group's
  void* stream = nullptr;  // the caller's current CUDA stream for the collective (null: CPU)
  // Not null: first wait for earlier collectives' callbacks (order_nested_collectives).
  CallbackExecutor* ordering = nullptr;
};

// Issues `issue` as above, handing it the CallOptions to pass to the communicator (the c10d
// call's time, what it waited for, the caller's stream); its Work fails at the call's deadline
// at the latest.
using IssueFn = std::function<std::shared_ptr<Work>(const CallOptions&)>;
std::shared_ptr<Work> IssueCollective(const CollectiveIssue& call, OpLane& lane, IssueFn issue);

}  // namespace gossipcc
