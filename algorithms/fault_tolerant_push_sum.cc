#include "algorithms/fault_tolerant_push_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "algorithms/push_sum.h"
#include "algorithms/push_sum_ledger.h"
#include "algorithms/push_sum_membership.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace {

// x element `i` of the concatenated buffers, as float64.
class FlatView {
 public:
  explicit FlatView(const std::vector<Buffer>& buffers) : parts_(buffers) {}
  template <typename Fn>  // fn(size_t flat_index, double& value), value written back
  void Update(Fn fn) const {
    size_t k = 0;
    for (const Buffer& b : parts_) {
      if (b.dtype == DType::kFloat64) {
        double* p = static_cast<double*>(b.data);
        for (size_t i = 0; i < b.count; ++i, ++k) fn(k, p[i]);
      } else {
        float* p = static_cast<float*>(b.data);
        for (size_t i = 0; i < b.count; ++i, ++k) {
          double v = p[i];
          fn(k, v);
          p[i] = static_cast<float>(v);
        }
      }
    }
  }
  template <typename Fn>  // fn(size_t flat_index, double value)
  void Read(Fn fn) const {
    size_t k = 0;
    for (const Buffer& b : parts_) {
      for (size_t i = 0; i < b.count; ++i, ++k) {
        fn(k, b.dtype == DType::kFloat64 ? static_cast<const double*>(b.data)[i]
                                         : static_cast<double>(static_cast<const float*>(b.data)[i]));
      }
    }
  }

 private:
  std::vector<Buffer> parts_;
};

size_t CheckBuffers(const std::vector<Buffer>& buffers) {
  size_t count = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (b.device.is_cuda()) {
      throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum: buffer ", i, " is on ", b.device.ToString(),
                                              "; CPU buffers only"));
    }
    if (b.dtype != DType::kFloat32 && b.dtype != DType::kFloat64) {
      throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum: buffer ", i, " is ", DTypeName(b.dtype),
                                              "; float32 or float64 only"));
    }
    if (b.dtype != buffers[0].dtype) {
      throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum: buffer ", i, " is ", DTypeName(b.dtype),
                                              " but buffer 0 is ", DTypeName(buffers[0].dtype)));
    }
    if (b.data == nullptr && b.count > 0) {
      throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum: buffer ", i, " has null data"));
    }
    count += b.count;
  }
  return count;
}

// A failure that a recovery handles: the peer or the link, not the caller.
bool IsPeerFailure(const CommError& e) {
  return dynamic_cast<const MismatchError*>(&e) == nullptr && dynamic_cast<const InvalidArgumentError*>(&e) == nullptr;
}

}  // namespace

FaultTolerantPushSum::FaultTolerantPushSum(std::shared_ptr<Store> store, int rank, int world_size,
                                           FaultTolerantPushSumOptions options)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), options_(std::move(options)) {
  if (!store_) throw InvalidArgumentError("fault_tolerant_push_sum: null store");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgumentError(
        absl::StrCat("fault_tolerant_push_sum: rank ", rank, " is out of range [0, ", world_size, ")"));
  }
  window_ = options_.join_window.count() > 0 ? options_.join_window : 2 * options_.comm.timeout;
  for (int r = 0; r < world_size; ++r) members_.push_back(r);
  CheckGraphFitsSurvivors(options_.graph, world_size);  // before any rendezvous
  Connect();
}

FaultTolerantPushSum::~FaultTolerantPushSum() {
  try {
    Leave();
  } catch (...) {  // a destructor must not throw; the others then see a death
  }
}

void FaultTolerantPushSum::Leave() {
  if (left_) return;
  left_ = true;
  std::exception_ptr error;
  try {
    const std::string step = std::to_string(step_);
    store_->set(LeftKey(rank_), std::vector<char>(step.begin(), step.end()));
  } catch (...) {
    error = std::current_exception();
  }
  comm_.reset();  // after the mark: a peer that sees these connections close finds it
  if (error) std::rethrow_exception(error);
}

