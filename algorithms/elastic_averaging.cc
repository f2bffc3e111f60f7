#include "algorithms/elastic_averaging.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "comm/core/errors.h"

namespace gossipcc {

using gossip_internal::CheckBuffers;
using gossip_internal::DispatchFloating;
using gossip_internal::HostStaging;
using gossip_internal::TotalCount;

ElasticAveraging::ElasticAveraging(int tau, double alpha) : tau_(tau), alpha_(alpha) {
  if (tau < 1) throw InvalidArgumentError(absl::StrCat("elastic_averaging: tau must be >= 1, got ", tau));
  if (!(alpha > 0 && alpha <= 1)) {
    throw InvalidArgumentError(absl::StrCat("elastic_averaging: alpha must be in (0, 1], got ", alpha));
  }
}

void ElasticAveraging::Initialize(Communicator& comm, std::vector<Buffer> params) {
  const DType dtype = CheckBuffers("elastic_averaging", params);
  HostStaging staging("elastic_averaging", params);
  std::vector<std::shared_ptr<Work>> works;
  for (const Buffer& b : staging.host()) works.push_back(comm.broadcast(b, 0));
  for (auto& w : works) w->wait();
  staging.WriteBack();
  center_.clear();
  center_.reserve(TotalCount(params));
  DispatchFloating(dtype, [&](auto e) {
    using E = decltype(e);
    for (const Buffer& b : staging.host()) {
      const auto* x = static_cast<const typename E::Storage*>(b.data);
      for (size_t i = 0; i < b.count; ++i) center_.push_back(static_cast<double>(E::Load(x[i])));
    }
  });
  step_ = 0;
  initialized_ = true;
}

bool ElasticAveraging::Step(Communicator& comm, std::vector<Buffer> params) {
  if (step_ + 1 < 0) throw InvalidArgumentError("elastic_averaging: step overflow");
  const bool average = (step_ + 1) % tau_ == 0;
  if (average) {
    // Average() checks and may throw; the step only advances on success.
    ++step_;
    try {
      Average(comm, params);
    } catch (...) {
      --step_;
      throw;
    }
    return true;
  }
  CheckBuffers("elastic_averaging", params);
  ++step_;
  return false;
}

void ElasticAveraging::Average(Communicator& comm, std::vector<Buffer> params) {
  const DType dtype = CheckBuffers("elastic_averaging", params);
  const size_t total = TotalCount(params);
  if (!initialized_) {
    throw InvalidArgumentError(absl::StrCat("elastic_averaging on rank ", comm.rank(),
                                            ": call Initialize (or Restore) before averaging"));
  }
  if (total != center_.size()) {
    throw InvalidArgumentError(absl::StrCat("elastic_averaging on rank ", comm.rank(), " at step ", step_,
                                            ": parameters have ", total, " elements but the center has ",
                                            center_.size()));
  }
  HostStaging staging("elastic_averaging", params);
  const size_t esize = ElementSize(dtype);
  std::vector<uint64_t> d_storage((total * esize + 7) / 8);
  // d = alpha * (x - c), rounded to the parameters' dtype.
  DispatchFloating(dtype, [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    S* d = reinterpret_cast<S*>(d_storage.data());
    size_t k = 0;
    for (const Buffer& b : staging.host()) {
      const S* x = static_cast<const S*>(b.data);
      for (size_t i = 0; i < b.count; ++i, ++k) {
        d[k] = E::Store(static_cast<typename E::Compute>(alpha_ * (static_cast<double>(E::Load(x[i])) - center_[k])));
      }
    }
  });
  std::vector<uint64_t> local_d = d_storage;  // kept for x <- x - d
  double steps[2] = {static_cast<double>(step_), -static_cast<double>(step_)};
  auto check = comm.allreduce(CpuBuffer(steps, 2), ReduceOp::kMax);
  auto sum = comm.allreduce(Buffer{d_storage.data(), total, dtype, Device::CPU()}, ReduceOp::kSum);
  std::exception_ptr error;
  for (auto* w : {&check, &sum}) {
    try {
      (*w)->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  if (steps[0] != -steps[1]) {
    throw MismatchError(absl::StrCat("elastic_averaging on rank ", comm.rank(), " at step ", step_,
                                     ": ranks average at different steps (from ", -steps[1], " to ", steps[0],
                                     "); every rank must use the same tau and step count. Nothing was modified"));
  }
  DispatchFloating(dtype, [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    const S* mine = reinterpret_cast<const S*>(local_d.data());
    const S* all = reinterpret_cast<const S*>(d_storage.data());
    size_t k = 0;
    for (const Buffer& b : staging.host()) {
      S* x = static_cast<S*>(b.data);
      for (size_t i = 0; i < b.count; ++i, ++k) {
        x[i] = E::Store(E::Load(x[i]) - E::Load(mine[k]));
        center_[k] += static_cast<double>(E::Load(all[k]));
      }
    }
  });
  staging.WriteBack();
}

void ElasticAveraging::Restore(int64_t step, std::vector<double> center) {
  if (step < 0) throw InvalidArgumentError(absl::StrCat("elastic_averaging: restore with negative step ", step));
  for (size_t i = 0; i < center.size(); ++i) {
    if (!std::isfinite(center[i])) {
      throw InvalidArgumentError(absl::StrCat("elastic_averaging: restored center element ", i, " is ", center[i]));
    }
  }
  step_ = step;
  center_ = std::move(center);
  initialized_ = true;
}

}  // namespace gossipcc
