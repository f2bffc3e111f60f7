#include "comm/bench/local_ranks.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

namespace gossipcc {
namespace bench {
namespace internal {

bool WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadRow(int fd, void* row, size_t bytes) {
  char* p = static_cast<char*>(row);
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = read(fd, p + got, bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // end of stream (or a torn row from a dying rank)
    got += static_cast<size_t>(n);
  }
  return true;
}

int ForkRanks(int n, const std::function<int(int, std::shared_ptr<Store>, int)>& body,
              const std::function<void(int)>& read_rows) {
  char dir_template[] = "/tmp/gossipcc_bench_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  int fds[2];
  if (dir == nullptr || pipe(fds) != 0) {
    std::perror("local ranks: mkdtemp/pipe");
    return n;
  }
  std::fflush(stdout);  // or the children re-print what the parent buffered
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      int code = 1;
      try {
        code = body(rank, MakeFileStore(dir), fds[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      close(fds[1]);
      std::fflush(stdout);
      _exit(code);
    }
    if (pid < 0) std::perror("local ranks: fork");
    else pids.push_back(pid);
  }
  close(fds[1]);  // the parent sees end of stream once every rank has closed its end
  read_rows(fds[0]);
  close(fds[0]);
  int failed = n - static_cast<int>(pids.size());
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  const std::string cleanup = std::string("rm -rf ") + dir;
  if (std::system(cleanup.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir);
  if (failed > 0) std::fprintf(stderr, "%d of %d rank(s) failed\n", failed, n);
  return failed;
}

}  // namespace internal

int RunLocalRanks(int n, const std::function<int(int rank, std::shared_ptr<Store> store)>& body) {
  const int failed =
      internal::ForkRanks(n, [&](int rank, std::shared_ptr<Store> store, int) { return body(rank, std::move(store)); },
                          [](int) {});
  return failed == 0 ? 0 : 1;
}

std::string HumanBytes(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t{1} << 30)) std::snprintf(buf, sizeof(buf), "%zu GB", bytes >> 30);
  else if (bytes >= (size_t{1} << 20)) std::snprintf(buf, sizeof(buf), "%zu MB", bytes >> 20);
  else if (bytes >= 1024) std::snprintf(buf, sizeof(buf), "%zu KB", bytes >> 10);
  else std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  return buf;
}

}  // namespace bench
}  // namespace gossipcc
