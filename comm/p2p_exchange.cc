#include "comm/p2p_exchange.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/str_cat.h"
#include "comm/errors.h"
#include "comm/gloo_util.h"

namespace gossipcc {
namespace {

constexpr uint64_t kHeaderMagic = 0x676f737369706363ull;  // "gossipcc"

struct Header {
  uint64_t magic;
  uint64_t count;
  uint32_t tag;
  uint8_t dtype;
  uint8_t pad[3];
  uint32_t segment_bytes;  // the payload travels in segments of this size (0: in one piece)
  uint8_t pad2[4];
};
static_assert(sizeof(Header) == 32, "p2p header layout");

// The segment size a payload of `bytes` travels with: 0 (one piece) when it fits in one.
uint32_t SegmentBytesFor(size_t bytes, size_t segment_bytes) {
  return segment_bytes > 0 && bytes > segment_bytes ? static_cast<uint32_t>(segment_bytes) : 0;
}

// A payload cut into consecutive segments of `size` bytes (the last one shorter), or one
// piece when `size` is 0. Each segment is one Gloo operation at an offset of one buffer;
// Gloo matches a pair's operations on one slot in order, so the receiver's segments line up
// with the sender's.
struct Segments {
  size_t bytes;
  uint32_t size;
  size_t count() const { return size == 0 ? 1 : (bytes + size - 1) / size; }
  size_t offset(size_t i) const { return i * size; }
  size_t length(size_t i) const { return size == 0 ? bytes : std::min<size_t>(size, bytes - i * size); }
};

// Segments a receive keeps announced at once. Gloo sends a payload only once the receiver
// has announced the matching receive. When payloads in both directions share a connection,
// that announcement queues behind whatever the receiver's own side is already writing to the
// same peer: announcing every segment at once lets each side queue its whole payload, so the
// other direction's announcement waits for it and the two directions run one after the
// other. A small window keeps at most a few segments queued ahead of any announcement. On a
// connection per direction the announcement waits only in the link's queue, which holds
// about the other direction's window: wider windows measured no better
// (docs/benchmarks_history.md, "Figures the code's comments used to carry").
constexpr size_t kReceiveWindow = 4;

// The buffers a gathered send (P2POp::gather) posted its segments on, and the copies of the
// segments that straddle pieces.
struct GatheredSend {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers;
  std::vector<uint8_t> straddling;
};

// The receiver cuts the payload into the sender's segments whatever the pieces were, so a
// segment inside one piece goes out from that piece's memory, and one that straddles two is
// copied first: one copy per boundary between pieces at most, each at most a segment long
// (all of the message when it travels in one segment).
// `posted_on` gets the buffer each segment was posted on, in segment order.
void PostGatheredSend(const std::vector<Buffer>& pieces, int peer, gloo::Context& context, uint64_t slot,
                      const Segments& segments, GatheredSend& out,
                      std::vector<gloo::transport::UnboundBuffer*>& posted_on) {
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
    if (segments.offset(i) + segments.length(i) > ends[piece_at(segments.offset(i))]) {
      straddling_bytes += segments.length(i);
    }
  }
  out.straddling.resize(straddling_bytes);
  std::vector<size_t> buffer_of(pieces.size(), SIZE_MAX);  // index into out.buffers
  size_t straddling_index = SIZE_MAX, copied = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t offset = segments.offset(i), length = segments.length(i);
    size_t p = piece_at(offset);
    if (offset + length <= ends[p]) {
      if (buffer_of[p] == SIZE_MAX) {
        buffer_of[p] = out.buffers.size();
        out.buffers.push_back(context.createUnboundBuffer(pieces[p].data, pieces[p].bytes()));
      }
      gloo::transport::UnboundBuffer* ub = out.buffers[buffer_of[p]].get();
      ub->send(peer, slot, offset - start_of(p), length);
      posted_on.push_back(ub);
      continue;
    }
    for (size_t at = offset; at < offset + length; ++p) {
      const size_t take = std::min(offset + length, ends[p]) - at;
      if (take > 0) {
        std::memcpy(out.straddling.data() + copied + (at - offset),
                    static_cast<const uint8_t*>(pieces[p].data) + (at - start_of(p)), take);
      }
      at += take;
    }
    if (straddling_index == SIZE_MAX) {
      straddling_index = out.buffers.size();
      out.buffers.push_back(context.createUnboundBuffer(out.straddling.data(), straddling_bytes));
    }
    gloo::transport::UnboundBuffer* ub = out.buffers[straddling_index].get();
    ub->send(peer, slot, copied, length);
    posted_on.push_back(ub);
    copied += length;
  }
}

