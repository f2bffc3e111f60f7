#include "compression/power_sgd.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/errors.h"
#include "comm/reduce.h"
#include "compression/power_sgd_math.h"

namespace gossipcc {
namespace compression {

using internal::MathBackend;

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;

struct Hasher {
  uint64_t h = kFnvOffset;
  void Bytes(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 0x100000001b3ull;
    }
  }
  template <typename T>
  void Pod(const T& v) { Bytes(&v, sizeof(v)); }
  void Str(const std::string& s) {
    Pod<uint64_t>(s.size());
    Bytes(s.data(), s.size());
  }
};

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

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// Why `shape` is not a valid tensor shape, or "" when it is (then *numel is its element
// count). Negative dimensions are refused, and so is a product of the dimensions beyond int64:
// it is computed with checked multiplications, since a wrapped product can equal a small
// buffer's count (3 * 6148914691236517206 is 2 modulo 2^64) and the sizes derived from it
// (n x m, the error memory, Q) would then be wrong. A zero dimension makes the count 0 whatever
// the others.
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

// The largest count AllReduceFlat can view as a square: side * side stays within int64.
constexpr uint64_t kMaxFlatSide = 3037000499;  // floor(sqrt(2^63 - 1))
constexpr uint64_t kMaxFlatCount = kMaxFlatSide * kMaxFlatSide;

constexpr int kPSlot = 100, kQSlot = 101;  // Pack() slots besides the dtypes

// Fields of the cross-rank check, one int64 each.
enum CheckField { kFingerprint, kOptions, kTensors, kElements, kNonFinite, kNumCheckFields };

size_t RoundUpTo8(size_t bytes) { return (bytes + 7) / 8 * 8; }

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

// ---- state ----

struct PowerSGD::State {
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  int64_t steps = 0;
  MathBackend* backend = nullptr;  // where error and q live
  std::shared_ptr<void> error;     // n*m floats or null
  size_t error_count = 0;
  std::shared_ptr<void> q;  // m*r floats or null
  size_t q_count = 0;

  float* error_ptr() const { return static_cast<float*>(error.get()); }
  float* q_ptr() const { return static_cast<float*>(q.get()); }

