// The CUDA stream a thread's CUDA collectives follow (its "current stream"): at issue an event
// is recorded there and the communication stream waits for it, as in ProcessGroupNCCL, so a
// collective sees what the caller queued before the call and nothing after. The caller keeps
// the buffers alive until the Work completes.
#pragma once

namespace gossipcc {

// Sets the thread's current stream (a cudaStream_t; nullptr: legacy default) while alive; nests.
class ScopedCudaStream {
 public:
  explicit ScopedCudaStream(void* stream);
  ~ScopedCudaStream();
  ScopedCudaStream(const ScopedCudaStream&) = delete;
  ScopedCudaStream& operator=(const ScopedCudaStream&) = delete;

 private:
  void* previous_;
};

// The calling thread's current CUDA stream (nullptr: the legacy default stream).
void* CurrentCudaStream();

// Whether this gossipcc was built with CUDA and NCCL (GOSSIPCC_WITH_CUDA).
bool BuiltWithCuda();
// CUDA devices visible to this process: 0 without a GPU, a driver, or CUDA at build time.
int VisibleCudaDevices();

}  // namespace gossipcc
