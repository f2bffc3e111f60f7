#include "comm/p2p/exchange.h"

#include <algorithm>
#include <cstdint>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
#include "comm/core/deadline.h"
#include "comm/gloo/gloo_error.h"
#include "comm/gloo/pair_teardown.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/gloo/slots.h"
#include "comm/p2p/wire.h"

namespace gossipcc {

struct P2PExchange::Message {
  P2POp op;
  P2PHeader header{};
  std::unique_ptr<gloo::transport::UnboundBuffer> header_ub;
  SentPayload sent;  // a send's payload segments, as posted
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> data_ubs;  // a receive's payload, per stream
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

P2PExchange::P2PExchange(std::shared_ptr<gloo::Context> context, std::array<Streams, 2> payload_streams,
                         std::chrono::milliseconds timeout, size_t segment_bytes, RetiredBuffers& retired,
                         FailureHandler on_failure)
    : context_(std::move(context)),
      payload_streams_(std::move(payload_streams)),
      timeout_(timeout),
      segment_bytes_(segment_bytes),
      retired_(retired),
      on_failure_(std::move(on_failure)) {
  for (size_t d = 0; d < payload_streams_.size(); ++d) {
    for (const auto& mesh : payload_streams_[d]) payload_meshes_[d].push_back(mesh.get());
    if (payload_meshes_[d].empty()) payload_meshes_[d].push_back(context_.get());
  }
}

P2PExchange::~P2PExchange() {
  Shutdown("communicator destroyed");
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_batches_));
}

absl::Span<gloo::Context* const> P2PExchange::PayloadStreams(int from, int to) const {
  return payload_meshes_[from < to ? 0 : 1];
}

std::shared_ptr<Work> P2PExchange::Post(absl::Span<const P2POp> ops, std::string description, Clock::time_point issued) {
  auto batch = std::make_unique<Batch>();
  batch->work = std::make_shared<CompletionWork>(description);
  batch->deadline = std::min(issued, Clock::now()) + timeout_;
  batch->description = std::move(description);
  batch->messages.resize(ops.size());
  std::shared_ptr<Work> work = batch->work;
  absl::MutexLock lock(&mu_);
  if (stopping_) throw AbortedError(absl::StrCat(batch->description, ": ", stop_reason_));
  try {
    for (size_t i = 0; i < ops.size(); ++i) {
      Message& m = batch->messages[i];
      m.op = ops[i];
      m.header_ub = context_->createUnboundBuffer(&m.header, sizeof(P2PHeader));
      if (m.op.kind == P2POp::Kind::kSend) {
        const size_t bytes = m.op.buffer.bytes();
        m.header = P2PHeader::For(m.op, segment_bytes_);
        m.header_ub->send(m.op.peer, MakeSlot(kP2PHeaderSlotPrefix, m.op.tag));
        m.sent.progress = m.op.progress.get();
        if (bytes > 0) {
          m.sent.Post(m.op, PayloadStreams(context_->rank, m.op.peer), MakeSlot(kP2PDataSlotPrefix, m.op.tag),
                      Segments{bytes, m.header.segment_bytes});
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
      m.ticket = turns_.Draw({m.op.peer, m.op.tag});
      m.has_ticket = true;
    }
  }
  // One thread per batch: batches complete independently of each other, in any order.
  ++active_batches_;
  std::thread([this, b = std::move(batch)]() mutable { RunBatch(std::move(b)); }).detach();
  return work;
}

struct P2PExchange::ReceiveOutcome {
  std::exception_ptr mismatch;  // the sender's count or dtype differs: payload drained
  std::exception_ptr failure;   // transport failure or timeout
  uint64_t bytes = 0;
};

// Header first, then the payload with the size the sender announced, in its turn.
P2PExchange::ReceiveOutcome P2PExchange::ReceiveOne(Message& m, Clock::time_point deadline,
                                                    const std::string& description) {
  ReceiveOutcome out;
  // Ends the op's progress on every path out of here (after the turn is given back).
  struct EndProgress {
    TransferProgress* progress;
    ~EndProgress() {
      if (progress) progress->End();
    }
  } end_progress{m.op.progress.get()};
  ReceiveTurn turn(turns_, m.has_ticket, m.op.peer, m.op.tag, m.ticket);
  try {
    int sender = m.op.peer;
    m.header_ub->waitRecv(&sender, TimeLeft(deadline));
    m.op.peer = sender;  // resolves kAnySource: the payload comes from the header's sender
    turn.Draw(sender, m.op.tag);
    if (m.op.source) *m.op.source = sender;
    const P2PHeader& h = m.header;
    out.mismatch = HeaderMismatch(h, m.op, description);
    const size_t incoming = h.count * ElementSize(static_cast<DType>(h.dtype));
    if (incoming == 0) return out;
    void* dst = m.op.buffer.data;
    if (out.mismatch) {
      m.drain.resize(incoming);  // the payload is drained, the buffer left untouched
      dst = m.drain.data();
    }
    // The sender's segmentation, from its header. Later segments come from the sender the
    // header came from, so a receive from any source cannot mix two senders' payloads.
    const Segments segments{incoming, h.segment_bytes < incoming ? h.segment_bytes : 0};
    // A buffer per stream that carries a segment (the sender deals them the same way).
    const absl::Span<gloo::Context* const> streams = PayloadStreams(m.op.peer, context_->rank);
    std::vector<gloo::transport::UnboundBuffer*> buffers;
    for (size_t s = 0; s < std::min(streams.size(), segments.count()); ++s) {
      m.data_ubs.push_back(streams[s]->createUnboundBuffer(dst, incoming));
      buffers.push_back(m.data_ubs.back().get());
    }
    // One payload at a time per (peer, tag), in header order. The receive ahead's sender
    // posted every segment with its header, so it finishes (or times out) without help.
    turn.Wait();
    ReceiveSegments(buffers, m.op.peer, MakeSlot(kP2PDataSlotPrefix, m.op.tag), segments, deadline,
                    out.mismatch ? nullptr : m.op.progress.get());
    out.bytes = out.mismatch ? 0 : incoming;
  } catch (const std::exception& e) {
    // A payload receive that failed (a sender that died part-way, a timeout) leaves segments
    // posted on the sender's streams, into the caller's buffer: another stream may still be
    // reading into it, or a late sender may yet be matched. Closing those pairs before the
    // failure is reported keeps the buffer the caller's alone (the failure poisons the
    // communicator, so nothing else needs them).
    if (!m.data_ubs.empty()) ClosePairsWith(PayloadStreams(m.op.peer, context_->rank), m.op.peer);
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
  std::vector<SentPayload*> payloads;
  for (Message& m : batch.messages) {
    if (m.op.kind != P2POp::Kind::kSend) continue;
    sends.push_back(&m);
    payloads.push_back(&m.sent);
  }
  try {
    for (Message* m : sends) m->header_ub->waitSend(TimeLeft(batch.deadline));
    SentPayload::WaitAll(payloads, batch.deadline);
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