  std::vector<float> Download(const std::shared_ptr<void>& a, size_t count) const {
    std::vector<float> out(count);
    if (count) backend->Download(a.get(), out.data(), count * sizeof(float));
    return out;
  }
  // Moves the arrays into `target`'s memory.
  void MoveTo(MathBackend& target) {
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
};

struct PowerSGD::Plan {
  size_t index = 0;  // into the call's tensors
  int64_t n = 0, m = 0;
  int r = 0;
  size_t p_offset = 0, q_offset = 0;  // in floats, into the P and Q packs
  State* state = nullptr;
  float* M = nullptr;
  // CPU float32 with error feedback: M is the gradient's memory and the error memory is added
  // to it by the first M^T P pass (MultiplyMtP with E), not by a pass of its own. Until then
  // M reads as grad + pending_error.
  const float* pending_error = nullptr;
  std::shared_ptr<void> scratch;
};

PowerSGD::PowerSGD(PowerSGDOptions options) : options_(options), cpu_(internal::MakeCpuBackend()) {
  options_.Validate();
}

PowerSGD::~PowerSGD() = default;

void* PowerSGD::Pack(MathBackend& backend, int slot, size_t bytes) {
  const Device d = backend.device();
  CachedPack& c = packs_[std::make_tuple(static_cast<int>(d.type), d.index, slot)];
  if (!c.memory || c.bytes < bytes) {
    c.memory.reset();
    c.memory = backend.Alloc(bytes, /*zero=*/false);
    c.bytes = bytes;
  }
  return c.memory.get();
}

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
  const std::string problem = ShapeProblem(shape, &numel);
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

void PowerSGD::Exact(Communicator& comm, absl::Span<const GradientTensor> tensors, const std::vector<size_t>& which,
                     PowerSGDStats& stats) {
  // One packed all-reduce per dtype (one in the usual single-dtype case); a lone tensor is
  // reduced in place.
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
    MathBackend& backend = BackendFor(tensors[list[0]].data.device);
    uint8_t* base = static_cast<uint8_t*>(Pack(backend, static_cast<int>(dtype), total * esize));
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

void PowerSGD::ReduceGatheredExact(absl::Span<const GradientTensor> tensors, const std::vector<size_t>& which,
                                   const uint8_t* table, size_t stride, size_t offset, int ranks,
                                   PowerSGDStats& stats) {
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

PowerSGDStats PowerSGD::AllReduce(Communicator& comm, absl::Span<const GradientTensor> tensors) {
  const std::string where = absl::StrCat("PowerSGD allreduce on rank ", comm.rank(), " of ", comm.size());
  auto invalid = [&](const std::string& why) { throw InvalidArgumentError(absl::StrCat(where, ": ", why)); };

  // ---- local validation: nothing sent yet ----
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
    auto it = states_.find(t.key);
    if (it != states_.end() && (it->second->shape != t.shape || it->second->dtype != t.data.dtype)) {
      invalid(absl::StrCat(what, " has shape ", ShapeString(t.shape), " ", DTypeName(t.data.dtype), " but earlier calls gave ",
                           ShapeString(it->second->shape), " ", DTypeName(it->second->dtype),
                           "; keys must name the same tensor on every call"));
    }
  }
  MathBackend& backend = BackendFor(device);

  // ---- plan ----
  PowerSGDStats stats;
  stats.calls = 1;
  stats.tensors = tensors.size();
  std::vector<size_t> exact;
  std::vector<Plan> plans;
  Hasher fp;
  fp.Pod<uint64_t>(tensors.size());
  uint64_t total_elements = 0, nonfinite = 0;
  std::string nonfinite_keys;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GradientTensor& t = tensors[i];
    auto it = states_.find(t.key);
    const int64_t steps = it == states_.end() ? 0 : it->second->steps;
    int r = 0;
    const bool compress = steps >= options_.start_powerSGD_iter && ShouldCompress(t.shape, options_, &r);
    fp.Str(t.key);
    fp.Pod<uint8_t>(static_cast<uint8_t>(t.data.dtype));
    fp.Pod<uint64_t>(t.shape.size());
    for (int64_t d : t.shape) fp.Pod<int64_t>(d);
    fp.Pod<int64_t>(steps);
    fp.Pod<uint8_t>(compress);
    total_elements += t.data.count;
    stats.elements_before += t.data.count;
    stats.bytes_before += t.data.bytes();
    if (!compress) {
      exact.push_back(i);
      continue;
    }
    Plan p;
    p.index = i;
    p.n = t.shape[0];
    p.m = static_cast<int64_t>(t.data.count) / p.n;
    p.r = r;
    p.state = nullptr;
    plans.push_back(p);
  }

  // ---- cross-rank check: one allgather of 5 int64 per rank, before any payload moves ----
  // On the CPU, when the message stays within the eager limit, data rides in the same
  // allgather and every rank reduces the gathered copies itself, in rank order (an eager
  // all-reduce sends its payload to every peer too, so this costs no bytes, only saves
  // exchanges):
  //  - the exact part (biases, norms: one dtype), instead of its own all-reduce;
  //  - P = M Q of the first power iteration, computed now from the gradient and the error
  //    memory without writing either (nothing may change before the check passes), instead of
  //    the P all-reduce. A call then takes 2 exchanges (check + exact + P, then Q), not 4.
  const int W = comm.size();
  constexpr size_t kCheckBytes = kNumCheckFields * sizeof(int64_t);
  size_t p_total = 0, q_total = 0;
  for (Plan& p : plans) {
    p.p_offset = p_total;
    p.q_offset = q_total;
    p_total += p.n * p.r;
    q_total += p.m * p.r;
  }
  size_t fused_bytes = 0;  // exact bytes carried by the check; 0: the exact part is reduced apart
  bool fused_p = false;    // the first P is carried by the check
  {
    bool one_dtype = true;
    size_t bytes = 0;
    DType exact_dtype = DType::kFloat32;
    for (size_t i : exact) {
      const Buffer& b = tensors[i].data;
      if (b.count == 0) continue;
      if (bytes == 0) exact_dtype = b.dtype;
      one_dtype &= b.dtype == exact_dtype;
      bytes += b.bytes();
    }
    if (W > 1 && one_dtype && !device.is_cuda()) {
      const size_t limit = EagerCollectiveMaxBytes(W);
      const size_t with_exact = kCheckBytes + RoundUpTo8(bytes);
      if (with_exact <= limit) fused_bytes = bytes;
      fused_p = !plans.empty() && with_exact + p_total * sizeof(float) <= limit;
    }
  }
  // ---- NaN/Inf scan (one pass per tensor) ----
  // A float32 matrix whose first P is computed before the check is scanned by that product,
  // in the same pass over the gradient (below); every other tensor here.
  const bool scan = options_.nonfinite != NonFinitePolicy::kUnchecked;
  std::vector<char> is_nonfinite(tensors.size(), 0);
  auto scan_apart = [&](size_t i) { is_nonfinite[i] = scan && !backend.AllFinite(tensors[i].data); };
  for (size_t i : exact) scan_apart(i);
  for (const Plan& p : plans) {
    if (!fused_p || tensors[p.index].data.dtype != DType::kFloat32) scan_apart(p.index);
  }
  if (fused_p) {
    // The first P reads Q and the error memory on the CPU; a key whose state an earlier call
    // left on a GPU moves now rather than in the set-up below (same values, other memory).
    for (const Plan& p : plans) {
      auto it = states_.find(tensors[p.index].key);
      if (it != states_.end()) it->second->MoveTo(*cpu_);
    }
  }
  // Keys without a warm-started Q start from InitialQ: drawn once per call, here when the first
  // P is computed before the check, and reused when the state is set up.
  std::vector<std::vector<float>> initial_q(plans.size());
  auto initial_q_for = [&](size_t j) -> const std::vector<float>& {
    const Plan& p = plans[j];
    if (initial_q[j].empty()) {
      auto it = states_.find(tensors[p.index].key);
      initial_q[j] = InitialQ(options_, tensors[p.index].key, p.m, p.r, it == states_.end() ? 0 : it->second->steps);
    }
    return initial_q[j];
  };
  // Each rank's slot: the check fields, then its exact data, padded so every slot (and so
  // every rank's copy of the data) stays 8-byte aligned.
  const size_t p_offset_bytes = kCheckBytes + RoundUpTo8(fused_bytes);
  const size_t slot_words = (p_offset_bytes + (fused_p ? p_total * sizeof(float) : 0) + 7) / sizeof(int64_t);
  std::vector<int64_t> mine(slot_words, 0), table(slot_words * W);
  mine[kFingerprint] = static_cast<int64_t>(fp.h);
  mine[kOptions] = static_cast<int64_t>(OptionsHash(options_));
  mine[kTensors] = static_cast<int64_t>(tensors.size());
  mine[kElements] = static_cast<int64_t>(total_elements);
  if (fused_bytes > 0) {
    uint8_t* out = reinterpret_cast<uint8_t*>(mine.data()) + kCheckBytes;
    for (size_t i : exact) {
      const Buffer& b = tensors[i].data;
      if (b.count) std::memcpy(out, b.data, b.bytes());
      out += b.bytes();
    }
  }
  if (fused_p) {
    float* first_p = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(mine.data()) + p_offset_bytes);
    for (size_t j = 0; j < plans.size(); ++j) {
      Plan& p = plans[j];
      const GradientTensor& t = tensors[p.index];
      auto it = states_.find(t.key);
      const State* s = it == states_.end() ? nullptr : it->second.get();
      const size_t mr = static_cast<size_t>(p.m * p.r);
      const float* q = s && s->q && s->q_count == mr && options_.warm_start ? s->q_ptr() : initial_q_for(j).data();
      const float* error = options_.use_error_feedback && s && s->error ? s->error_ptr() : nullptr;
      if (t.data.dtype == DType::kFloat32) {
        bool finite = true;
        cpu_->MultiplyMQ(static_cast<const float*>(t.data.data), error, q, first_p + p.p_offset, p.n, p.m, p.r,
                         scan ? &finite : nullptr);
        is_nonfinite[p.index] = !finite;
      } else {
        // M goes to a scratch anyway for these dtypes; the gradient stays untouched.
        p.scratch = cpu_->Alloc(static_cast<size_t>(p.n * p.m) * sizeof(float), /*zero=*/false);
        p.M = cpu_->LoadMatrix(t.data, error, static_cast<float*>(p.scratch.get()));
        cpu_->MultiplyMQ(p.M, nullptr, q, first_p + p.p_offset, p.n, p.m, p.r, nullptr);
      }
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!is_nonfinite[i]) continue;
    ++nonfinite;
    if (nonfinite <= 5) absl::StrAppend(&nonfinite_keys, nonfinite > 1 ? ", " : "", "\"", tensors[i].key, "\"");
  }
  mine[kNonFinite] = static_cast<int64_t>(nonfinite);
  try {
    comm.allgather(CpuBuffer(mine.data(), mine.size()), CpuBuffer(table.data(), table.size()))->wait();
  } catch (const MismatchError&) {
    // Ranks sent slots of different sizes (their tensor lists differ): the communicator
    // exchanged nothing and raised this on every rank alike, so every rank is here and runs
    // the bare check, which names what differs (or, if nothing does, goes on unfused).
    mine.resize(kNumCheckFields);
    table.assign(kNumCheckFields * W, 0);
    comm.allgather(CpuBuffer(mine.data(), mine.size()), CpuBuffer(table.data(), table.size()))->wait();
    fused_bytes = 0;
    fused_p = false;
  }
  const size_t stride_words = table.size() / W;
  stats.check_bytes = stride_words * sizeof(int64_t) - fused_bytes - (fused_p ? p_total * sizeof(float) : 0);
  auto field = [&](int rank, CheckField f) { return table[rank * stride_words + f]; };
  bool options_differ = false, tensors_differ = false;
  int64_t ranks_nonfinite = 0;
  for (int q = 0; q < W; ++q) {
    options_differ |= field(q, kOptions) != field(0, kOptions);
    tensors_differ |= field(q, kFingerprint) != field(0, kFingerprint);
    ranks_nonfinite += field(q, kNonFinite) > 0;
  }
  if (options_differ) {
    std::string detail;
    for (int q = 0; q < W; ++q) absl::StrAppend(&detail, q ? ", " : "", "rank ", q, ": ", absl::Hex(field(q, kOptions)));
    throw MismatchError(absl::StrCat(where, ": ranks use different PowerSGD options (hashes ", detail,
                                     "); this rank: ", options_.ToString(), "; no data was exchanged"));
  }
  if (tensors_differ) {
    std::string detail;
    for (int q = 0; q < W; ++q) {
      absl::StrAppend(&detail, q ? "; " : "", "rank ", q, ": ", field(q, kTensors), " tensors, ", field(q, kElements),
                      " elements, fingerprint ", absl::Hex(field(q, kFingerprint)));
    }
    throw MismatchError(absl::StrCat(where,
                                     ": ranks disagree on the tensor list (keys, order, shapes, dtypes or per-key step "
                                     "counts): ",
                                     detail, "; no data was exchanged"));
  }
  if (ranks_nonfinite > 0) {
    stats.nonfinite_calls = 1;
    if (options_.nonfinite == NonFinitePolicy::kError) {
      std::string detail;
      for (int q = 0; q < W; ++q) {
        if (field(q, kNonFinite) > 0) absl::StrAppend(&detail, detail.empty() ? "" : ", ", "rank ", q, ": ", field(q, kNonFinite));
      }
      throw InvalidArgumentError(absl::StrCat(where, ": NaN or Inf in the input (tensors with NaN/Inf per rank: ", detail,
                                              nonfinite_keys.empty() ? "" : absl::StrCat("; here: ", nonfinite_keys),
                                              "); nothing was reduced and the PowerSGD state is unchanged"));
    }
    // Pass-through: an exact average of everything, state untouched.
    std::vector<size_t> all(tensors.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    Exact(comm, tensors, all, stats);
    last_ = stats;
    total_.Add(stats);
    return stats;
  }

  // ---- state for every key (created now that the call is known to be consistent) ----
  for (const GradientTensor& t : tensors) {
    auto& s = states_[t.key];
    if (!s) {
      s = std::make_unique<State>();
      s->shape = t.shape;
      s->dtype = t.data.dtype;
      s->backend = &backend;
    }
  }

  // ---- exact part ----
  if (fused_bytes > 0) {
    ReduceGatheredExact(tensors, exact, reinterpret_cast<const uint8_t*>(table.data()), stride_words * sizeof(int64_t),
                        kCheckBytes, W, stats);
  } else {
    Exact(comm, tensors, exact, stats);
  }

  // ---- compressed part ----
  if (!plans.empty()) {
    for (Plan& p : plans) p.state = states_[tensors[p.index].key].get();
    stats.compressed_tensors = plans.size();
    float* P = static_cast<float*>(Pack(backend, kPSlot, p_total * sizeof(float)));
    float* Q = static_cast<float*>(Pack(backend, kQSlot, q_total * sizeof(float)));
    const float eps = static_cast<float>(options_.orthogonalization_epsilon);

    for (size_t j = 0; j < plans.size(); ++j) {
      Plan& p = plans[j];
      const GradientTensor& t = tensors[p.index];
      State& s = *p.state;
      s.MoveTo(backend);
      const size_t nm = static_cast<size_t>(p.n * p.m), mr = static_cast<size_t>(p.m * p.r);
      if (!s.q || s.q_count != mr || !options_.warm_start) {
        const std::vector<float>& host = initial_q_for(j);
        if (!s.q || s.q_count != mr) s.q = backend.Alloc(mr * sizeof(float));
        s.q_count = mr;
        backend.Upload(host.data(), s.q.get(), mr * sizeof(float));
      }
      if (options_.use_error_feedback && !s.error) {
        s.error = backend.Alloc(nm * sizeof(float));
        s.error_count = nm;
      }
      if (p.M != nullptr) continue;  // loaded into its scratch before the check
      if (t.data.dtype == DType::kFloat32 && !backend.device().is_cuda()) {
        p.M = static_cast<float*>(t.data.data);
        p.pending_error = options_.use_error_feedback ? s.error_ptr() : nullptr;
        continue;
      }
      if (t.data.dtype != DType::kFloat32) p.scratch = backend.Alloc(nm * sizeof(float), /*zero=*/false);
      p.M = backend.LoadMatrix(t.data, options_.use_error_feedback ? s.error_ptr() : nullptr,
                               static_cast<float*>(p.scratch.get()));
    }

    for (int it = 0; it < options_.num_iters_per_step; ++it) {
      if (it == 0 && fused_p) {
        // Every rank's first P came with the check: sum them in rank order, as the
        // all-reduce would have.
        std::vector<const void*> sources(W);
        for (int r = 0; r < W; ++r) {
          sources[r] = reinterpret_cast<const uint8_t*>(table.data()) + r * stride_words * sizeof(int64_t) + p_offset_bytes;
        }
        WideScratch unused;  // float32 needs no widening
        ReduceInRankOrder(sources, Buffer{P, p_total, DType::kFloat32, Device::CPU()}, ReduceOp::kSum, unused);
      } else {
        for (Plan& p : plans) {
          const float* q_in = it == 0 ? p.state->q_ptr() : Q + p.q_offset;
          backend.MultiplyMQ(p.M, p.pending_error, q_in, P + p.p_offset, p.n, p.m, p.r, nullptr);
        }
        backend.Synchronize();
        comm.allreduce(Buffer{P, p_total, DType::kFloat32, backend.device()}, ReduceOp::kSum)->wait();
        stats.allreduce_calls += 1;
      }
      for (Plan& p : plans) {
        backend.Orthogonalize(P + p.p_offset, p.n, p.r, eps);
        backend.MultiplyMtP(p.M, p.pending_error, P + p.p_offset, Q + p.q_offset, p.n, p.m, p.r);
        p.pending_error = nullptr;  // M is grad + error from here on
      }
      backend.Synchronize();
      comm.allreduce(Buffer{Q, q_total, DType::kFloat32, backend.device()}, ReduceOp::kAvg)->wait();
      stats.allreduce_calls += 1;
      stats.elements_after += p_total + q_total;
      stats.bytes_after += (p_total + q_total) * sizeof(float);
    }

    for (Plan& p : plans) {
      State& s = *p.state;
      backend.Finish(p.M, P + p.p_offset, Q + p.q_offset, p.n, p.m, p.r,
                     options_.use_error_feedback ? s.error_ptr() : nullptr, tensors[p.index].data);
      backend.Copy(s.q.get(), Q + p.q_offset, s.q_count * sizeof(float));
    }
    backend.Synchronize();
  }

  for (const GradientTensor& t : tensors) ++states_[t.key]->steps;
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
  const State& s = *it->second;
  out->shape = s.shape;
  out->dtype = s.dtype;
  out->steps = s.steps;
  out->error = s.error ? s.Download(s.error, s.error_count) : std::vector<float>();
  out->q = s.q ? s.Download(s.q, s.q_count) : std::vector<float>();
  return true;
}

void PowerSGD::LoadState(const PowerSGDCheckpoint& c) {
  auto invalid = [](const std::string& why) { throw InvalidArgumentError("PowerSGD::LoadState: " + why); };
  if (c.options.matrix_approximation_rank != options_.matrix_approximation_rank) {
    invalid(absl::StrCat("the checkpoint has rank ", c.options.matrix_approximation_rank, ", this object rank ",
                         options_.matrix_approximation_rank));
  }
  if (c.options.use_error_feedback != options_.use_error_feedback) {
    invalid("the checkpoint and this object differ in use_error_feedback");
  }
  std::map<std::string, std::unique_ptr<State>> loaded;
  for (const auto& [key, t] : c.tensors) {
    int64_t signed_numel = 0;
    const std::string problem = ShapeProblem(t.shape, &signed_numel);
    if (!problem.empty()) invalid(absl::StrCat("key \"", key, "\": ", problem));
    const uint64_t numel = static_cast<uint64_t>(signed_numel);
    if (!IsFloatingPoint(t.dtype)) invalid(absl::StrCat("key \"", key, "\" has a non-float dtype"));
    if (t.steps < 0) invalid(absl::StrCat("key \"", key, "\" has a negative step count"));
    uint64_t m = 0, r = 0;
    if (t.shape.size() >= 2 && numel > 0) {
      const uint64_t n = static_cast<uint64_t>(t.shape[0]);
      m = numel / n;
      r = std::min<uint64_t>({n, m, static_cast<uint64_t>(options_.matrix_approximation_rank)});
    }
    if (!t.error.empty() && t.error.size() != numel) {
      invalid(absl::StrCat("key \"", key, "\": error memory has ", t.error.size(), " elements, shape ",
                           ShapeString(t.shape), " needs ", numel));
    }
    if (!t.q.empty() && t.q.size() != m * r) {
      invalid(absl::StrCat("key \"", key, "\": Q has ", t.q.size(), " elements, ", m, " x ", r, " expected"));
    }
    auto s = std::make_unique<State>();
    s->shape = t.shape;
    s->dtype = t.dtype;
    s->steps = t.steps;
    s->backend = cpu_.get();
    auto put = [&](const std::vector<float>& v, std::shared_ptr<void>& a, size_t& count) {
      if (v.empty()) return;
      a = cpu_->Alloc(v.size() * sizeof(float));
      cpu_->Upload(v.data(), a.get(), v.size() * sizeof(float));
      count = v.size();
    };
    put(t.error, s->error, s->error_count);
    put(t.q, s->q, s->q_count);
    loaded[key] = std::move(s);
  }
  states_ = std::move(loaded);
}

namespace {

constexpr char kMagic[8] = {'G', 'S', 'P', 'S', 'G', 'D', '0', '1'};

class Writer {
 public:
  template <typename T>
  void Pod(T v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
  void Str(const std::string& s) {
    Pod<uint64_t>(s.size());
    out += s;
  }
  void Floats(const std::vector<float>& v) {
    Pod<uint64_t>(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  void Need(uint64_t n) {
    if (n > s_.size() - pos_) throw InvalidArgumentError(absl::StrCat("PowerSGD checkpoint truncated at byte ", pos_, " of ", s_.size()));
  }
  template <typename T>
  T Pod() {
    Need(sizeof(T));
    T v;
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string Str() {
    const uint64_t n = Pod<uint64_t>();
    Need(n);
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::vector<float> Floats() {
    const uint64_t n = Pod<uint64_t>();
    if (n > (s_.size() - pos_) / sizeof(float)) {
      throw InvalidArgumentError(absl::StrCat("PowerSGD checkpoint truncated: ", n, " floats announced at byte ", pos_,
                                              " of ", s_.size()));
    }
    std::vector<float> v(n);
    if (n) std::memcpy(v.data(), s_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return v;
  }
  bool AtEnd() const { return pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

std::string PowerSGDCheckpoint::Serialize() const {
  Writer w;
  w.out.append(kMagic, sizeof(kMagic));
  w.Str(options.ToString());
  w.Pod<uint64_t>(tensors.size());
  for (const auto& [key, t] : tensors) {
    w.Str(key);
    w.Pod<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.Pod<uint64_t>(t.shape.size());
    for (int64_t d : t.shape) w.Pod<int64_t>(d);
    w.Pod<int64_t>(t.steps);
    w.Floats(t.error);
    w.Floats(t.q);
  }
  return w.out;
}

PowerSGDCheckpoint PowerSGDCheckpoint::Deserialize(const std::string& bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    throw InvalidArgumentError("not a PowerSGD checkpoint (magic GSPSGD01 missing)");
  }
  Reader r(bytes);
  for (size_t i = 0; i < sizeof(kMagic); ++i) r.Pod<char>();
  PowerSGDCheckpoint c;
  c.options = ParsePowerSGDOptions(r.Str());
  const uint64_t count = r.Pod<uint64_t>();
  for (uint64_t i = 0; i < count; ++i) {
    std::string key = r.Str();
    PowerSGDTensorState t;
    const uint8_t dtype = r.Pod<uint8_t>();
    if (dtype >= kNumDTypes) throw InvalidArgumentError(absl::StrCat("PowerSGD checkpoint: bad dtype ", dtype));
    t.dtype = static_cast<DType>(dtype);
    const uint64_t dims = r.Pod<uint64_t>();
    if (dims > 64) throw InvalidArgumentError(absl::StrCat("PowerSGD checkpoint: ", dims, " dimensions"));
    for (uint64_t d = 0; d < dims; ++d) t.shape.push_back(r.Pod<int64_t>());
    t.steps = r.Pod<int64_t>();
    t.error = r.Floats();
    t.q = r.Floats();
    c.tensors[key] = std::move(t);
  }
  if (!r.AtEnd()) throw InvalidArgumentError("PowerSGD checkpoint has trailing bytes");
  return c;
}

}  // namespace compression
}  // namespace gossipcc
