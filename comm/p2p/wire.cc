#include "comm/p2p/wire.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
#include "comm/core/deadline.h"
#include "comm/gloo/striping.h"

namespace gossipcc {

P2PHeader P2PHeader::For(const P2POp& send, size_t segment_bytes) {
  const size_t bytes = send.buffer.bytes();
  // 0 (one piece) when the payload fits in one segment.
  const uint32_t segment = segment_bytes > 0 && bytes > segment_bytes ? static_cast<uint32_t>(segment_bytes) : 0;
  return P2PHeader{kP2PHeaderMagic, send.buffer.count, send.tag, static_cast<uint8_t>(send.buffer.dtype), {},
                   segment, {}};
}

std::exception_ptr HeaderMismatch(const P2PHeader& h, const P2POp& receive, const std::string& description) {
  const Buffer& b = receive.buffer;
  const DType sender_dtype = static_cast<DType>(h.dtype);
  if (h.magic == kP2PHeaderMagic && h.count == b.count && sender_dtype == b.dtype) return nullptr;
  return std::make_exception_ptr(MismatchError(absl::StrCat(
      description, ": recv from rank ", receive.peer, " (tag ", receive.tag, ") expected ", b.count, " x ",
      DTypeName(b.dtype), " but rank ", receive.peer, " sent ", h.count, " x ", DTypeName(sender_dtype),
      "; the buffer was left untouched")));
}

SentPayload::SentPayload() = default;
SentPayload::~SentPayload() = default;
SentPayload::SentPayload(SentPayload&&) noexcept = default;
SentPayload& SentPayload::operator=(SentPayload&&) noexcept = default;

void SentPayload::Post(const P2POp& send, absl::Span<gloo::Context* const> streams, uint64_t slot,
                       const Segments& segments) {
  segments_ = segments;
  if (!send.gather.empty()) return PostGathered(send.gather, send.peer, streams, slot);
  const size_t count = segments.count();
  const size_t used = std::min(streams.size(), count);  // streams that carry a segment
  for (size_t s = 0; s < used; ++s) buffers_.push_back(streams[s]->createUnboundBuffer(send.buffer.data, segments.bytes));
  for (size_t i = 0; i < count; ++i) {
    gloo::transport::UnboundBuffer* ub = buffers_[StreamOf(i, streams.size())].get();
    ub->send(send.peer, slot, segments.offset(i), segments.length(i));
    segment_buffers_.push_back(ub);
  }
}

// The receiver cuts the payload into the sender's segments whatever the pieces were.
void SentPayload::PostGathered(const std::vector<Buffer>& pieces, int peer, absl::Span<gloo::Context* const> streams,
                               uint64_t slot) {
  const Segments& segments = segments_;
  std::vector<size_t> ends(pieces.size());  // byte offset in the message where each piece ends
  size_t end = 0;
  for (size_t p = 0; p < pieces.size(); ++p) ends[p] = end += pieces[p].bytes();
  // The piece holding byte `offset`: the first one that ends after it (never an empty one).
  auto piece_at = [&](size_t offset) {
    return static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), offset) - ends.begin());
  };
  auto start_of = [&](size_t p) { return ends[p] - pieces[p].bytes(); };
  const size_t count = segments.count();
  size_t straddling_bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    if (segments.end(i) > ends[piece_at(segments.offset(i))]) straddling_bytes += segments.length(i);
  }
  straddling_.resize(straddling_bytes);
  const size_t k = streams.size();
  // Index into buffers_ of piece p's buffer on stream s (p * k + s), and of the straddling
  // copies' buffer on stream s (pieces.size() * k + s).
  std::vector<size_t> buffer_of((pieces.size() + 1) * k, SIZE_MAX);
  auto buffer = [&](size_t key, size_t stream, void* data, size_t bytes) {
    size_t& index = buffer_of[key * k + stream];
    if (index == SIZE_MAX) {
      index = buffers_.size();
      buffers_.push_back(streams[stream]->createUnboundBuffer(data, bytes));
    }
    return buffers_[index].get();
  };
  size_t copied = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t offset = segments.offset(i), length = segments.length(i);
    const size_t stream = StreamOf(i, k);
    size_t p = piece_at(offset);
    if (offset + length <= ends[p]) {
      gloo::transport::UnboundBuffer* ub = buffer(p, stream, pieces[p].data, pieces[p].bytes());
      ub->send(peer, slot, offset - start_of(p), length);
      segment_buffers_.push_back(ub);
      continue;
    }
    for (size_t at = offset; at < offset + length; ++p) {
      const size_t take = std::min(offset + length, ends[p]) - at;
      if (take > 0) {
        std::memcpy(straddling_.data() + copied + (at - offset),
                    static_cast<const uint8_t*>(pieces[p].data) + (at - start_of(p)), take);
      }
      at += take;
    }
    gloo::transport::UnboundBuffer* ub = buffer(pieces.size(), stream, straddling_.data(), straddling_bytes);
    ub->send(peer, slot, copied, length);
    segment_buffers_.push_back(ub);
    copied += length;
  }
}

void SentPayload::WaitAll(absl::Span<SentPayload* const> sends, std::chrono::steady_clock::time_point deadline) {
  size_t most_segments = 0;
  for (const SentPayload* s : sends) most_segments = std::max(most_segments, s->segment_buffers_.size());
  for (size_t i = 0; i < most_segments; ++i) {
    for (SentPayload* s : sends) {
      if (i >= s->segment_buffers_.size()) continue;
      s->segment_buffers_[i]->waitSend(TimeLeft(deadline));
      if (s->progress) s->progress->Advance(s->segments_.end(i));
    }
  }
}

void ReceiveSegments(absl::Span<gloo::transport::UnboundBuffer* const> buffers, int peer, uint64_t slot,
                     const Segments& segments, std::chrono::steady_clock::time_point deadline,
                     TransferProgress* progress) {
  const size_t count = segments.count();
  const size_t k = buffers.size();
  auto post = [&](size_t i) { buffers[StreamOf(i, k)]->recv(peer, slot, segments.offset(i), segments.length(i)); };
  size_t posted = 0;
  for (; posted < std::min(kReceiveWindow * k, count); ++posted) post(posted);
  for (size_t done = 0; done < count; ++done) {
    // A stream's segments complete in order, so its next completion is segment `done`.
    buffers[StreamOf(done, k)]->waitRecv(TimeLeft(deadline));
    if (progress) progress->Advance(segments.end(done));
    if (posted < count) post(posted++);
  }
}

}  // namespace gossipcc
