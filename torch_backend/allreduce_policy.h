// How the gossipcc backend all-reduces DDP's gradient buckets, parsed from a string such as
// "exact" or "powersgd:rank=2,start_iter=10" (the GOSSIPCC_ALLREDUCE environment variable or
// the backend's options). Torch-free so it can be fuzzed and tested without LibTorch.
#pragma once

#include <string>


namespace gossipcc {
namespace torch_backend {

struct AllreducePolicy {
  enum class Kind { kExact, kPowerSGD };
  Kind kind = Kind::kExact;
  // The "key=value,..." part after "powersgd:", validated by PowerSGD's own option parser.
  std::string powersgd_options;

  // Parses "exact" or "powersgd[:key=value,...]". Throws InvalidArgumentError that quotes
  // the bad part and lists the valid policies and keys.
  static AllreducePolicy Parse(const std::string& text);
  std::string ToString() const;
};

}  // namespace torch_backend
}  // namespace gossipcc
