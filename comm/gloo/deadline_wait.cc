#include "comm/gloo/deadline_wait.h"

#include <gloo/transport/tcp/buffer.h>
#include <gloo/transport/tcp/pair.h>

#include <condition_variable>
#include <exception>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace gossipcc {

namespace {

// A TCP bound buffer's completion counts, lock, condition variables and error, and its pair's
// failure, all protected in Gloo: read here through pointers to members named in a derived
// class (which C++ permits for protected members; nothing of these types is constructed) so
// that WaitBoundBuffer waits on them as Buffer::waitRecv / waitSend do, under the same lock.
// Debian's Gloo (bookworm's 2022-05 and trixie's 2023-12 snapshots have the same tcp/buffer.h;
// tcp/pair.h needs third_party:gloo_missing_headers): a Gloo that renamed them fails to compile
// here.
namespace tcp = gloo::transport::tcp;
struct TcpBufferState : tcp::Buffer {
  static std::mutex& Mutex(tcp::Buffer& b) { return b.*(&TcpBufferState::m_); }
  static std::condition_variable& Cv(tcp::Buffer& b, BoundBufferWait w) {
    return w == BoundBufferWait::kRecv ? b.*(&TcpBufferState::recvCv_) : b.*(&TcpBufferState::sendCv_);
  }
  // The completion has come, the pair has failed, or (a send) nothing is pending: Gloo's own
  // wait then returns, throws or enforces at once.
  static bool Ready(tcp::Buffer& b, BoundBufferWait w) {
    if (b.*(&TcpBufferState::ex_) != nullptr) return true;
    if (w == BoundBufferWait::kRecv) return b.*(&TcpBufferState::recvCompletions_) > 0;
    return b.*(&TcpBufferState::sendCompletions_) > 0 || (b.*(&TcpBufferState::sendPending_)).load() == 0;
  }
  static tcp::Pair& PairOf(tcp::Buffer& b) { return *(b.*(&TcpBufferState::pair_)); }
};
struct TcpPairState : tcp::Pair {
  static bool IsSync(tcp::Pair& p) { return (p.*(&TcpPairState::isSync))(); }
  static std::exception_ptr Fail(tcp::Pair& p, const std::string& message) {
    return (p.*(&TcpPairState::signalExceptionExternal))(message);
  }
};

}  // namespace

void WaitBoundBuffer(gloo::transport::Buffer& buffer, BoundBufferWait which,
                     std::chrono::steady_clock::time_point deadline, const std::string& what) {
  auto* b = dynamic_cast<tcp::Buffer*>(&buffer);
  if (b != nullptr && !TcpPairState::IsSync(TcpBufferState::PairOf(*b))) {
    std::unique_lock<std::mutex> lock(TcpBufferState::Mutex(*b));
    if (!TcpBufferState::Cv(*b, which).wait_until(lock, deadline, [&] { return TcpBufferState::Ready(*b, which); })) {
      lock.unlock();  // as Gloo does: the pair's lock is taken without the buffer's
      const char* kind = which == BoundBufferWait::kRecv ? "Read" : "Write";
      std::rethrow_exception(TcpPairState::Fail(
          TcpBufferState::PairOf(*b), absl::StrCat(kind, " timeout at the operation's deadline: ", what)));
    }
  }
  if (which == BoundBufferWait::kRecv) {
    buffer.waitRecv();  // at once (or the pair's error)
  } else {
    buffer.waitSend();
  }
}

}  // namespace gossipcc
