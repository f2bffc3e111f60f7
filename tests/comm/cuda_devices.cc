#include "tests/comm/cuda_devices.h"

#include <sys/wait.h>
#include <unistd.h>

#include "comm/nccl/nccl_transport.h"

namespace gossipcc {
namespace testing {
namespace {

int CountInChild() {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const int n = NcclTransport::DeviceCount();
    const ssize_t wrote = write(fds[1], &n, sizeof(n));
    _exit(wrote == sizeof(n) ? 0 : 1);
  }
  close(fds[1]);
  int n = 0;
  if (pid < 0 || read(fds[0], &n, sizeof(n)) != sizeof(n)) n = 0;
  close(fds[0]);
  if (pid > 0) {
    int status = 0;
    waitpid(pid, &status, 0);
  }
  return n;
}

}  // namespace

int VisibleCudaDevices() {
  static const int count = CountInChild();
  return count;
}

std::string MissingGpus(int n) {
#if !GOSSIPCC_WITH_CUDA
  return "built without CUDA (no CUDA toolkit with NCCL at build time)";
#else
  const int have = VisibleCudaDevices();
  if (have >= n) return "";
  return "needs " + std::to_string(n) + " CUDA device(s), one per rank (NCCL refuses two ranks on one GPU); " +
         std::to_string(have) + " visible";
#endif
}

}  // namespace testing
}  // namespace gossipcc
