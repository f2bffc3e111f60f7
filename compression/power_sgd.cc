#include "compression/power_sgd.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "compression/power_sgd_check.h"
#include "compression/power_sgd_checkpoint.h"
#include "compression/power_sgd_math.h"
#include "compression/power_sgd_steps.h"

namespace gossipcc {
namespace compression {

using internal::Hasher;
using internal::MathBackend;

namespace {

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal samples from a seed, with our own generator and Box-Muller, so every rank
// (and the CPU and CUDA paths) draws the same numbers whatever the standard library.
void FillNormal(uint64_t seed, float* out, size_t n) {
  uint64_t s = seed;
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(SplitMix64(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
    const double u2 = static_cast<double>(SplitMix64(s) >> 11) * (1.0 / 9007199254740992.0);           // [0, 1)
    const double radius = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(radius * std::cos(2 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(radius * std::sin(2 * M_PI * u2));
  }
}

// The largest count AllReduceFlat can view as a square: side * side stays within int64.
constexpr uint64_t kMaxFlatSide = 3037000499;  // floor(sqrt(2^63 - 1))
constexpr uint64_t kMaxFlatCount = kMaxFlatSide * kMaxFlatSide;

}  // namespace

// ---- stats ----

void PowerSGDStats::Add(const PowerSGDStats& o) {
  calls += o.calls;
  tensors += o.tensors;
  compressed_tensors += o.compressed_tensors;
  elements_before += o.elements_before;
  elements_after += o.elements_after;
  bytes_before += o.bytes_before;
  bytes_after += o.bytes_after;
  check_bytes += o.check_bytes;
  allreduce_calls += o.allreduce_calls;
  nonfinite_calls += o.nonfinite_calls;
}

std::string PowerSGDStats::ToString() const {
  return absl::StrFormat(
      "%d call(s), %d tensor(s) (%d compressed), elements %d -> %d, bytes %d -> %d (ratio %.2fx), %d all-reduce(s), "
      "%d check bytes, %d call(s) with NaN/Inf",
      calls, tensors, compressed_tensors, elements_before, elements_after, bytes_before, bytes_after,
      compression_ratio(), allreduce_calls, check_bytes, nonfinite_calls);
}

PowerSGD::PowerSGD(PowerSGDOptions options)
    : options_(options), packs_(std::make_unique<internal::PackCache>()), cpu_(internal::MakeCpuBackend()) {
  options_.Validate();
}

PowerSGD::~PowerSGD() = default;

MathBackend& PowerSGD::BackendFor(Device device) {
  if (!device.is_cuda()) return *cpu_;
  auto& b = cuda_[device.index];
  if (!b) b = internal::MakeCudaBackend(device.index);
  return *b;
}

std::vector<float> PowerSGD::InitialQ(const PowerSGDOptions& options, const std::string& key, int64_t m, int r,
                                     int64_t step) {
  // Same seed on every rank: random_seed mixed with the key (and the step without warm start).
  Hasher h;
  h.Pod<uint64_t>(options.random_seed);
  h.Str(key);
  if (!options.warm_start) h.Pod<int64_t>(step);
  const size_t mr = static_cast<size_t>(m) * r;
  std::vector<float> q(mr);
  FillNormal(h.h, q.data(), mr);
  internal::MakeCpuBackend()->Orthogonalize(q.data(), m, r, static_cast<float>(options.orthogonalization_epsilon));
  return q;
}

bool PowerSGD::ShouldCompress(const std::vector<int64_t>& shape, const PowerSGDOptions& options, int* rank_used) {
  int64_t numel = 0;
  const std::string problem = internal::ShapeProblem(shape, &numel);
  if (!problem.empty()) throw InvalidArgumentError("PowerSGD::ShouldCompress: " + problem);
  if (shape.size() < 2) return false;
  if (numel == 0) return false;
  const int64_t n = shape[0], m = numel / n;
  const int64_t r = std::min<int64_t>({n, m, options.matrix_approximation_rank});
  if (rank_used) *rank_used = static_cast<int>(r);
  // In double: (n + m) * r can pass int64 for counts above 2^62 (n * m is numel, which fits).
  return (static_cast<double>(n) + static_cast<double>(m)) * static_cast<double>(r) * options.min_compression_rate <
         static_cast<double>(numel);
}

// The algorithm as a list of steps (compression/power_sgd_steps.h has each one's contract).
PowerSGDStats PowerSGD::AllReduce(Communicator& comm, absl::Span<const GradientTensor> tensors) {
  using namespace internal;  // the steps
  const std::string where = absl::StrCat("PowerSGD allreduce on rank ", comm.rank(), " of ", comm.size());
  const Device device = CheckTensors(where, tensors, states_);
  MathBackend& backend = BackendFor(device);
  PowerSGDStats stats;

  // Select what to compress.
  Selection selection = SelectTensorsToCompress(tensors, states_, options_, stats);
  InitialQs initial_q(options_, tensors, selection, states_);

  // Every rank asked the same, and NaN/Inf found, before anything changes; on the CPU the
  // exact part and the first P = M Q may ride along.
  CrossRankCheck check(comm.size(), device, tensors, selection);
  check.ScanNonFinite(backend, options_);
  if (check.carries_first_p()) check.ComputeFirstP(*cpu_, states_, initial_q, options_, selection);
  check.Exchange(comm, options_);
  if (check.Verify(where, options_, stats)) {
    // NaN/Inf on some rank: an exact average of everything, state untouched.
    std::vector<size_t> all(tensors.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    AllReduceExact(comm, backend, *packs_, tensors, all, stats);
    last_ = stats;
    total_.Add(stats);
    return stats;
  }
  CreateStates(tensors, backend, states_);

  // All-reduce the rest.
  if (check.carries_exact()) {
    ReduceGatheredExact(tensors, selection.exact, check.table(), check.stride(), CrossRankCheck::kExactOffset,
                        comm.size(), stats);
  } else {
    AllReduceExact(comm, backend, *packs_, tensors, selection.exact, stats);
  }

  if (!selection.compressed.empty()) {
    stats.compressed_tensors = selection.compressed.size();
    float* P = static_cast<float*>(packs_->Get(backend, PackCache::kPSlot, selection.p_total * sizeof(float)));
    float* Q = static_cast<float*>(packs_->Get(backend, PackCache::kQSlot, selection.q_total * sizeof(float)));
    AddErrorFeedback(backend, tensors, selection, states_, initial_q, options_);
    for (int it = 0; it < options_.num_iters_per_step; ++it) {
      if (it == 0 && check.carries_first_p()) {
        SumGatheredP(check.table() + check.first_p_offset(), check.stride(), comm.size(), selection, P);
      } else {
        ComputeP(backend, selection, it, Q, P);
        AllReduceP(comm, backend, selection, P, stats);
      }
      Orthogonalize(backend, selection, static_cast<float>(options_.orthogonalization_epsilon), P);
      ComputeQ(backend, selection, P, Q);
      AllReduceQ(comm, backend, selection, Q, stats);
    }
    DecompressAndUpdateMemory(backend, tensors, selection, P, Q, options_);
  }
  CountStep(tensors, states_);
  last_ = stats;
  total_.Add(stats);
  return stats;
}

std::vector<int64_t> PowerSGD::FlatMatrixShape(size_t count) {
  if (count > kMaxFlatCount) {
    throw InvalidArgumentError(absl::StrCat("PowerSGD::FlatMatrixShape: ", count, " elements: the element count of the square (",
                                            kMaxFlatSide + 1, " x ", kMaxFlatSide + 1, " or more) overflows int64"));
  }
  int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(count)));
  while (static_cast<uint64_t>(side) * side < count) ++side;
  while (side > 0 && static_cast<uint64_t>(side - 1) * (side - 1) >= count) --side;
  return {side, side};
}

PowerSGDStats PowerSGD::AllReduceFlat(Communicator& comm, absl::Span<const FlatGradient> buffers) {
  std::vector<GradientTensor> tensors;
  std::vector<std::shared_ptr<void>> padded(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const FlatGradient& f = buffers[i];
    if (f.data.count > kMaxFlatCount) {
      throw InvalidArgumentError(absl::StrCat("PowerSGD allreduce (flat) on rank ", comm.rank(), " of ", comm.size(),
                                              ": buffer ", i, " (\"", f.key, "\") has ", f.data.count,
                                              " elements: the element count of its square shape [", kMaxFlatSide + 1, ", ",
                                              kMaxFlatSide + 1, "] (or larger) overflows int64"));
    }
    std::vector<int64_t> shape = FlatMatrixShape(f.data.count);
    // Never worth compressing: stays 1-D, unpadded, in the exact pack.
    if (!ShouldCompress(shape, options_)) shape = {static_cast<int64_t>(f.data.count)};
    const size_t total = shape.size() == 2 ? static_cast<size_t>(shape[0] * shape[1]) : f.data.count;
    Buffer view = f.data;
    if (total != f.data.count && f.data.data != nullptr && IsFloatingPoint(f.data.dtype)) {
      MathBackend& backend = BackendFor(f.data.device);
      padded[i] = backend.Alloc(total * ElementSize(f.data.dtype));  // zero padding
      backend.Copy(padded[i].get(), f.data.data, f.data.bytes());
      view.data = padded[i].get();
      view.count = total;
    } else if (total != f.data.count) {
      shape = {static_cast<int64_t>(f.data.count)};  // let AllReduce report the bad buffer
    }
    tensors.push_back(GradientTensor{f.key, view, std::move(shape)});
  }
  const PowerSGDStats stats = AllReduce(comm, tensors);
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!padded[i]) continue;
    MathBackend& backend = BackendFor(buffers[i].data.device);
    backend.Copy(buffers[i].data.data, padded[i].get(), buffers[i].data.bytes());
    backend.Synchronize();
  }
  return stats;
}

// ---- checkpoints ----

PowerSGDCheckpoint PowerSGD::SaveState() const {
  PowerSGDCheckpoint c;
  c.options = options_;
  for (const auto& [key, s] : states_) GetTensorState(key, &c.tensors[key]);
  return c;
}

bool PowerSGD::GetTensorState(const std::string& key, PowerSGDTensorState* out) const {
  auto it = states_.find(key);
  if (it == states_.end()) return false;
  *out = internal::SaveKeyState(*it->second);
  return true;
}

void PowerSGD::LoadState(const PowerSGDCheckpoint& c) { states_ = internal::LoadKeyStates(c, options_, *cpu_); }

}  // namespace compression
}  // namespace gossipcc
