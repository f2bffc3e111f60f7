#include "compression/power_sgd_options.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace compression {
namespace {

struct Key {
  const char* name;
  const char* alias;  // PyTorch's PowerSGDState name
  const char* help;
};

const Key kKeys[] = {
    {"rank", "matrix_approximation_rank", "int in [1, 1048576]"},
    {"start_iter", "start_powerSGD_iter", "int >= 0"},
    {"min_compression_rate", "min_compression_rate", "number >= 0"},
    {"error_feedback", "use_error_feedback", "0|1"},
    {"warm_start", "warm_start", "0|1"},
    {"epsilon", "orthogonalization_epsilon", "number >= 0"},
    {"seed", "random_seed", "int >= 0"},
    {"batch_same_shape", "batch_tensors_with_same_shape", "0; 1 is rejected"},
    {"iterations", "num_iters_per_step", "int in [1, 1000]"},
    {"nonfinite", "nonfinite", "pass|error|unchecked"},
};

[[noreturn]] void Fail(const std::string& text, const std::string& why) {
  throw InvalidArgumentError(absl::StrCat("invalid PowerSGD options \"", text, "\": ", why,
                                          "; valid keys: ", PowerSGDOptionKeys()));
}

bool ParseBool(const std::string& text, const std::string& key, const std::string& v) {
  const std::string l = absl::AsciiStrToLower(v);
  if (l == "1" || l == "true") return true;
  if (l == "0" || l == "false") return false;
  Fail(text, absl::StrCat(key, "=", v, " is not a boolean (0, 1, true, false)"));
}

int64_t ParseInt(const std::string& text, const std::string& key, const std::string& v) {
  int64_t out = 0;
  if (!absl::SimpleAtoi(v, &out)) Fail(text, absl::StrCat(key, "=", v, " is not an integer"));
  return out;
}

double ParseDouble(const std::string& text, const std::string& key, const std::string& v) {
  double out = 0;
  if (!absl::SimpleAtod(v, &out) || !std::isfinite(out)) Fail(text, absl::StrCat(key, "=", v, " is not a finite number"));
  return out;
}

// The shortest %g form (6 significant digits, as absl::StrCat, when that is exact) that parses
// back to exactly `v`, so ToString() round-trips: checkpoints store the options as text, and the
// cross-rank check hashes the doubles' bits.
std::string ExactDouble(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    double back = 0;
    if (absl::SimpleAtod(buf, &back) && std::memcmp(&back, &v, sizeof(v)) == 0) break;
  }
  return buf;
}

}  // namespace

const char* const kBatchSameShapeRejected =
    "batch_tensors_with_same_shape (batch_same_shape) = 1 is rejected: it would not cut collectives here, since "
    "every PowerSGD call already all-reduces the P factors of all its matrices in one all-reduce and their Q "
    "factors in another, whatever their shapes; PyTorch's option only stacks same-shape matrices into batched "
    "GEMMs to save GPU kernel launches, and here the local products run one matrix after the other (on the CPU "
    "with row-blocked kernels and Eigen, on CUDA with a cuBLAS call each). Leave it 0 (the default, as in PyTorch)";

const char* NonFinitePolicyName(NonFinitePolicy policy) {
  switch (policy) {
    case NonFinitePolicy::kPassThrough: return "pass";
    case NonFinitePolicy::kError: return "error";
    case NonFinitePolicy::kUnchecked: return "unchecked";
  }
  return "?";
}

std::string PowerSGDOptionKeys() {
  std::string out;
  for (const Key& k : kKeys) {
    if (!out.empty()) out += ", ";
    absl::StrAppend(&out, k.name);
    if (std::string(k.alias) != k.name) absl::StrAppend(&out, " (or ", k.alias, ")");
    absl::StrAppend(&out, " [", k.help, "]");
  }
  return out;
}

void PowerSGDOptions::Validate() const {
  auto fail = [](const std::string& why) { throw InvalidArgumentError("invalid PowerSGD options: " + why); };
  if (matrix_approximation_rank < 1) {
    fail(absl::StrCat("matrix_approximation_rank (rank) must be >= 1, got ", matrix_approximation_rank));
  }
  if (start_powerSGD_iter < 0) fail(absl::StrCat("start_powerSGD_iter (start_iter) must be >= 0, got ", start_powerSGD_iter));
  if (!std::isfinite(min_compression_rate) || min_compression_rate < 0) {
    fail(absl::StrCat("min_compression_rate must be a finite number >= 0, got ", min_compression_rate));
  }
  if (!std::isfinite(orthogonalization_epsilon) || orthogonalization_epsilon < 0) {
    fail(absl::StrCat("orthogonalization_epsilon (epsilon) must be a finite number >= 0, got ", orthogonalization_epsilon));
  }
  if (batch_tensors_with_same_shape) fail(kBatchSameShapeRejected);
  if (num_iters_per_step < 1) fail(absl::StrCat("num_iters_per_step (iterations) must be >= 1, got ", num_iters_per_step));
  if (nonfinite != NonFinitePolicy::kPassThrough && nonfinite != NonFinitePolicy::kError &&
      nonfinite != NonFinitePolicy::kUnchecked) {
    fail("nonfinite must be pass, error or unchecked");
  }
}

