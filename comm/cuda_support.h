// What CUDA this gossipcc and this process have.
#pragma once

namespace gossipcc {

// Whether this gossipcc was built with CUDA and NCCL (GOSSIPCC_WITH_CUDA).
bool BuiltWithCuda();
// CUDA devices visible to this process: 0 without a GPU, a driver, or CUDA at build time.
int VisibleCudaDevices();

}  // namespace gossipcc
