// The Gloo buffers one collective call posts, and those a failed call leaves to the communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace gossipcc {

// Gloo buffers (and their memory) of operations that failed part-way, which Gloo's device
// thread may still touch: freed only after DestroyPairs on every mesh (docs/architecture.md,
// "Shutdown"). One per communicator. Thread-safe.
class RetiredBuffers {
 public:
  void Add(std::shared_ptr<void> owned);
  std::vector<std::shared_ptr<void>> TakeAll();

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<void>> owned_ ABSL_GUARDED_BY(mu_);
};

// Owns the Gloo buffers (and scratch memory) one collective call posts operations on. On
// normal return every operation was waited for and they are freed; when the call unwinds
// with an exception they go to `retired` instead.
class PostedBuffers {
 public:
  PostedBuffers(gloo::Context& context, RetiredBuffers& retired);
  ~PostedBuffers();
  PostedBuffers(const PostedBuffers&) = delete;
  PostedBuffers& operator=(const PostedBuffers&) = delete;

  gloo::transport::UnboundBuffer& Create(void* data, size_t bytes);
  // Scratch memory of `bytes` (uninitialised) that lives as long as the buffers do.
  uint8_t* Allocate(size_t bytes);

 private:
  gloo::Context& context_;
  RetiredBuffers& retired_;
  const int exceptions_at_start_;
  std::vector<std::shared_ptr<void>> owned_;
};

}  // namespace gossipcc
