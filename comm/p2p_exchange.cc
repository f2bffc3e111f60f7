#include "comm/p2p_exchange.h"

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
  uint8_t pad[11];
};
static_assert(sizeof(Header) == 32, "p2p header layout");

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds Remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

struct P2PExchange::Message {
  P2POp op;
  Header header{};
  std::unique_ptr<gloo::transport::UnboundBuffer> header_ub;
  std::unique_ptr<gloo::transport::UnboundBuffer> data_ub;
  std::vector<uint8_t> drain;  // receive side of a mismatch: payload lands here, not in the user buffer
};

struct P2PExchange::Batch {
  std::vector<Message> messages;
  std::shared_ptr<CompletionWork> work;
  Clock::time_point deadline;
  std::string description;
};

P2PExchange::P2PExchange(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout,
                         std::function<void(std::exception_ptr)> on_failure)
    : context_(std::move(context)), timeout_(timeout), on_failure_(std::move(on_failure)) {
  progress_ = std::thread([this] { ProgressLoop(); });
}

P2PExchange::~P2PExchange() {
  Shutdown("communicator destroyed");
  if (progress_.joinable()) progress_.join();
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
        m.header = Header{kHeaderMagic, m.op.buffer.count, m.op.tag, static_cast<uint8_t>(m.op.buffer.dtype), {}};
        m.header_ub->send(m.op.peer, MakeSlot(kP2PHeaderSlotPrefix, m.op.tag));
        if (m.op.buffer.bytes() > 0) {
          m.data_ub = context_->createUnboundBuffer(m.op.buffer.data, m.op.buffer.bytes());
          m.data_ub->send(m.op.peer, MakeSlot(kP2PDataSlotPrefix, m.op.tag));
        }
      } else {
        m.header_ub->recv(m.op.peer, MakeSlot(kP2PHeaderSlotPrefix, m.op.tag));
      }
    }
  } catch (const std::exception& e) {
    RethrowGlooError(batch->description, e);
  }
  queue_.push_back(std::move(batch));
  return work;
}

void P2PExchange::Complete(Batch& batch) {
  std::exception_ptr mismatch;
  uint64_t sent = 0, received = 0;
  try {
    // Receives: header first, then the payload with the size the sender announced.
    for (Message& m : batch.messages) {
      if (m.op.kind != P2POp::Kind::kRecv) continue;
      m.header_ub->waitRecv(Remaining(batch.deadline));
      const Header& h = m.header;
      const Buffer& b = m.op.buffer;
      const DType sender_dtype = static_cast<DType>(h.dtype);
      const bool match = h.magic == kHeaderMagic && h.count == b.count && sender_dtype == b.dtype;
      const size_t incoming = h.count * ElementSize(sender_dtype);
      if (!match && !mismatch) {
        mismatch = std::make_exception_ptr(MismatchError(absl::StrCat(
            batch.description, ": recv from rank ", m.op.peer, " (tag ", m.op.tag, ") expected ", b.count, " x ",
            DTypeName(b.dtype), " but rank ", m.op.peer, " sent ", h.count, " x ", DTypeName(sender_dtype),
            "; the buffer was left untouched")));
      }
      if (incoming == 0) continue;
      void* dst = b.data;
      if (!match) {
        m.drain.resize(incoming);
        dst = m.drain.data();
      }
      m.data_ub = context_->createUnboundBuffer(dst, incoming);
      m.data_ub->recv(m.op.peer, MakeSlot(kP2PDataSlotPrefix, m.op.tag));
    }
    for (Message& m : batch.messages) {
      if (m.op.kind == P2POp::Kind::kSend) {
        m.header_ub->waitSend(Remaining(batch.deadline));
        if (m.data_ub) m.data_ub->waitSend(Remaining(batch.deadline));
        sent += m.op.buffer.bytes();
      } else if (m.data_ub) {
        m.data_ub->waitRecv(Remaining(batch.deadline));
        received += m.data_ub->size;
      }
    }
  } catch (const std::exception& e) {
    std::exception_ptr error;
    try {
      RethrowGlooError(batch.description, e);  // the description already names the rank
    } catch (...) {
      error = std::current_exception();
    }
    on_failure_(error);
    batch.work->Complete(error);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    bytes_sent_ += sent;
    bytes_received_ += received;
  }
  batch.work->Complete(mismatch);
}

void P2PExchange::ProgressLoop() {
  for (;;) {
    std::unique_ptr<Batch> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](P2PExchange* self) ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->stopping_ || !self->queue_.empty(); },
          this));
      if (queue_.empty()) return;
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    Complete(*batch);
  }
}

void P2PExchange::Shutdown(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = reason;
  }
  // Pending batches still get completed by the progress thread (each bounded by its
  // deadline): their buffers are registered with Gloo and must not be released early.
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
