// How many CUDA devices the test may use, counted without touching CUDA in the test process.
//
// Multi-rank CUDA tests fork their ranks (NCCL refuses two ranks on one GPU, so each rank is a
// process with its own device), and a process that initialised CUDA before fork() cannot use
// CUDA in its children ("initialization error"). So the count comes from a short-lived child
// process, and the test process itself stays CUDA-free until a rank needs it.
#pragma once

#include <string>

namespace gossipcc {
namespace testing {

// CUDA devices visible (cudaGetDeviceCount in a forked child; cached). 0 when gossipcc was
// built without CUDA or no driver/device is present.
int VisibleCudaDevices();

// Empty when `n` devices are usable (one per rank); otherwise why not, for GTEST_SKIP.
std::string MissingGpus(int n);

}  // namespace testing
}  // namespace gossipcc