std::chrono::milliseconds Remaining(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

struct P2PExchange::Message {
  P2POp op;
  Header header{};
  std::unique_ptr<gloo::transport::UnboundBuffer> header_ub;
  std::unique_ptr<gloo::transport::UnboundBuffer> data_ub;
  size_t data_ops = 0;  // a receive's payload segments, each waited for on data_ub
  GatheredSend gathered;  // a send with P2POp::gather
  // The buffer each of a send's payload segments was posted on (data_ub, or one of
  // gathered's), in segment order: each is waited for once, in this order.
  std::vector<gloo::transport::UnboundBuffer*> send_segment_buffers;
  uint64_t ticket = 0;  // a named receive's turn on (peer, tag), drawn when posted
  bool has_ticket = false;
  std::vector<uint8_t> drain;  // receive side of a mismatch: payload lands here, not in the user buffer
};

struct P2PExchange::Batch {
  std::vector<Message> messages;
  std::shared_ptr<CompletionWork> work;
  Clock::time_point deadline;
  std::string description;
};

P2PExchange::P2PExchange(std::shared_ptr<gloo::Context> context,
                         std::array<std::shared_ptr<gloo::Context>, 2> payload_contexts,
                         std::chrono::milliseconds timeout, size_t segment_bytes, RetiredBuffers& retired,
                         FailureHandler on_failure)
    : context_(std::move(context)),
      payload_contexts_(std::move(payload_contexts)),
      timeout_(timeout),
      segment_bytes_(segment_bytes),
      retired_(retired),
      on_failure_(std::move(on_failure)) {}

P2PExchange::~P2PExchange() {
  Shutdown("communicator destroyed");
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_batches_));
}

gloo::Context& P2PExchange::PayloadContext(int from, int to) const {
  const std::shared_ptr<gloo::Context>& directional = payload_contexts_[from < to ? 0 : 1];
  return directional ? *directional : *context_;
}

std::shared_ptr<Work> P2PExchange::Post(absl::Span<const P2POp> ops, std::string description) {
  auto batch = std::make_unique<Batch>();
  batch->work = std::make_shared<CompletionWork>(description);
  batch->deadline = Clock::now() + timeout_;
  batch->description = std::move(description);
  batch->messages.resize(ops.size());
  std::shared_ptr<Work> work = batch->work;
  absl::MutexLock lock(&mu_);
  if (stopping_) throw AbortedError(absl::StrCat(batch->description, ": ", stop_reason_));
  try {
    for (size_t i = 0; i < ops.size(); ++i) {
      Message& m = batch->messages[i];
      m.op = ops[i];
      m.header_ub = context_->createUnboundBuffer(&m.header, sizeof(Header));
      if (m.op.kind == P2POp::Kind::kSend) {
        const size_t bytes = m.op.buffer.bytes();
        m.header = Header{kHeaderMagic, m.op.buffer.count, m.op.tag, static_cast<uint8_t>(m.op.buffer.dtype), {},
                          SegmentBytesFor(bytes, segment_bytes_), {}};
        m.header_ub->send(m.op.peer, MakeSlot(kP2PHeaderSlotPrefix, m.op.tag));
        if (bytes > 0) {
          const uint64_t slot = MakeSlot(kP2PDataSlotPrefix, m.op.tag);
          const Segments segments{bytes, m.header.segment_bytes};
          gloo::Context& payload_context = PayloadContext(context_->rank, m.op.peer);
          if (!m.op.gather.empty()) {
            PostGatheredSend(m.op.gather, m.op.peer, payload_context, slot, segments, m.gathered,
                             m.send_segment_buffers);
          } else {
            m.data_ub = payload_context.createUnboundBuffer(m.op.buffer.data, bytes);
            for (size_t i = 0; i < segments.count(); ++i) {
              m.data_ub->send(m.op.peer, slot, segments.offset(i), segments.length(i));
              m.send_segment_buffers.push_back(m.data_ub.get());
            }
          }
        }
      } else {
        if (m.op.peer == kAnySource) {
          std::vector<int> others;
          for (int r = 0; r < context_->size; ++r) {
            if (r != context_->rank) others.push_back(r);
          }
          m.header_ub->recv(others, MakeSlot(kP2PHeaderSlotPrefix, m.op.tag));
        } else {
          m.header_ub->recv(m.op.peer, MakeSlot(kP2PHeaderSlotPrefix, m.op.tag));
        }
      }
    }
  } catch (const std::exception& e) {
    // Messages posted before the failure are registered with their pairs (Gloo's device
    // thread may still complete or fail them), so their buffers are retired, not freed.
    const std::string description = batch->description;
    retired_.Add(std::shared_ptr<Batch>(std::move(batch)));
    RethrowGlooError(description, e);
  }
  for (Message& m : batch->messages) {
    if (m.op.kind == P2POp::Kind::kRecv && m.op.peer != kAnySource) {
      m.ticket = turns_[{m.op.peer, m.op.tag}].next++;
      m.has_ticket = true;
    }
  }
  // One thread per batch: batches complete independently of each other, in any order.
  ++active_batches_;
  std::thread([this, b = std::move(batch)]() mutable { RunBatch(std::move(b)); }).detach();
  return work;
}

