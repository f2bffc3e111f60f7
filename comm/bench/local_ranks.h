// Starts N ranks of a benchmark or demo as local processes (fork) that rendezvous through a
// FileStore in a fresh directory, removed afterwards. Ranks can report fixed-size result rows
// to the parent, which prints the table while they run.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#include "comm/core/store.h"

namespace gossipcc {
namespace bench {

// A rank's end of the pipe to the parent.
template <typename Row>
class RowWriter {
  static_assert(std::is_trivially_copyable<Row>::value, "rows cross a pipe as raw bytes");

 public:
  explicit RowWriter(int fd) : fd_(fd) {}
  // False if the parent is gone or the write was short.
  bool Write(const Row& row) const;

 private:
  int fd_;
};

namespace internal {
bool WriteAll(int fd, const void* data, size_t bytes);
// Forks n ranks running body(rank, store, write_fd); the parent calls read_rows(read_fd)
// until it returns, then reaps every rank. Returns the number of ranks that failed.
int ForkRanks(int n, const std::function<int(int, std::shared_ptr<Store>, int)>& body,
              const std::function<void(int)>& read_rows);
// Reads one row; false at end of stream (all ranks closed their ends).
bool ReadRow(int fd, void* row, size_t bytes);
}  // namespace internal

template <typename Row>
bool RowWriter<Row>::Write(const Row& row) const {
  return internal::WriteAll(fd_, &row, sizeof(row));
}

// Runs `body` on n local ranks; every row a rank writes reaches `on_row` in the parent, in
// write order. An exception escaping `body` is printed with its rank and fails that rank.
// Returns 0 when every rank exited 0 (a failure count is printed otherwise).
template <typename Row>
int RunLocalRanksWithRows(int n,
                          const std::function<int(int rank, std::shared_ptr<Store> store, const RowWriter<Row>& out)>& body,
                          const std::function<void(const Row&)>& on_row) {
  const int failed = internal::ForkRanks(
      n, [&](int rank, std::shared_ptr<Store> store, int fd) { return body(rank, std::move(store), RowWriter<Row>(fd)); },
      [&](int fd) {
        Row row;
        while (internal::ReadRow(fd, &row, sizeof(row))) on_row(row);
      });
  return failed == 0 ? 0 : 1;
}

// Runs `body` on n local ranks, no rows. Returns 0 when every rank exited 0.
int RunLocalRanks(int n, const std::function<int(int rank, std::shared_ptr<Store> store)>& body);

// "4 KB", "16 MB", ...
std::string HumanBytes(size_t bytes);

}  // namespace bench
}  // namespace gossipcc
