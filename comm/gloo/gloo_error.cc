#include "comm/gloo/gloo_error.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {

void RethrowGlooError(const std::string& context, const std::exception& e) {
  const std::string what = e.what();
  if (absl::StrContains(what, "Timed out") || absl::StrContains(what, "timeout") ||
      absl::StrContains(what, "Timeout")) {
    throw TimeoutError(absl::StrCat(context, ": timed out: ", what));
  }
  if (dynamic_cast<const CommError*>(&e) != nullptr) {
    throw CommError(absl::StrCat(context, ": ", what));
  }
  throw PeerError(absl::StrCat(context, ": transport error: ", what));
}

}  // namespace gossipcc
