// How the gossipcc backend averages DDP's buckets: "exact" or "powersgd[:key=value,...]"
// (GOSSIPCC_ALLREDUCE or the backend's options). Torch-free, so it can be fuzzed.
#pragma once

#include <string>

#include "compression/power_sgd_options.h"


namespace gossipcc {
namespace torch_backend {

struct AllreducePolicy {
  enum class Kind { kExact, kPowerSGD };
  Kind kind = Kind::kExact;
  // Parsed by PowerSGD's own option parser (compression/power_sgd_options.h), so the keys,
  // ranges and error messages are PowerSGD's.
  compression::PowerSGDOptions powersgd;

  // Case-insensitive; InvalidArgumentError quoting the bad part and listing the valid ones.
  static AllreducePolicy Parse(const std::string& text);
  // The normal form, every option spelt out: "powersgd:rank=2,start_iter=1000,...".
  std::string ToString() const;
  // The short normal form: only the options that differ from the defaults ("powersgd:rank=2").
  // Equal policies, and only those, have equal short forms.
  std::string Describe() const;
};

}  // namespace torch_backend
}  // namespace gossipcc
