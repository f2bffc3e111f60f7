// How the gossipcc backend all-reduces DDP's gradient buckets, parsed from a string such as
// "exact" or "powersgd:rank=2,start_iter=10" (the GOSSIPCC_ALLREDUCE environment variable or
// the backend's options). Torch-free so it can be fuzzed and tested without LibTorch.
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

  // Parses "exact" or "powersgd[:key=value,...]", names and keys in any case ("POWERSGD:Rank=2").
  // Throws InvalidArgumentError that quotes the bad part and lists the valid policies and keys.
  // Unset PowerSGD options keep PyTorch's PowerSGDState defaults (rank=1, start_iter=1000, ...).
  static AllreducePolicy Parse(const std::string& text);
  // The normal form, every option spelt out: "powersgd:rank=2,start_iter=1000,...".
  std::string ToString() const;
  // The short normal form: only the options that differ from the defaults ("powersgd:rank=2").
  // Equal policies, and only those, have equal short forms.
  std::string Describe() const;
};

}  // namespace torch_backend
}  // namespace gossipcc
