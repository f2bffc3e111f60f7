// libFuzzer target: gossipcc::torch_backend::AllreducePolicy::Parse
// (torch_backend/allreduce_policy.h, torch-free). Parse must either throw InvalidArgumentError
// quoting the policy, or return a policy whose ToString() parses back to the same policy. Any
// other exception, crash or sanitizer report is a finding. Run by tools/fuzz.sh; the corpus in
// corpus/allreduce_policy/ is replayed by //tests/fuzz:allreduce_policy_fuzz_replay.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "comm/core/errors.h"
#include "tests/fuzz/fuzz_check.h"
#include "torch_backend/allreduce_policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gossipcc::InvalidArgumentError;
  using gossipcc::torch_backend::AllreducePolicy;
  const std::string text(reinterpret_cast<const char*>(data), size);
  AllreducePolicy p;
  try {
    p = AllreducePolicy::Parse(text);
  } catch (const InvalidArgumentError& e) {
    FUZZ_CHECK(text, std::string(e.what()).find("gossipcc allreduce policy \"") == 0,
               std::string("bad message: ") + e.what());
    return 0;
  } catch (const std::exception& e) {
    gossipcc::fuzz::Finding(text, std::string("exception other than InvalidArgumentError: ") + e.what());
  } catch (...) {
    gossipcc::fuzz::Finding(text, "non-std exception");
  }
  const std::string s = p.ToString();
  AllreducePolicy again;
  try {
    again = AllreducePolicy::Parse(s);
  } catch (const std::exception& e) {
    gossipcc::fuzz::Finding(text, "ToString() \"" + s + "\" does not parse back: " + e.what());
  }
  FUZZ_CHECK(text, again.kind == p.kind, "ToString() \"" + s + "\" parses back to another kind");
  if (p.kind == AllreducePolicy::Kind::kPowerSGD) {
    FUZZ_CHECK(text, gossipcc::fuzz::SameOptions(p.powersgd, again.powersgd),
               "ToString() \"" + s + "\" parses back to different options \"" + again.ToString() + "\"");
  }
  FUZZ_CHECK(text, again.ToString() == s, "ToString() not stable: \"" + s + "\" vs \"" + again.ToString() + "\"");
  return 0;
}
