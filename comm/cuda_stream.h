// Which CUDA stream a thread's CUDA collectives follow: gossipcc's "current stream".
//
// A CUDA collective reads and writes its buffers on the communicator's own stream. It must see
// what the caller queued on its stream before the call (a kernel that produced the gradient),
// and nothing the caller queues after it. So when a CUDA collective is issued, an event is
// recorded on the issuing thread's current stream (set here; by default the legacy default
// stream), and the communication stream waits for that event before the collective runs: no
// host synchronisation, the same ordering as ProcessGroupNCCL's.
//
// The caller keeps the buffers alive until the collective's Work completes (the c10d backend
// holds the tensors until then, instead of recording them on the communication stream).
#pragma once

namespace gossipcc {

// Sets the calling thread's current CUDA stream (a cudaStream_t) for the guard's lifetime;
// nullptr is the legacy default stream. Guards nest.
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
