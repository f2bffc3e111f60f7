#include "compression/power_sgd_check.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace compression {
namespace internal {
namespace {

uint64_t OptionsHash(const PowerSGDOptions& o) {
  Hasher h;
  h.Pod<int32_t>(o.matrix_approximation_rank);
  h.Pod<int64_t>(o.start_powerSGD_iter);
  h.Pod<double>(o.min_compression_rate);
  h.Pod<uint8_t>(o.use_error_feedback);
  h.Pod<uint8_t>(o.warm_start);
  h.Pod<double>(o.orthogonalization_epsilon);
  h.Pod<uint64_t>(o.random_seed);
  h.Pod<uint8_t>(o.batch_tensors_with_same_shape);
  h.Pod<int32_t>(o.num_iters_per_step);
  h.Pod<uint8_t>(static_cast<uint8_t>(o.nonfinite));
  return h.h;
}

size_t RoundUpTo8(size_t bytes) { return (bytes + 7) / 8 * 8; }

}  // namespace

CrossRankCheck::CrossRankCheck(int ranks, Device device, absl::Span<const GradientTensor> tensors,
                               const Selection& selection)
    : ranks_(ranks), tensors_(tensors), selection_(selection), nonfinite_(tensors.size(), 0) {
  bool one_dtype = true;
  size_t bytes = 0;
  DType exact_dtype = DType::kFloat32;
  for (size_t i : selection.exact) {
    const Buffer& b = tensors[i].data;
    if (b.count == 0) continue;
    if (bytes == 0) exact_dtype = b.dtype;
    one_dtype &= b.dtype == exact_dtype;
    bytes += b.bytes();
  }
  if (ranks > 1 && one_dtype && !device.is_cuda()) {
    const size_t limit = EagerCollectiveMaxBytes(ranks);
    const size_t with_exact = kExactOffset + RoundUpTo8(bytes);
    if (with_exact <= limit) exact_bytes_ = bytes;
    first_p_ = !selection.compressed.empty() && with_exact + selection.p_total * sizeof(float) <= limit;
  }
  // Each rank's slot: the fields, then its exact data, padded so every slot (and so every rank's
  // copy of the data) stays 8-byte aligned, then its first P.
  p_offset_bytes_ = kExactOffset + RoundUpTo8(exact_bytes_);
  const size_t slot_words = (p_offset_bytes_ + (first_p_ ? selection.p_total * sizeof(float) : 0) + 7) / sizeof(int64_t);
  mine_.assign(slot_words, 0);
  table_.assign(slot_words * ranks, 0);
}

void CrossRankCheck::ScanNonFinite(MathBackend& backend, const PowerSGDOptions& options) {
  const bool scan = options.nonfinite != NonFinitePolicy::kUnchecked;
  auto scan_apart = [&](size_t i) { nonfinite_[i] = scan && !backend.AllFinite(tensors_[i].data); };
  for (size_t i : selection_.exact) scan_apart(i);
  for (const Factorization& f : selection_.compressed) {
    if (!first_p_ || tensors_[f.index].data.dtype != DType::kFloat32) scan_apart(f.index);
  }
}

void CrossRankCheck::ComputeFirstP(MathBackend& cpu, KeyStates& states, InitialQs& initial_q,
                                   const PowerSGDOptions& options, Selection& selection) {
  const bool scan = options.nonfinite != NonFinitePolicy::kUnchecked;
  // The first P reads Q and the error memory on the CPU; a key whose state an earlier call left
  // on a GPU moves now rather than in AddErrorFeedback (same values, other memory).
  for (const Factorization& f : selection.compressed) {
    auto it = states.find(tensors_[f.index].key);
    if (it != states.end()) it->second->MoveTo(cpu);
  }
  float* first_p = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(mine_.data()) + p_offset_bytes_);
  for (size_t j = 0; j < selection.compressed.size(); ++j) {
    Factorization& f = selection.compressed[j];
    const GradientTensor& t = tensors_[f.index];
    auto it = states.find(t.key);
    const KeyState* s = it == states.end() ? nullptr : it->second.get();
    const size_t mr = static_cast<size_t>(f.m * f.r);
    const float* q = s && s->q && s->q_count == mr && options.warm_start ? s->q_ptr() : initial_q.For(j).data();
    const float* error = options.use_error_feedback && s && s->error ? s->error_ptr() : nullptr;
    if (t.data.dtype == DType::kFloat32) {
      bool finite = true;
      cpu.MultiplyMQ(static_cast<const float*>(t.data.data), error, q, first_p + f.p_offset, f.n, f.m, f.r,
                     scan ? &finite : nullptr);
      nonfinite_[f.index] = !finite;
    } else {
      // M goes to a scratch anyway for these dtypes; the gradient stays untouched.
      f.scratch = cpu.Alloc(static_cast<size_t>(f.n * f.m) * sizeof(float), /*zero=*/false);
      f.M = cpu.LoadMatrix(t.data, error, static_cast<float*>(f.scratch.get()));
      cpu.MultiplyMQ(f.M, nullptr, q, first_p + f.p_offset, f.n, f.m, f.r, nullptr);
    }
  }
}