std::string PowerSGDOptions::ToString() const {
  return absl::StrCat("rank=", matrix_approximation_rank, ",start_iter=", start_powerSGD_iter,
                      ",min_compression_rate=", ExactDouble(min_compression_rate), ",error_feedback=", use_error_feedback ? 1 : 0,
                      ",warm_start=", warm_start ? 1 : 0, ",epsilon=", ExactDouble(orthogonalization_epsilon), ",seed=", random_seed,
                      ",batch_same_shape=", batch_tensors_with_same_shape ? 1 : 0, ",iterations=", num_iters_per_step,
                      ",nonfinite=", NonFinitePolicyName(nonfinite));
}

PowerSGDOptions ParsePowerSGDOptions(const std::string& text) {
  PowerSGDOptions o;
  std::set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::string item(absl::StripAsciiWhitespace(raw));
    const size_t eq = item.find('=');
    if (eq == std::string::npos) Fail(text, absl::StrCat("\"", item, "\" is not key=value"));
    std::string key(absl::StripAsciiWhitespace(item.substr(0, eq)));
    const std::string value(absl::StripAsciiWhitespace(item.substr(eq + 1)));
    // Keys match whatever their case ("Rank", "start_powerSGD_iter", "START_ITER").
    const std::string lower = absl::AsciiStrToLower(key);
    const Key* found = nullptr;
    for (const Key& k : kKeys) {
      if (lower == absl::AsciiStrToLower(k.name) || lower == absl::AsciiStrToLower(k.alias)) found = &k;
    }
    if (found == nullptr) Fail(text, absl::StrCat("unknown key \"", key, "\""));
    if (!seen.insert(found->name).second) Fail(text, absl::StrCat("key \"", found->name, "\" given twice"));
    if (value.empty()) Fail(text, absl::StrCat("key \"", key, "\" has no value"));
    const std::string name = found->name;
    if (name == "rank") {
      const int64_t v = ParseInt(text, key, value);
      if (v < 1 || v > (1 << 20)) Fail(text, absl::StrCat("rank must be in [1, 1048576], got ", value));
      o.matrix_approximation_rank = static_cast<int>(v);
    } else if (name == "start_iter") {
      o.start_powerSGD_iter = ParseInt(text, key, value);
    } else if (name == "min_compression_rate") {
      o.min_compression_rate = ParseDouble(text, key, value);
    } else if (name == "error_feedback") {
      o.use_error_feedback = ParseBool(text, key, value);
    } else if (name == "warm_start") {
      o.warm_start = ParseBool(text, key, value);
    } else if (name == "epsilon") {
      o.orthogonalization_epsilon = ParseDouble(text, key, value);
    } else if (name == "seed") {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) Fail(text, absl::StrCat(key, "=", value, " is not an unsigned integer"));
      o.random_seed = v;
    } else if (name == "batch_same_shape") {
      // Kept as a key (not "unknown key") so that PyTorch users learn why 1 is refused.
      if (ParseBool(text, key, value)) Fail(text, kBatchSameShapeRejected);
      o.batch_tensors_with_same_shape = false;
    } else if (name == "iterations") {
      const int64_t v = ParseInt(text, key, value);
      if (v < 1 || v > 1000) Fail(text, absl::StrCat("iterations must be in [1, 1000], got ", value));
      o.num_iters_per_step = static_cast<int>(v);
    } else if (name == "nonfinite") {
      const std::string l = absl::AsciiStrToLower(value);
      if (l == "pass") o.nonfinite = NonFinitePolicy::kPassThrough;
      else if (l == "error") o.nonfinite = NonFinitePolicy::kError;
      else if (l == "unchecked") o.nonfinite = NonFinitePolicy::kUnchecked;
      else Fail(text, absl::StrCat("nonfinite=", value, " is not one of pass, error, unchecked"));
    }
  }
  try {
    o.Validate();
  } catch (const InvalidArgumentError& e) {
    Fail(text, e.what());
  }
  return o;
}

}  // namespace compression
}  // namespace gossipcc
