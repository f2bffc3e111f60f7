#include "comm/core/issue_time.h"

namespace gossipcc {
namespace {
thread_local const IssueTime* current_issue_time = nullptr;
}  // namespace

ScopedIssueTime::ScopedIssueTime(std::chrono::steady_clock::time_point issued, const char* waited_for)
    : time_{issued, waited_for}, previous_(current_issue_time) {
  current_issue_time = &time_;
}
ScopedIssueTime::~ScopedIssueTime() { current_issue_time = previous_; }

const IssueTime* CurrentIssueTime() { return current_issue_time; }

}  // namespace gossipcc