// A receive's turn to take its payload from (peer, tag). Gloo matches headers in posting
// order, but each receive posts its payload's segments from its own thread: without turns,
// two receives outstanding on one (peer, tag) could take each other's segments (Gloo aborts
// on the length mismatch) or payloads. Named receives draw their ticket when posted (the
// order their headers are matched in); a receive from any source draws one when its header
// arrives. Every ticket is given back on every path, so a failed receive never blocks the next.
class P2PExchange::Turn {
 public:
  Turn(P2PExchange& exchange, const Message& m) : exchange_(exchange) {
    if (m.has_ticket) {
      key_ = {m.op.peer, m.op.tag};
      ticket_ = m.ticket;
      held_ = true;
    }
  }
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;
  ~Turn() {
    if (!held_) return;
    absl::MutexLock lock(&exchange_.mu_);
    auto it = exchange_.turns_.find(key_);
    Turns& t = it->second;
    t.finished.insert(ticket_);
    while (!t.finished.empty() && *t.finished.begin() == t.serving) {
      t.finished.erase(t.finished.begin());
      ++t.serving;
    }
    if (t.serving == t.next) exchange_.turns_.erase(it);  // idle: keeps the map small
  }

  // A receive from any source, once its header named the sender.
  void Draw(int peer, uint32_t tag) {
    if (held_) return;
    absl::MutexLock lock(&exchange_.mu_);
    key_ = {peer, tag};
    ticket_ = exchange_.turns_[key_].next++;
    held_ = true;
  }

  // Returns when every earlier receive on (peer, tag) has taken its payload (or failed).
  void Wait() {
    absl::MutexLock lock(&exchange_.mu_);
    exchange_.mu_.Await(absl::Condition(this, &Turn::Mine));
  }

 private:
  bool Mine() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(exchange_.mu_) {
    return exchange_.turns_.at(key_).serving == ticket_;
  }
  P2PExchange& exchange_;
  std::pair<int, uint32_t> key_;
  uint64_t ticket_ = 0;
  bool held_ = false;
};

struct P2PExchange::ReceiveOutcome {
  std::exception_ptr mismatch;  // the sender's count or dtype differs: payload drained
  std::exception_ptr failure;   // transport failure or timeout
  uint64_t bytes = 0;
};

// Header first, then the payload with the size the sender announced.
P2PExchange::ReceiveOutcome P2PExchange::ReceiveOne(Message& m, Clock::time_point deadline,
                                                    const std::string& description) {
  gloo::Context& context = *context_;
  ReceiveOutcome out;
  // Ends the op's progress on every path out of here (after the Turn is given back).
  struct EndProgress {
    TransferProgress* progress;
    ~EndProgress() {
      if (progress) progress->End();
    }
  } end_progress{m.op.progress.get()};
  Turn turn(*this, m);
  try {
    int sender = m.op.peer;
    m.header_ub->waitRecv(&sender, Remaining(deadline));
    m.op.peer = sender;  // resolves kAnySource: the payload comes from the header's sender
    turn.Draw(sender, m.op.tag);
    if (m.op.source) *m.op.source = sender;
    const Header& h = m.header;
    const Buffer& b = m.op.buffer;
    const DType sender_dtype = static_cast<DType>(h.dtype);
    const bool match = h.magic == kHeaderMagic && h.count == b.count && sender_dtype == b.dtype;
    const size_t incoming = h.count * ElementSize(sender_dtype);
    if (!match) {
      out.mismatch = std::make_exception_ptr(MismatchError(absl::StrCat(
          description, ": recv from rank ", m.op.peer, " (tag ", m.op.tag, ") expected ", b.count, " x ",
          DTypeName(b.dtype), " but rank ", m.op.peer, " sent ", h.count, " x ", DTypeName(sender_dtype),
          "; the buffer was left untouched")));
    }
    if (incoming == 0) return out;
    void* dst = b.data;
    if (!match) {
      m.drain.resize(incoming);
      dst = m.drain.data();
    }
    // The sender's segmentation, from its header. Later segments come from the sender the
    // header came from, so a receive from any source cannot mix two senders' payloads.
    const Segments segments{incoming, h.segment_bytes < incoming ? h.segment_bytes : 0};
    m.data_ub = PayloadContext(m.op.peer, context.rank).createUnboundBuffer(dst, incoming);
    const uint64_t slot = MakeSlot(kP2PDataSlotPrefix, m.op.tag);
    // One payload at a time per (peer, tag), in header order. The receive ahead's sender
    // posted every segment with its header, so it finishes (or times out) without help.
    turn.Wait();
    m.data_ops = segments.count();
    size_t posted = 0;
    for (; posted < std::min(kReceiveWindow, m.data_ops); ++posted) {
      m.data_ub->recv(m.op.peer, slot, segments.offset(posted), segments.length(posted));
    }
    for (size_t done = 0; done < m.data_ops; ++done) {
      m.data_ub->waitRecv(Remaining(deadline));  // segments complete in order
      if (match && m.op.progress) m.op.progress->Advance(segments.offset(done) + segments.length(done));
      if (posted < m.data_ops) {
        m.data_ub->recv(m.op.peer, slot, segments.offset(posted), segments.length(posted));
        ++posted;
      }
    }
    out.bytes = match ? incoming : 0;
  } catch (const std::exception& e) {
    try {
      RethrowGlooError(description, e);  // the description already names the rank
    } catch (...) {
      out.failure = std::current_exception();
    }
  }
  return out;
}

