#include "algorithms/host_slices.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/errors.h"

namespace gossipcc {
namespace {

size_t Words(size_t bytes) { return (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t); }

}  // namespace

void HostSlices::Round(HostGroups& groups, const std::vector<Buffer>& buffers,
                       const std::function<void(Buffer slice)>& across) {
  if (buffers.empty()) throw InvalidArgumentError(absl::StrCat(algorithm_, ": no buffers"));
  const DType dtype = buffers[0].dtype;
  size_t count = 0;
  for (size_t b = 0; b < buffers.size(); ++b) {
    const Buffer& x = buffers[b];
    if (x.device.is_cuda() || !IsFloatingPoint(x.dtype) || x.dtype != dtype) {
      throw InvalidArgumentError(absl::StrCat(algorithm_, ": buffers must be on the CPU, of one floating dtype; buffer ",
                                              b, " is ", x.ToString(), ", buffer 0 ", buffers[0].ToString()));
    }
    if (x.count > 0 && x.data == nullptr) throw InvalidArgumentError(absl::StrCat(algorithm_, ": buffer ", b, " has no data"));
    count += x.count;
  }
  const size_t g = static_cast<size_t>(groups.host->size());
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
  const Buffer mine{slice_.data(), slice, dtype, cpu};
  groups.host->reduce_scatter(padded, mine, ReduceOp::kAvg)->wait();

  // 2. The caller's step across hosts.
  across(mine);

  // 3. The host's new value on every rank of the host.
  groups.host->allgather(mine, padded)->wait();
  const char* from = reinterpret_cast<const char*>(padded_.data());
  for (const Buffer& x : buffers) {
    if (x.count > 0) std::memcpy(x.data, from, x.bytes());
    from += x.bytes();
  }
}

}  // namespace gossipcc