void FaultTolerantPushSum::CheckNotLeft(const char* what) const {
  if (left_) {
    throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum ", what, " on rank ", rank_,
                                            ": this rank left the group (Leave) at step ", step_));
  }
}

int FaultTolerantPushSum::GroupRank(int original) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), original);
  return (it != members_.end() && *it == original) ? static_cast<int>(it - members_.begin()) : -1;
}

void FaultTolerantPushSum::Connect() {
  const int m = static_cast<int>(members_.size());
  comm_ = Communicator::Create(std::make_shared<PrefixStore>(absl::StrCat("ftps/", epoch_, "/comm"), store_),
                               GroupRank(rank_), m, options_.comm);
  graph_ = MakePeerGraph(options_.graph, m);
}

bool FaultTolerantPushSum::Step(std::vector<Buffer> buffers) {
  CheckNotLeft("Step");
  const size_t count = CheckBuffers(buffers);
  // After a recovery that agreed on a later step than this rank was in: the others did the
  // rounds of the steps in between without it.
  if (step_ < resume_step_) {
    ++step_;
    return true;
  }
  bool recovered = false;
  while (!Round(buffers, count)) {
    recovered = true;
    Settle(buffers, count);
    // A rank that was behind counts this call's round as done (its mass was reconciled); one
    // at the agreed step still owes it, and does it now with the others' next call.
    if (step_ < resume_step_) break;
  }
  ++step_;
  return !recovered;
}

void FaultTolerantPushSum::Settle(const std::vector<Buffer>& buffers, size_t count) {
  // Rounds without local updates until every member's weight is within settle_tolerance of 1
  // (agreed by an all-reduce of the largest deviation), at most settle_rounds. A failure
  // meanwhile recovers again and settling goes on. Settling rounds are rounds, not steps.
  for (int r = 0; r < options_.settle_rounds; ++r) {
    double deviation = std::abs(weight_ - 1.0);
    if (std::isnan(deviation)) deviation = std::numeric_limits<double>::infinity();
    try {
      comm_->allreduce(CpuBuffer(&deviation, 1), ReduceOp::kMax)->wait();
    } catch (const CommError& e) {
      if (!IsPeerFailure(e)) throw;
      Recover(buffers, count);
      r = -1;  // settling starts over, counted alike on every member
      continue;
    }
    if (deviation <= options_.settle_tolerance) break;
    if (!Round(buffers, count)) r = -1;
  }
}

bool FaultTolerantPushSum::Round(const std::vector<Buffer>& buffers, size_t count) {
  const int me = comm_->rank();
  const PushSumPlan plan = MakePushSumPlan(*graph_, nullptr, me, round_, "fault_tolerant_push_sum");
  const FlatView x(buffers);
  // Message: [round][share * x ...][share * w], all float64.
  const size_t words = count + 2;
  const double share = plan.send_shares.empty() ? 0.0 : plan.send_shares[0];
  std::vector<double> out(words);
  out[0] = static_cast<double>(round_);
  x.Read([&](size_t k, double v) { out[k + 1] = share * v; });
  out[count + 1] = share * weight_;
  std::vector<std::vector<double>> in(plan.in_peers.size(), std::vector<double>(words));
  std::vector<P2POp> ops;
  for (int p : plan.out_peers) ops.push_back(P2POp::Send(CpuBuffer(out.data(), words), p, options_.tag));
  for (size_t j = 0; j < plan.in_peers.size(); ++j) {
    ops.push_back(P2POp::Recv(CpuBuffer(in[j].data(), words), plan.in_peers[j], options_.tag));
  }
  try {
    comm_->p2p(ops)->wait();
  } catch (const CommError& e) {
    if (!IsPeerFailure(e)) throw;
    Recover(buffers, count);
    return false;
  }
  for (size_t j = 0; j < in.size(); ++j) {
    if (in[j][0] != static_cast<double>(round_)) {
      throw MismatchError(absl::StrCat("fault_tolerant_push_sum step ", step_, " (round ", round_, ") on rank ", rank_,
                                       ": the message from rank ", members_[plan.in_peers[j]], " was sent at its round ",
                                       in[j][0], "; every rank must call Step the same number of times"));
    }
  }
  // x <- x - sum of what was sent + sum of what was received, with the flows recorded so that
  // x = x(0) + updates + sum(recv - sent) holds exactly in float64.
  const double sent_total = share * static_cast<double>(plan.out_peers.size());
  x.Update([&](size_t k, double& v) {
    double acc = v - sent_total * v;
    for (const auto& msg : in) acc += msg[k + 1];
    v = acc;
  });
  double w = weight_ - sent_total * weight_;
  for (const auto& msg : in) w += msg[count + 1];
  weight_ = w;
  for (int p : plan.out_peers) ledger_.Sent(members_[p], out.data() + 1, count + 1);
  for (size_t j = 0; j < in.size(); ++j) ledger_.Received(members_[plan.in_peers[j]], in[j].data() + 1, count + 1);
  ++round_;
  return true;
}

