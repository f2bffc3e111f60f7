// Gloo's exceptions as gossipcc's errors.
#pragma once

#include <exception>
#include <string>

namespace gossipcc {

// Rethrows a Gloo exception as TimeoutError or PeerError, prefixed with `context`.
[[noreturn]] void RethrowGlooError(const std::string& context, const std::exception& e);

}  // namespace gossipcc
