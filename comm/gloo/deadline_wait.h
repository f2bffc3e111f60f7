// Waits on Gloo's bound buffers that end at an operation's deadline.
#pragma once

#include <chrono>
#include <string>

namespace gloo {
namespace transport {
class Buffer;
}  // namespace transport
}  // namespace gloo

namespace gossipcc {

// Waits for a bound buffer's next receive or send completion as waitRecv()/waitSend() do, but
// until `deadline` (no later than the pair's timeout from now). Missing it fails the pair as
// Gloo's own timeout does and throws that error (RethrowGlooError: a TimeoutError).
enum class BoundBufferWait { kRecv, kSend };
void WaitBoundBuffer(gloo::transport::Buffer& buffer, BoundBufferWait which,
                     std::chrono::steady_clock::time_point deadline, const std::string& what);

}  // namespace gossipcc
