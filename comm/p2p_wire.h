// A point-to-point message on the wire (p2p_exchange.h sends and receives them): a 32-byte
// header, which the receiver checks against its own buffer before any payload byte moves,
// then the payload in segments. This file owns the format and the moving of a payload's
// segments, with their progress (TransferProgress); which receive takes which message is
// p2p_exchange.h's (and p2p_turns.h's) job.
//
// A payload larger than the segment size travels as consecutive segments: offset/length
// operations on one Gloo buffer, all posted at once by the sender; the header carries the
// segment size, and the receiver posts the same cuts, from the header's sender only, a few at
// a time (kReceiveWindow). Gloo matches a pair's operations on one slot in order, so the
// receiver's segments line up with the sender's, and a buffer's operations complete in the
// order they were posted.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/p2p_op.h"
#include "comm/types.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace gossipcc {

constexpr uint64_t kP2PHeaderMagic = 0x676f737369706363ull;  // "gossipcc"

struct P2PHeader {
  uint64_t magic;
  uint64_t count;
  uint32_t tag;
  uint8_t dtype;
  uint8_t pad[3];
  uint32_t segment_bytes;  // the payload travels in segments of this size (0: in one piece)
  uint8_t pad2[4];

  // The header of `send`, whose payload travels in segments of `segment_bytes` (0: whole)
  // when it is larger than that.
  static P2PHeader For(const P2POp& send, size_t segment_bytes);
};
static_assert(sizeof(P2PHeader) == 32, "p2p header layout");

// Null when `header` announces exactly what `receive` expects (count and dtype), else the
// MismatchError the receive fails with (naming both sides; the buffer is left untouched).
std::exception_ptr HeaderMismatch(const P2PHeader& header, const P2POp& receive, const std::string& description);

// A payload cut into consecutive segments of `size` bytes (the last one shorter), or one
// piece when `size` is 0.
struct Segments {
  size_t bytes;
  uint32_t size;
  size_t count() const { return size == 0 ? 1 : (bytes + size - 1) / size; }
  size_t offset(size_t i) const { return i * size; }
  size_t length(size_t i) const { return size == 0 ? bytes : std::min<size_t>(size, bytes - i * size); }
  size_t end(size_t i) const { return offset(i) + length(i); }
};

// Segments a receive keeps announced at once. Gloo sends a payload only once the receiver
// has announced the matching receive. When payloads in both directions share a connection,
// that announcement queues behind whatever the receiver's own side is already writing to the
// same peer: announcing every segment at once lets each side queue its whole payload, so the
// other direction's announcement waits for it and the two directions run one after the
// other. A small window keeps at most a few segments queued ahead of any announcement. On a
// connection per direction the announcement waits only in the link's queue, which holds
// about the other direction's window, so a wider window gains nothing.
constexpr size_t kReceiveWindow = 4;

// A send's payload once posted: the Gloo buffers its segments went out on. Its memory must
// stay alive while Gloo may still use them (p2p_exchange.h retires a failed batch whole).
class SentPayload {
 public:
  SentPayload();
  ~SentPayload();
  SentPayload(SentPayload&&) noexcept;
  SentPayload& operator=(SentPayload&&) noexcept;

  // Posts every segment of `send`'s payload (bytes > 0) to its peer on `slot` of `context`,
  // cut as `segments`: from the caller's buffer, or with P2POp::gather from the pieces'
  // memory, where a segment inside one piece goes out from that piece and one that straddles
  // two is copied first (one copy per boundary between pieces at most, each at most a
  // segment long).
  void Post(const P2POp& send, gloo::Context& context, uint64_t slot, const Segments& segments);

  // Waits for the segments of every payload in `sends`, segment by segment, round robin
  // over them (all in flight at once, to different peers in a gossip round), so each one's
  // TransferProgress (`progress`, may be null) advances as its segments go out.
  static void WaitAll(absl::Span<SentPayload* const> sends, std::chrono::steady_clock::time_point deadline);

  TransferProgress* progress = nullptr;

 private:
  void PostGathered(const std::vector<Buffer>& pieces, int peer, gloo::Context& context, uint64_t slot);

  Segments segments_{0, 0};
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  std::vector<uint8_t> straddling_;  // copies of the segments that straddle pieces
  // The buffer each segment was posted on, in segment order: each is waited for once, in
  // this order (the i-th wait on a buffer is for its i-th segment).
  std::vector<gloo::transport::UnboundBuffer*> segment_buffers_;
};

// Receives a payload cut as `segments` from `peer` on `slot` into `buffer` (which covers
// segments.bytes), keeping kReceiveWindow segments announced, and advances `progress` (may
// be null) to each landed prefix.
void ReceiveSegments(gloo::transport::UnboundBuffer& buffer, int peer, uint64_t slot, const Segments& segments,
                     std::chrono::steady_clock::time_point deadline, TransferProgress* progress);

}  // namespace gossipcc
