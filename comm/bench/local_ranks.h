// Starts N ranks of a benchmark or demo as local processes that rendezvous through a
// FileStore in a fresh directory. Rank 0's output is the report.
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "comm/store.h"

namespace gossipcc {
namespace bench {

// Returns 0 when every rank exited 0.
inline int RunLocalRanks(int n, const std::function<int(int rank, std::shared_ptr<Store> store)>& body) {
  char dir_template[] = "/tmp/gossipcc_bench_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) {
    perror("mkdtemp");
    return 1;
  }
  fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = body(r, MakeFileStore(dir));
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      fflush(stdout);
      _exit(code);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::string cleanup = std::string("rm -rf ") + dir;
  if (system(cleanup.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return failed == 0 ? 0 : 1;
}

inline std::string HumanBytes(size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 30)) snprintf(buf, sizeof(buf), "%zu GB", bytes >> 30);
  else if (bytes >= (1u << 20)) snprintf(buf, sizeof(buf), "%zu MB", bytes >> 20);
  else if (bytes >= 1024) snprintf(buf, sizeof(buf), "%zu KB", bytes >> 10);
  else snprintf(buf, sizeof(buf), "%zu B", bytes);
  return buf;
}

}  // namespace bench
}  // namespace gossipcc