void FaultTolerantPushSum::Recover(const std::vector<Buffer>& buffers, size_t count) {
  const int max_attempts = static_cast<int>(members_.size());
  std::vector<int> dropped;  // by this recovery, over its attempts
  for (int attempt = 0;; ++attempt) {
    comm_.reset();  // closes our sockets: the neighbours' steps fail now, not at their timeout
    const std::vector<int> view = AgreeOnMembers(*store_, epoch_, rank_, members_, window_, options_.comm.timeout);
    std::set_difference(members_.begin(), members_.end(), view.begin(), view.end(), std::back_inserter(dropped));
    std::sort(dropped.begin(), dropped.end());
    members_ = view;
    ++epoch_;
    Connect();
    try {
      const double w_before = weight_;
      Reconcile(buffers, count, dropped);
      last_recovery_.epoch = epoch_;
      last_recovery_.dead = dead_;
      last_recovery_.departed = departed_;
      last_recovery_.members = members_;
      last_recovery_.step = resume_step_;
      last_recovery_.weight_correction = weight_ - w_before;
      return;
    } catch (const CommError& e) {
      if (!IsPeerFailure(e) || attempt + 1 >= max_attempts) throw;
      // Another rank failed while reconciling: the records are untouched, start over.
    }
  }
}

void FaultTolerantPushSum::Reconcile(const std::vector<Buffer>& buffers, size_t count,
                                     const std::vector<int>& dropped) {
  const int m = static_cast<int>(members_.size());
  const int me = comm_->rank();
  const size_t words = count + 1;
  // Who holds a sent-record for whom (original ranks), and the step to resume at.
  const int world = world_size_;
  std::vector<int32_t> flags(world, 0);
  for (const auto& [peer, rec] : ledger_.sent()) {
    flags[peer] = 1;
  }
  std::vector<int32_t> all_flags(static_cast<size_t>(world) * m);
  comm_->allgather(CpuBuffer(flags.data(), flags.size()), CpuBuffer(all_flags.data(), all_flags.size()))->wait();
  // Agreed by a max over the survivors: the step to resume at (the largest step a survivor is
  // in), the round counter, and which dropped ranks left on purpose (any survivor saw its mark).
  std::vector<int64_t> agreed(2 + static_cast<size_t>(world), 0);
  agreed[0] = step_;
  agreed[1] = round_;
  for (int d : dropped) agreed[2 + d] = HasLeft(*store_, d) ? 1 : 0;
  comm_->allreduce(CpuBuffer(agreed.data(), agreed.size()), ReduceOp::kMax)->wait();

  std::vector<P2POp> ops;
  std::vector<std::vector<double>> sent_copy;  // keeps send buffers alive
  for (int j = 0; j < m; ++j) {
    if (j == me) continue;
    auto it = ledger_.sent().find(members_[j]);
    if (it == ledger_.sent().end()) continue;
    std::vector<double> rec = it->second;
    rec.resize(words, 0.0);
    sent_copy.push_back(std::move(rec));
  }
  size_t s = 0;
  for (int j = 0; j < m; ++j) {
    if (j == me || ledger_.sent().count(members_[j]) == 0) continue;
    ops.push_back(P2POp::Send(CpuBuffer(sent_copy[s++].data(), words), j, options_.tag + 1));
  }
  std::vector<std::pair<int, std::vector<double>>> incoming;
  for (int j = 0; j < m; ++j) {
    if (j != me && all_flags[static_cast<size_t>(j) * world + rank_]) incoming.emplace_back(j, std::vector<double>(words));
  }
  for (auto& [j, buf] : incoming) ops.push_back(P2POp::Recv(CpuBuffer(buf.data(), words), j, options_.tag + 1));
  if (!ops.empty()) comm_->p2p(ops)->wait();

  // Everything arrived: now nothing can fail, apply the corrections.
  std::vector<std::pair<int, std::vector<double>>> sent_to_me;  // by original rank
  for (auto& [j, buf] : incoming) sent_to_me.emplace_back(members_[j], std::move(buf));
  std::vector<int> survivors;
  for (int j = 0; j < m; ++j) {
    if (j != me) survivors.push_back(members_[j]);
  }
  std::vector<int> dead, departed;
  for (int d : dropped) (agreed[2 + d] ? departed : dead).push_back(d);
  for (int d : departed) ledger_.Forget(d);  // what it holds left with it; nothing is undone
  const std::vector<double> corr = ledger_.Settle(dead, sent_to_me, survivors, words);
  FlatView(buffers).Update([&](size_t k, double& v) { v += corr[k]; });
  weight_ += corr[count];
  resume_step_ = agreed[0];
  round_ = agreed[1];
  dead_.insert(dead_.end(), dead.begin(), dead.end());
  std::sort(dead_.begin(), dead_.end());
  departed_.insert(departed_.end(), departed.begin(), departed.end());
  std::sort(departed_.begin(), departed_.end());
}