void CrossRankCheck::Exchange(Communicator& comm, const PowerSGDOptions& options) {
  mine_[kFingerprint] = static_cast<int64_t>(selection_.fingerprint);
  mine_[kOptions] = static_cast<int64_t>(OptionsHash(options));
  mine_[kTensors] = static_cast<int64_t>(tensors_.size());
  mine_[kElements] = static_cast<int64_t>(selection_.total_elements);
  if (exact_bytes_ > 0) {
    uint8_t* out = reinterpret_cast<uint8_t*>(mine_.data()) + kExactOffset;
    for (size_t i : selection_.exact) {
      const Buffer& b = tensors_[i].data;
      if (b.count) std::memcpy(out, b.data, b.bytes());
      out += b.bytes();
    }
  }
  int64_t nonfinite = 0;
  for (char n : nonfinite_) nonfinite += n != 0;
  mine_[kNonFinite] = nonfinite;
  try {
    comm.allgather(CpuBuffer(mine_.data(), mine_.size()), CpuBuffer(table_.data(), table_.size()))->wait();
  } catch (const MismatchError&) {
    mine_.resize(kNumFields);
    table_.assign(kNumFields * ranks_, 0);
    comm.allgather(CpuBuffer(mine_.data(), mine_.size()), CpuBuffer(table_.data(), table_.size()))->wait();
    exact_bytes_ = 0;
    first_p_ = false;
  }
}

bool CrossRankCheck::Verify(const std::string& where, const PowerSGDOptions& options, PowerSGDStats& stats) const {
  stats.check_bytes = stride() - exact_bytes_ - (first_p_ ? selection_.p_total * sizeof(float) : 0);
  bool options_differ = false, tensors_differ = false;
  int64_t ranks_nonfinite = 0;
  for (int q = 0; q < ranks_; ++q) {
    options_differ |= field(q, kOptions) != field(0, kOptions);
    tensors_differ |= field(q, kFingerprint) != field(0, kFingerprint);
    ranks_nonfinite += field(q, kNonFinite) > 0;
  }
  if (options_differ) {
    std::string detail;
    for (int q = 0; q < ranks_; ++q) absl::StrAppend(&detail, q ? ", " : "", "rank ", q, ": ", absl::Hex(field(q, kOptions)));
    throw MismatchError(absl::StrCat(where, ": ranks use different PowerSGD options (hashes ", detail,
                                     "); this rank: ", options.ToString(), "; no data was exchanged"));
  }
  if (tensors_differ) {
    std::string detail;
    for (int q = 0; q < ranks_; ++q) {
      absl::StrAppend(&detail, q ? "; " : "", "rank ", q, ": ", field(q, kTensors), " tensors, ", field(q, kElements),
                      " elements, fingerprint ", absl::Hex(field(q, kFingerprint)));
    }
    throw MismatchError(absl::StrCat(where,
                                     ": ranks disagree on the tensor list (keys, order, shapes, dtypes or per-key step "
                                     "counts): ",
                                     detail, "; no data was exchanged"));
  }
  if (ranks_nonfinite == 0) return false;
  stats.nonfinite_calls = 1;
  if (options.nonfinite == NonFinitePolicy::kError) {
    std::string detail;
    for (int q = 0; q < ranks_; ++q) {
      if (field(q, kNonFinite) > 0) absl::StrAppend(&detail, detail.empty() ? "" : ", ", "rank ", q, ": ", field(q, kNonFinite));
    }
    std::string here;  // this rank's first five tensors with NaN/Inf
    int listed = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (!nonfinite_[i] || ++listed > 5) continue;
      absl::StrAppend(&here, listed > 1 ? ", " : "", "\"", tensors_[i].key, "\"");
    }
    throw InvalidArgumentError(absl::StrCat(where, ": NaN or Inf in the input (tensors with NaN/Inf per rank: ", detail,
                                            here.empty() ? "" : absl::StrCat("; here: ", here),
                                            "); nothing was reduced and the PowerSGD state is unchanged"));
  }
  return true;
}

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