bool P2PExchange::Complete(Batch& batch) {
  // Every receive progresses on its own (the first on this thread, others on helpers), so
  // a receive whose sender is late never holds back the payload of one that has arrived:
  // the sender of that payload may be waiting for it before it does what the late one needs.
  std::vector<Message*> receives;
  for (Message& m : batch.messages) {
    if (m.op.kind == P2POp::Kind::kRecv) receives.push_back(&m);
  }
  std::vector<ReceiveOutcome> outcomes(receives.size());
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < receives.size(); ++i) {
    helpers.emplace_back([&, i] { outcomes[i] = ReceiveOne(*receives[i], batch.deadline, batch.description); });
  }
  if (!receives.empty()) outcomes[0] = ReceiveOne(*receives[0], batch.deadline, batch.description);

  std::exception_ptr failure;
  uint64_t sent = 0, received = 0;
  std::vector<Message*> sends;
  size_t most_segments = 0;
  for (Message& m : batch.messages) {
    if (m.op.kind != P2POp::Kind::kSend) continue;
    sends.push_back(&m);
    most_segments = std::max(most_segments, m.send_segment_buffers.size());
  }
  try {
    for (Message* m : sends) m->header_ub->waitSend(Remaining(batch.deadline));
    // Segment by segment, round robin over the messages (all in flight at once, to different
    // peers in a gossip round), so each message's progress advances as its segments go out. A
    // pair writes its operations in posting order, so a buffer's sends complete in the order
    // they were posted: the i-th wait on a buffer is for its i-th segment.
    for (size_t i = 0; i < most_segments; ++i) {
      for (Message* m : sends) {
        if (i >= m->send_segment_buffers.size()) continue;
        m->send_segment_buffers[i]->waitSend(Remaining(batch.deadline));
        if (m->op.progress) {
          const Segments segments{m->op.buffer.bytes(), m->header.segment_bytes};
          m->op.progress->Advance(segments.offset(i) + segments.length(i));
        }
      }
    }
    for (Message* m : sends) sent += m->op.buffer.bytes();
  } catch (const std::exception& e) {
    try {
      RethrowGlooError(batch.description, e);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  for (Message* m : sends) {
    if (m->op.progress) m->op.progress->End();
  }
  for (std::thread& t : helpers) t.join();
  std::exception_ptr mismatch;
  for (const ReceiveOutcome& o : outcomes) {
    if (!failure && o.failure) failure = o.failure;
    if (!mismatch && o.mismatch) mismatch = o.mismatch;
    received += o.bytes;
  }
  if (failure) {
    batch.work->Complete(on_failure_(failure));
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    bytes_sent_ += sent;
    bytes_received_ += received;
  }
  batch.work->Complete(mismatch);
  return true;
}

void P2PExchange::RunBatch(std::unique_ptr<Batch> batch) {
  if (Complete(*batch)) {
    batch.reset();  // releases the Gloo buffers before this exchange may be destroyed
  } else {
    retired_.Add(std::shared_ptr<Batch>(std::move(batch)));
  }
  absl::MutexLock lock(&mu_);
  --active_batches_;
}

void P2PExchange::Shutdown(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = reason;
  // Batches in flight still complete (each bounded by its deadline): their buffers are
  // registered with Gloo and must not be released early.
}

uint64_t P2PExchange::bytes_sent() const {
  absl::MutexLock lock(&mu_);
  return bytes_sent_;
}

uint64_t P2PExchange::bytes_received() const {
  absl::MutexLock lock(&mu_);
  return bytes_received_;
}

}  // namespace gossipcc
