#include "torch_backend/allreduce_policy.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace torch_backend {
namespace {

constexpr char kValidPolicies[] =
    "valid policies: \"exact\", \"powersgd\" or \"powersgd:key=value,...\" (see docs/pytorch.md)";

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

AllreducePolicy AllreducePolicy::Parse(const std::string& text) {
  const std::string trimmed = Trim(text);
  AllreducePolicy policy;
  if (trimmed.empty() || absl::AsciiStrToLower(trimmed) == "exact") return policy;
  const size_t colon = trimmed.find(':');
  const std::string name = absl::AsciiStrToLower(Trim(trimmed.substr(0, colon)));
  if (name == "exact") {
    throw InvalidArgumentError("gossipcc allreduce policy \"" + text + "\": \"exact\" takes no options; " +
                               kValidPolicies);
  }
  if (name != "powersgd") {
    throw InvalidArgumentError("gossipcc allreduce policy \"" + text + "\": unknown policy \"" + name + "\"; " +
                               kValidPolicies);
  }
  policy.kind = Kind::kPowerSGD;
  const std::string options = colon == std::string::npos ? "" : Trim(trimmed.substr(colon + 1));
  try {
    policy.powersgd = compression::ParsePowerSGDOptions(options);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError("gossipcc allreduce policy \"" + text + "\": " + e.what());
  }
  return policy;
}

std::string AllreducePolicy::ToString() const {
  if (kind == Kind::kExact) return "exact";
  return "powersgd:" + powersgd.ToString();
}

std::string AllreducePolicy::Describe() const {
  if (kind == Kind::kExact) return "exact";
  // ToString() lists every option in a fixed order: keep those unlike the defaults'.
  const std::vector<std::string> mine = absl::StrSplit(powersgd.ToString(), ',');
  const std::vector<std::string> defaults = absl::StrSplit(compression::PowerSGDOptions().ToString(), ',');
  std::vector<std::string> changed;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (i >= defaults.size() || mine[i] != defaults[i]) changed.push_back(mine[i]);
  }
  return changed.empty() ? "powersgd" : "powersgd:" + absl::StrJoin(changed, ",");
}

}  // namespace torch_backend
}  // namespace gossipcc
