#include "compression/power_sgd_steps.h"

#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
#include "comm/core/reduce.h"

namespace gossipcc {
namespace compression {
namespace internal {

std::vector<float> KeyState::Download(const std::shared_ptr<void>& a, size_t count) const {
  std::vector<float> out(count);
  if (count) backend->Download(a.get(), out.data(), count * sizeof(float));
  return out;
}

void KeyState::MoveTo(MathBackend& target) {
  if (backend == &target) return;
  auto move = [&](std::shared_ptr<void>& a, size_t count) {
    if (!a) return;
    std::vector<float> host = Download(a, count);
    a = target.Alloc(count * sizeof(float));
    target.Upload(host.data(), a.get(), count * sizeof(float));
  };
  move(error, error_count);
  move(q, q_count);
  backend = &target;
}

void* PackCache::Get(MathBackend& backend, int slot, size_t bytes) {
  const Device d = backend.device();
  Cached& c = packs_[std::make_tuple(static_cast<int>(d.type), d.index, slot)];
  if (!c.memory || c.bytes < bytes) {
    c.memory.reset();
    c.memory = backend.Alloc(bytes, /*zero=*/false);
    c.bytes = bytes;
  }
  return c.memory.get();
}

void Hasher::Bytes(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
}

void Hasher::Str(const std::string& s) {
  Pod<uint64_t>(s.size());
  Bytes(s.data(), s.size());
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// A zero dimension makes the count 0 whatever the others; a wrapped product could equal a
// small buffer's count (3 * 6148914691236517206 is 2 modulo 2^64) and the sizes derived from it
// (n x m, the error memory, Q) would then be wrong.
std::string ShapeProblem(const std::vector<int64_t>& shape, int64_t* numel) {
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return absl::StrCat("shape ", ShapeString(shape), " has a negative dimension");
    empty |= d == 0;
  }
  int64_t count = 1;
  if (empty) {
    count = 0;
  } else {
    for (int64_t d : shape) {
      if (__builtin_mul_overflow(count, d, &count)) {
        return absl::StrCat("the element count of shape ", ShapeString(shape),
                            " overflows int64 (the product of the dimensions exceeds ",
                            std::numeric_limits<int64_t>::max(), ")");
      }
    }
  }
  *numel = count;
  return "";
}

Device CheckTensors(const std::string& where, absl::Span<const GradientTensor> tensors, const KeyStates& states) {
  auto invalid = [&](const std::string& why) { throw InvalidArgumentError(absl::StrCat(where, ": ", why)); };
  Device device;
  std::set<std::string> keys;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GradientTensor& t = tensors[i];
    const std::string what = absl::StrCat("tensor ", i, " (\"", t.key, "\")");
    if (t.key.empty()) invalid(absl::StrCat("tensor ", i, " has an empty key"));
    if (!keys.insert(t.key).second) invalid(absl::StrCat("key \"", t.key, "\" appears twice"));
    if (!IsFloatingPoint(t.data.dtype)) {
      invalid(absl::StrCat(what, " has dtype ", DTypeName(t.data.dtype), "; PowerSGD averages float32, float64, float16 and bfloat16"));
    }
    int64_t numel = 0;
    const std::string problem = ShapeProblem(t.shape, &numel);
    if (!problem.empty()) invalid(absl::StrCat(what, ": ", problem));
    if (static_cast<uint64_t>(numel) != t.data.count) {
      invalid(absl::StrCat(what, ": shape ", ShapeString(t.shape), " has ", numel, " elements but the buffer has ", t.data.count));
    }
    if (t.data.count > 0 && t.data.data == nullptr) invalid(absl::StrCat(what, " has null data"));
    if (i == 0) device = t.data.device;
    if (t.data.device != device) {
      invalid(absl::StrCat(what, " is on ", t.data.device.ToString(), " but tensor 0 is on ", device.ToString(),
                           "; one call takes tensors of one device"));
    }
    auto it = states.find(t.key);
    if (it != states.end() && (it->second->shape != t.shape || it->second->dtype != t.data.dtype)) {
      invalid(absl::StrCat(what, " has shape ", ShapeString(t.shape), " ", DTypeName(t.data.dtype), " but earlier calls gave ",
                           ShapeString(it->second->shape), " ", DTypeName(it->second->dtype),
                           "; keys must name the same tensor on every call"));
    }
  }
  return device;
}

Selection SelectTensorsToCompress(absl::Span<const GradientTensor> tensors, const KeyStates& states,
                                  const PowerSGDOptions& options, PowerSGDStats& stats) {
  Selection s;
  stats.calls = 1;
  stats.tensors = tensors.size();
  Hasher fp;
  fp.Pod<uint64_t>(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GradientTensor& t = tensors[i];
    auto it = states.find(t.key);
    const int64_t steps = it == states.end() ? 0 : it->second->steps;
    int r = 0;
    const bool compress = steps >= options.start_powerSGD_iter && PowerSGD::ShouldCompress(t.shape, options, &r);
    fp.Str(t.key);
    fp.Pod<uint8_t>(static_cast<uint8_t>(t.data.dtype));
    fp.Pod<uint64_t>(t.shape.size());
    for (int64_t d : t.shape) fp.Pod<int64_t>(d);
    fp.Pod<int64_t>(steps);
    fp.Pod<uint8_t>(compress);
    s.total_elements += t.data.count;
    stats.elements_before += t.data.count;
    stats.bytes_before += t.data.bytes();
    if (!compress) {
      s.exact.push_back(i);
      continue;
    }
    Factorization f;
    f.index = i;
    f.n = t.shape[0];
    f.m = static_cast<int64_t>(t.data.count) / f.n;
    f.r = r;
    s.compressed.push_back(f);
  }
  s.fingerprint = fp.h;
  for (Factorization& f : s.compressed) {
    f.p_offset = s.p_total;
    f.q_offset = s.q_total;
    s.p_total += f.n * f.r;
    s.q_total += f.m * f.r;
  }
  return s;
}

const std::vector<float>& InitialQs::For(size_t j) {
  const Factorization& f = selection_.compressed[j];
  if (drawn_[j].empty()) {
    auto it = states_.find(tensors_[f.index].key);
    drawn_[j] = PowerSGD::InitialQ(options_, tensors_[f.index].key, f.m, f.r, it == states_.end() ? 0 : it->second->steps);
  }
  return drawn_[j];
}

void CreateStates(absl::Span<const GradientTensor> tensors, MathBackend& backend, KeyStates& states) {
  for (const GradientTensor& t : tensors) {
    auto& s = states[t.key];
    if (!s) {
      s = std::make_unique<KeyState>();
      s->shape = t.shape;
      s->dtype = t.data.dtype;
      s->backend = &backend;
    }
  }
}

void AllReduceExact(Communicator& comm, MathBackend& backend, PackCache& packs,
                    absl::Span<const GradientTensor> tensors, const std::vector<size_t>& which, PowerSGDStats& stats) {
  std::map<DType, std::vector<size_t>> by_dtype;
  for (size_t i : which) {
    if (tensors[i].data.count > 0) by_dtype[tensors[i].data.dtype].push_back(i);
  }
  for (auto& [dtype, list] : by_dtype) {
    const size_t esize = ElementSize(dtype);
    size_t total = 0;
    for (size_t i : list) total += tensors[i].data.count;
    stats.elements_after += total;
    stats.bytes_after += total * esize;
    ++stats.allreduce_calls;
    if (list.size() == 1) {
      comm.allreduce(tensors[list[0]].data, ReduceOp::kAvg)->wait();
      continue;
    }
    uint8_t* base = static_cast<uint8_t*>(packs.Get(backend, static_cast<int>(dtype), total * esize));
    size_t offset = 0;
    for (size_t i : list) {
      backend.Copy(base + offset, tensors[i].data.data, tensors[i].data.bytes());
      offset += tensors[i].data.bytes();
    }
    backend.Synchronize();
    comm.allreduce(Buffer{base, total, dtype, backend.device()}, ReduceOp::kAvg)->wait();
    offset = 0;
    for (size_t i : list) {
      backend.Copy(tensors[i].data.data, base + offset, tensors[i].data.bytes());
      offset += tensors[i].data.bytes();
    }
    backend.Synchronize();
  }
}

void ReduceGatheredExact(absl::Span<const GradientTensor> tensors, const std::vector<size_t>& which,
                         const uint8_t* table, size_t stride, size_t offset, int ranks, PowerSGDStats& stats) {
  // Each tensor straight from the gathered copies into its own memory (no pack to copy out of).
  std::vector<const void*> sources(ranks);
  WideScratch wide;
  for (size_t i : which) {
    const Buffer& b = tensors[i].data;
    if (b.count == 0) continue;
    for (int r = 0; r < ranks; ++r) sources[r] = table + static_cast<size_t>(r) * stride + offset;
    ReduceInRankOrder(sources, b, ReduceOp::kAvg, wide);
    offset += b.bytes();
    stats.elements_after += b.count;
    stats.bytes_after += b.bytes();
  }
}

void AddErrorFeedback(MathBackend& backend, absl::Span<const GradientTensor> tensors, Selection& selection,
                      KeyStates& states, InitialQs& initial_q, const PowerSGDOptions& options) {
  for (Factorization& f : selection.compressed) f.state = states[tensors[f.index].key].get();
  for (size_t j = 0; j < selection.compressed.size(); ++j) {
    Factorization& f = selection.compressed[j];
    const GradientTensor& t = tensors[f.index];
    KeyState& s = *f.state;
    s.MoveTo(backend);
    const size_t nm = static_cast<size_t>(f.n * f.m), mr = static_cast<size_t>(f.m * f.r);
    if (!s.q || s.q_count != mr || !options.warm_start) {
      const std::vector<float>& host = initial_q.For(j);
      if (!s.q || s.q_count != mr) s.q = backend.Alloc(mr * sizeof(float));
      s.q_count = mr;
      backend.Upload(host.data(), s.q.get(), mr * sizeof(float));
    }
    if (options.use_error_feedback && !s.error) {
      s.error = backend.Alloc(nm * sizeof(float));
      s.error_count = nm;
    }
    if (f.M != nullptr) continue;  // loaded into its scratch before the check
    if (t.data.dtype == DType::kFloat32 && !backend.device().is_cuda()) {
      f.M = static_cast<float*>(t.data.data);
      f.pending_error = options.use_error_feedback ? s.error_ptr() : nullptr;
      continue;
    }
    if (t.data.dtype != DType::kFloat32) f.scratch = backend.Alloc(nm * sizeof(float), /*zero=*/false);
    f.M = backend.LoadMatrix(t.data, options.use_error_feedback ? s.error_ptr() : nullptr,
                             static_cast<float*>(f.scratch.get()));
  }
}

void ComputeP(MathBackend& backend, const Selection& selection, int iteration, const float* Q, float* P) {
  for (const Factorization& f : selection.compressed) {
    const float* q_in = iteration == 0 ? f.state->q_ptr() : Q + f.q_offset;
    backend.MultiplyMQ(f.M, f.pending_error, q_in, P + f.p_offset, f.n, f.m, f.r, nullptr);
  }
}

void AllReduceP(Communicator& comm, MathBackend& backend, const Selection& selection, float* P, PowerSGDStats& stats) {
  backend.Synchronize();
  comm.allreduce(Buffer{P, selection.p_total, DType::kFloat32, backend.device()}, ReduceOp::kSum)->wait();
  stats.allreduce_calls += 1;
}

void SumGatheredP(const uint8_t* table, size_t stride, int ranks, const Selection& selection, float* P) {
  std::vector<const void*> sources(ranks);
  for (int r = 0; r < ranks; ++r) sources[r] = table + r * stride;
  WideScratch unused;  // float32 needs no widening
  ReduceInRankOrder(sources, Buffer{P, selection.p_total, DType::kFloat32, Device::CPU()}, ReduceOp::kSum, unused);
}

void Orthogonalize(MathBackend& backend, const Selection& selection, float eps, float* P) {
  for (const Factorization& f : selection.compressed) backend.Orthogonalize(P + f.p_offset, f.n, f.r, eps);
}

void ComputeQ(MathBackend& backend, Selection& selection, const float* P, float* Q) {
  for (Factorization& f : selection.compressed) {
    backend.MultiplyMtP(f.M, f.pending_error, P + f.p_offset, Q + f.q_offset, f.n, f.m, f.r);
    f.pending_error = nullptr;  // M is grad + error from here on
  }
}

void AllReduceQ(Communicator& comm, MathBackend& backend, const Selection& selection, float* Q, PowerSGDStats& stats) {
  backend.Synchronize();
  comm.allreduce(Buffer{Q, selection.q_total, DType::kFloat32, backend.device()}, ReduceOp::kAvg)->wait();
  stats.allreduce_calls += 1;
  stats.elements_after += selection.p_total + selection.q_total;
  stats.bytes_after += (selection.p_total + selection.q_total) * sizeof(float);
}

void DecompressAndUpdateMemory(MathBackend& backend, absl::Span<const GradientTensor> tensors,
                               const Selection& selection, const float* P, const float* Q,
                               const PowerSGDOptions& options) {
  for (const Factorization& f : selection.compressed) {
    KeyState& s = *f.state;
    backend.Finish(f.M, P + f.p_offset, Q + f.q_offset, f.n, f.m, f.r,
                   options.use_error_feedback ? s.error_ptr() : nullptr, tensors[f.index].data);
    backend.Copy(s.q.get(), Q + f.q_offset, s.q_count * sizeof(float));
  }
  backend.Synchronize();
}

void CountStep(absl::Span<const GradientTensor> tensors, KeyStates& states) {
  for (const GradientTensor& t : tensors) ++states[t.key]->steps;
}

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
