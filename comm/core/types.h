// Element types, devices, reduction ops and the Buffer view every collective takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace gossipcc {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
};

inline constexpr int kNumDTypes = 8;

size_t ElementSize(DType dtype);
const char* DTypeName(DType dtype);
bool IsFloatingPoint(DType dtype);
// float16 and bfloat16: reduced in float32 ("accumulate wide").
bool IsHalfPrecision(DType dtype);

// kBand/kBor/kBxor: bitwise and/or/xor, for integer dtypes only (CheckReduceSupported).
enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax, kProduct, kBand, kBor, kBxor };
inline constexpr int kNumReduceOps = 8;
const char* ReduceOpName(ReduceOp op);
inline bool IsBitwise(ReduceOp op) { return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor; }

struct Device {
  enum class Type : uint8_t { kCPU, kCUDA };
  Type type = Type::kCPU;
  int index = -1;  // CUDA ordinal; -1 for CPU.

  static Device CPU() { return Device{}; }
  static Device CUDA(int ordinal) { return Device{Type::kCUDA, ordinal}; }
  bool is_cuda() const { return type == Type::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;  // "cpu", "cuda:0"
};

// A non-owning view of `count` elements of `dtype` at `data` on `device`.
// The caller keeps the memory alive until the operation's Work completes.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  Device device;

  size_t bytes() const { return count * ElementSize(dtype); }
  std::string ToString() const;  // "1024 x float32 on cpu"
};

// Maps a C++ element type to its DType (float, double, int8_t, uint8_t, int32_t, int64_t).
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kInt8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };

// Convenience: a CPU view of a typed array.
template <typename T>
Buffer CpuBuffer(T* data, size_t count) {
  return Buffer{const_cast<std::remove_const_t<T>*>(data), count, DTypeOf<std::remove_const_t<T>>::value,
                Device::CPU()};
}

}  // namespace gossipcc
