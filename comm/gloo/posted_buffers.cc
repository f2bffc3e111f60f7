#include "comm/gloo/posted_buffers.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <exception>

namespace gossipcc {

void RetiredBuffers::Add(std::shared_ptr<void> owned) {
  absl::MutexLock lock(&mu_);
  owned_.push_back(std::move(owned));
}

std::vector<std::shared_ptr<void>> RetiredBuffers::TakeAll() {
  absl::MutexLock lock(&mu_);
  return std::move(owned_);
}

PostedBuffers::PostedBuffers(gloo::Context& context, RetiredBuffers& retired)
    : context_(context), retired_(retired), exceptions_at_start_(std::uncaught_exceptions()) {}

PostedBuffers::~PostedBuffers() {
  if (std::uncaught_exceptions() > exceptions_at_start_) {
    for (auto& owned : owned_) retired_.Add(std::move(owned));
  }
}

gloo::transport::UnboundBuffer& PostedBuffers::Create(void* data, size_t bytes) {
  std::shared_ptr<gloo::transport::UnboundBuffer> ub = context_.createUnboundBuffer(data, bytes);
  gloo::transport::UnboundBuffer& ref = *ub;
  owned_.push_back(std::move(ub));
  return ref;
}

uint8_t* PostedBuffers::Allocate(size_t bytes) {
  // Not zeroed: every user receives into it before reading, and zeroing a ring's scratch
  // would cost a pass over memory per call.
  std::shared_ptr<uint8_t> memory(new uint8_t[bytes], std::default_delete<uint8_t[]>());
  uint8_t* data = memory.get();
  owned_.push_back(std::move(memory));
  return data;
}

}  // namespace gossipcc
