#include "comm/core/cuda_stream.h"

namespace gossipcc {
namespace {
thread_local void* current_stream = nullptr;
}  // namespace

ScopedCudaStream::ScopedCudaStream(void* stream) : previous_(current_stream) { current_stream = stream; }
ScopedCudaStream::~ScopedCudaStream() { current_stream = previous_; }

void* CurrentCudaStream() { return current_stream; }

}  // namespace gossipcc
