// A point-to-point message on the wire: a 32-byte header the receiver checks against its buffer
// before any payload byte moves, then the payload in segments (offset/length operations on one
// Gloo buffer, the sender's cuts in the header, so both sides post the same ones in order), with
// their progress. With several streams (meshes) per peer pair, segment i travels on stream
// i % streams (comm/gloo/striping.h), so a payload of one segment stays on the first stream. Which
// receive takes which message is exchange.h's and turns.h's job.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/core/p2p_op.h"
#include "comm/core/types.h"

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

// Segments a receive keeps announced at once per stream: a small window keeps an announcement
// from queuing behind a whole payload going the other way (docs/comm.md).
constexpr size_t kReceiveWindow = 4;

// A send's payload once posted: the Gloo buffers its segments went out on. Its memory must
// stay alive while Gloo may still use them (exchange.h retires a failed batch whole).
class SentPayload {
 public:
  SentPayload();
  ~SentPayload();
  SentPayload(SentPayload&&) noexcept;
  SentPayload& operator=(SentPayload&&) noexcept;

  // Posts every segment of `send`'s payload, from the caller's memory (with P2POp::gather, only
  // the segments that straddle two pieces are copied), segment i on streams[i % size].
  void Post(const P2POp& send, absl::Span<gloo::Context* const> streams, uint64_t slot, const Segments& segments);

  // Waits for every payload's segments round robin, advancing each one's `progress` (may be null).
  static void WaitAll(absl::Span<SentPayload* const> sends, std::chrono::steady_clock::time_point deadline);

  TransferProgress* progress = nullptr;

 private:
  void PostGathered(const std::vector<Buffer>& pieces, int peer, absl::Span<gloo::Context* const> streams,
                    uint64_t slot);

  Segments segments_{0, 0};
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  std::vector<uint8_t> straddling_;  // copies of the segments that straddle pieces
  // The buffer each segment was posted on, in segment order: each is waited for once, in
  // this order (the i-th wait on a buffer is for its i-th segment).
  std::vector<gloo::transport::UnboundBuffer*> segment_buffers_;
};

// Receives a payload cut as `segments` from `peer` on `slot`, segment i through
// buffers[i % size] (one per stream, each over the same memory, covering segments.bytes),
// keeping kReceiveWindow segments announced per stream, and advances `progress` (may be null)
// to each landed prefix.
void ReceiveSegments(absl::Span<gloo::transport::UnboundBuffer* const> buffers, int peer, uint64_t slot,
                     const Segments& segments, std::chrono::steady_clock::time_point deadline,
                     TransferProgress* progress);

}  // namespace gossipcc
