#include "algorithms/host_slices.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace {

size_t Words(size_t bytes) { return (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t); }

}  // namespace

void HostSlices::Round(HostGroups& groups, const std::vector<Buffer>& buffers, int64_t step,
                       const std::function<void(Buffer slice)>& across) {
  if (buffers.empty()) throw InvalidArgumentError(absl::StrCat(algorithm_, ": no buffers"));
  const DType dtype = gossip_internal::CheckBuffers(algorithm_, buffers);
  if (buffers[0].device.is_cuda()) {
    throw InvalidArgumentError(absl::StrCat(algorithm_, ": CPU buffers only, got ", buffers[0].ToString()));
  }
  const size_t count = gossip_internal::TotalCount(buffers);
  Communicator& host = *groups.host;
  const size_t g = static_cast<size_t>(host.size());
  const std::string where = absl::StrCat(algorithm_, " on host ", groups.host_index, ", local rank ", groups.local_rank);

  // 0. The host's ranks agree on the count, dtype and step (padding would hide a count that
  //    differs by less than G; the slices' rounds across hosts carry only their own sizes).
  int64_t mine[3] = {static_cast<int64_t>(count), static_cast<int64_t>(dtype), step};
  std::vector<int64_t> all(3 * g);
  host.allgather(CpuBuffer(mine, 3), CpuBuffer(all.data(), all.size()))->wait();
  for (size_t r = 1; r < g; ++r) {
    if (std::memcmp(&all[3 * r], &all[0], 3 * sizeof(int64_t)) != 0) {
      std::string each;
      for (size_t q = 0; q < g; ++q) {
        absl::StrAppend(&each, q ? "; " : "", "local rank ", q, ": ", all[3 * q], " x ",
                        DTypeName(static_cast<DType>(all[3 * q + 1])), " at step ", all[3 * q + 2]);
      }
      throw MismatchError(absl::StrCat(where, ": the host's ranks disagree on the element count, dtype or step (",
                                       each, "); nothing was modified"));
    }
  }

  const size_t slice = (count + g - 1) / g;
  const size_t element = ElementSize(dtype);
  const Device cpu = Device::CPU();

  // 1. The host's mean, slice by slice: this rank gets slice `local_rank`.
  padded_.resize(Words(slice * g * element));
  char* at = reinterpret_cast<char*>(padded_.data());
  for (const Buffer& x : buffers) {
    if (x.count > 0) std::memcpy(at, x.data, x.bytes());
    at += x.bytes();
  }
  std::memset(at, 0, (slice * g - count) * element);  // the last slice's padding
  slice_.resize(Words(slice * element));
  const Buffer padded{padded_.data(), slice * g, dtype, cpu};
  const Buffer mine_slice{slice_.data(), slice, dtype, cpu};
  host.reduce_scatter(padded, mine_slice, ReduceOp::kAvg)->wait();

  // 2. The caller's step across hosts, on the slice's elements of the buffer (not its padding:
  //    so the last slices' rounds carry sizes that differ where the hosts' counts do).
  const size_t first = std::min(count, slice * static_cast<size_t>(groups.local_rank));
  const Buffer real{slice_.data(), std::min(count, first + slice) - first, dtype, cpu};
  std::exception_ptr failure;
  try {
    across(real);
  } catch (...) {
    failure = std::current_exception();
  }

  // 3. Every local rank's step succeeded, or every rank of the host raises.
  RaiseUnlessEveryLocalRankSucceeded(host, failure, where);

  // 4. The host's new value on every rank of the host.
  host.allgather(mine_slice, padded)->wait();
  const char* from = reinterpret_cast<const char*>(padded_.data());
  for (const Buffer& x : buffers) {
    if (x.count > 0) std::memcpy(x.data, from, x.bytes());
    from += x.bytes();
  }
}

}  // namespace gossipcc
