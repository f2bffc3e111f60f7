#include "compression/power_sgd_checkpoint.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace compression {
namespace internal {

PowerSGDTensorState SaveKeyState(const KeyState& s) {
  PowerSGDTensorState out;
  out.shape = s.shape;
  out.dtype = s.dtype;
  out.steps = s.steps;
  out.error = s.error ? s.Download(s.error, s.error_count) : std::vector<float>();
  out.q = s.q ? s.Download(s.q, s.q_count) : std::vector<float>();
  return out;
}

KeyStates LoadKeyStates(const PowerSGDCheckpoint& c, const PowerSGDOptions& options, MathBackend& cpu) {
  auto invalid = [](const std::string& why) { throw InvalidArgumentError("PowerSGD::LoadState: " + why); };
  if (c.options.matrix_approximation_rank != options.matrix_approximation_rank) {
    invalid(absl::StrCat("the checkpoint has rank ", c.options.matrix_approximation_rank, ", this object rank ",
                         options.matrix_approximation_rank));
  }
  if (c.options.use_error_feedback != options.use_error_feedback) {
    invalid("the checkpoint and this object differ in use_error_feedback");
  }
  KeyStates loaded;
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
      r = std::min<uint64_t>({n, m, static_cast<uint64_t>(options.matrix_approximation_rank)});
    }
    if (!t.error.empty() && t.error.size() != numel) {
      invalid(absl::StrCat("key \"", key, "\": error memory has ", t.error.size(), " elements, shape ",
                           ShapeString(t.shape), " needs ", numel));
    }
    if (!t.q.empty() && t.q.size() != m * r) {
      invalid(absl::StrCat("key \"", key, "\": Q has ", t.q.size(), " elements, ", m, " x ", r, " expected"));
    }
    auto s = std::make_unique<KeyState>();
    s->shape = t.shape;
    s->dtype = t.dtype;
    s->steps = t.steps;
    s->backend = &cpu;
    auto put = [&](const std::vector<float>& v, std::shared_ptr<void>& a, size_t& count) {
      if (v.empty()) return;
      a = cpu.Alloc(v.size() * sizeof(float));
      cpu.Upload(v.data(), a.get(), v.size() * sizeof(float));
      count = v.size();
    };
    put(t.error, s->error, s->error_count);
    put(t.q, s->q, s->q_count);
    loaded[key] = std::move(s);
  }
  return loaded;
}

}  // namespace internal

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
