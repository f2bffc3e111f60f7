// libFuzzer target: gossipcc::compression::ParsePowerSGDOptions (compression/power_sgd_options.h).
// The parser must either throw InvalidArgumentError (with the documented message) or return
// options that validate and survive ToString() -> ParsePowerSGDOptions() unchanged (the
// checkpoint format stores them that way). Any other exception, crash or sanitizer report is a
// finding. Run by tools/fuzz.sh; the corpus in corpus/power_sgd_options/ is replayed by
// //tests/fuzz:power_sgd_options_fuzz_replay.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "comm/core/errors.h"
#include "compression/power_sgd_options.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gossipcc::InvalidArgumentError;
  using gossipcc::compression::ParsePowerSGDOptions;
  using gossipcc::compression::PowerSGDOptions;
  const std::string text(reinterpret_cast<const char*>(data), size);
  PowerSGDOptions o;
  try {
    o = ParsePowerSGDOptions(text);
  } catch (const InvalidArgumentError& e) {
    FUZZ_CHECK(text, std::string(e.what()).find("invalid PowerSGD options") == 0, std::string("bad message: ") + e.what());
    // what() is a C string: an input with a NUL byte cuts the message short after the quote.
    FUZZ_CHECK(text, text.find('\0') != std::string::npos || std::string(e.what()).find("valid keys: ") != std::string::npos,
               std::string("message lacks the key list: ") + e.what());
    return 0;
  } catch (const std::exception& e) {
    gossipcc::fuzz::Finding(text, std::string("exception other than InvalidArgumentError: ") + e.what());
  } catch (...) {
    gossipcc::fuzz::Finding(text, "non-std exception");
  }
  try {
    o.Validate();
  } catch (const std::exception& e) {
    gossipcc::fuzz::Finding(text, std::string("parsed options fail Validate(): ") + e.what());
  }
  const std::string s = o.ToString();
  PowerSGDOptions again;
  try {
    again = ParsePowerSGDOptions(s);
  } catch (const std::exception& e) {
    gossipcc::fuzz::Finding(text, "ToString() \"" + s + "\" does not parse back: " + e.what());
  }
  FUZZ_CHECK(text, gossipcc::fuzz::SameOptions(o, again),
             "ToString() \"" + s + "\" parses back to different options \"" + again.ToString() + "\"");
  FUZZ_CHECK(text, again.ToString() == s, "ToString() not stable: \"" + s + "\" vs \"" + again.ToString() + "\"");
  return 0;
}