void FaultTolerantPushSum::Debias(const Buffer& in, Buffer out) const {
  DebiasBuffer("fault_tolerant_push_sum debias", weight_, in, out);
}

namespace {

// sum over members, then the first member's result to everyone (bitwise equal everywhere).
// Every all-reduce path gives every rank the same bits (docs/comm.md, "How collectives travel"): no
// broadcast is needed on top.
void SumAndShare(Communicator& comm, std::vector<double>& v) {
  comm.allreduce(CpuBuffer(v.data(), v.size()), ReduceOp::kSum)->wait();
}

}  // namespace

void FaultTolerantPushSum::Average(const std::vector<Buffer>& x, Buffer out) {
  CheckNotLeft("Average");
  const size_t count = CheckBuffers(x);
  if (CheckBuffers({out}) != count) {
    throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum average: out has ", out.count,
                                            " elements but x has ", count));
  }
  std::vector<double> sums(count + 1);
  FlatView(x).Read([&](size_t k, double v) { sums[k] = v; });
  sums[count] = weight_;
  SumAndShare(*comm_, sums);
  if (!(sums[count] > 0)) {
    throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum average: the members' weights sum to ",
                                            sums[count], "; expected their number"));
  }
  FlatView({out}).Update([&](size_t k, double& v) { v = sums[k] / sums[count]; });
}

void FaultTolerantPushSum::MeanOverMembers(const std::vector<Buffer>& buffers) {
  CheckNotLeft("MeanOverMembers");
  for (const Buffer& b : buffers) CheckBuffers({b});  // each its own dtype
  std::vector<double> sums;
  for (const Buffer& b : buffers) FlatView({b}).Read([&](size_t, double v) { sums.push_back(v); });
  if (sums.empty()) return;
  SumAndShare(*comm_, sums);
  const double m = static_cast<double>(members_.size());
  size_t k = 0;
  for (const Buffer& b : buffers) FlatView({b}).Update([&](size_t, double& v) { v = sums[k++] / m; });
}

}  // namespace gossipcc
