// How the c10d backend issues a plain collective (ProcessGroupGossipcc's broadcast, all_reduce,
// ...) on its communicator: in the group's program order, and within one group timeout of the
// c10d call, whatever the collective waits for on the way. Torch-free.
//
// The call's deadline is the timeout after the call (`called`). On the way to the communicator
// a collective may wait for
//  - the completion callbacks of earlier collectives, with order_nested_collectives on and the
//    caller outside them (CallbackExecutor::WaitForEarlierTasks), at most until the deadline;
//  - the group's algorithm tasks queued ahead of it (OpLane::Issue, which fails it at the
//    deadline while it still queues there);
// and the communicator counts its deadline from the call too (comm/issue_time.h), so that its
// signature check and data exchange get only what is left. Each wait that reaches the deadline
// fails the collective with a TimeoutError that names what it waited for.
//
// A collective is always issued to the communicator, even one whose ordering wait timed out:
// the communicator then fails it at once (nothing is left) and, as with any timeout, poisons
// itself, so this rank cannot go on with its next collective paired with the peers' copy of
// the one it would otherwise have skipped (silently wrong data without the signature check).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/work.h"
#include "torch_backend/callback_executor.h"
#include "torch_backend/op_lane.h"

namespace gossipcc {
namespace torch_backend {

struct CollectiveIssue {
  std::string description;  // e.g. "gossipcc allreduce on rank 0"
  std::chrono::steady_clock::time_point called;  // the c10d call
  std::chrono::milliseconds timeout;             // the group's
  void* stream = nullptr;  // the caller's current CUDA stream for the collective (null: CPU)
  // Not null: wait for the completion callbacks of earlier collectives first (order_nested_
  // collectives on, and the calling thread not one of those callbacks).
  CallbackExecutor* ordering = nullptr;
};

// Issues `issue` (a call on the communicator) as described above; returns the collective's
// Work, which fails at the call's deadline at the latest.
std::shared_ptr<Work> IssueCollective(const CollectiveIssue& call, OpLane& lane,
                                      std::function<std::shared_ptr<Work>()> issue);

}  // namespace torch_backend
}  // namespace gossipcc
