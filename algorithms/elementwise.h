// Internal: element access for the floating dtypes the algorithms accept, buffer checks, and
// host staging of CUDA buffers.
//
// float32 and float64 are computed in their own precision; float16 and bfloat16 are widened
// to float32, computed, and rounded once when stored (as comm/ reduces them).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "comm/core/types.h"

namespace gossipcc {
namespace gossip_internal {

template <DType D>
struct Elem;
template <>
struct Elem<DType::kFloat32> {
  using Storage = float;
  using Compute = float;
  static Compute Load(Storage v) { return v; }
  static Storage Store(Compute v) { return v; }
};
template <>
struct Elem<DType::kFloat64> {
  using Storage = double;
  using Compute = double;
  static Compute Load(Storage v) { return v; }
  static Storage Store(Compute v) { return v; }
};
template <>
struct Elem<DType::kFloat16> {
  using Storage = uint16_t;
  using Compute = float;
  static Compute Load(Storage v) { return HalfToFloat(v); }
  static Storage Store(Compute v) { return FloatToHalf(v); }
};
template <>
struct Elem<DType::kBFloat16> {
  using Storage = uint16_t;
  using Compute = float;
  static Compute Load(Storage v) { return BFloat16ToFloat(v); }
  static Storage Store(Compute v) { return FloatToBFloat16(v); }
};

// Calls fn(Elem<D>{}) for the buffer's floating dtype.
template <typename Fn>
auto DispatchFloating(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat64: return fn(Elem<DType::kFloat64>{});
    case DType::kFloat16: return fn(Elem<DType::kFloat16>{});
    case DType::kBFloat16: return fn(Elem<DType::kBFloat16>{});
    default: return fn(Elem<DType::kFloat32>{});
  }
}

// Checks a list of buffers for `algorithm`: floating dtype (float32, float64, float16,
// bfloat16), one dtype and one device for the whole list, non-null data. CUDA buffers need a
// CUDA build. Throws InvalidArgumentError naming the buffer index otherwise. Returns the
// common dtype (kFloat32 for an empty list).
DType CheckBuffers(const std::string& algorithm, const std::vector<Buffer>& buffers);

size_t TotalCount(const std::vector<Buffer>& buffers);

// Host-accessible copies of a buffer list. CPU buffers are used in place; CUDA buffers are
// copied to host memory (cudaMemcpyAsync on the default stream, then synchronised) when
// `load` is true, and copied back by WriteBack().
class HostStaging {
 public:
  HostStaging(const std::string& algorithm, const std::vector<Buffer>& buffers, bool load = true);
  const std::vector<Buffer>& host() const { return host_; }
  // Copies staged CUDA buffers back to the device (no-op for CPU buffers).
  void WriteBack();

 private:
  std::string algorithm_;
  std::vector<Buffer> original_;
  std::vector<Buffer> host_;
  std::vector<std::vector<uint64_t>> storage_;
};

}  // namespace gossip_internal
}  // namespace gossipcc
