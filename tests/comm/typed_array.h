// Test helper: an owning array of any gossipcc dtype, read and written as doubles.
#pragma once

#include <cstring>
#include <vector>

#include "comm/core/reduce.h"
#include "comm/core/types.h"

namespace gossipcc {
namespace testing {

class TypedArray {
 public:
  TypedArray(DType dtype, size_t count) : dtype_(dtype), count_(count), bytes_(count * ElementSize(dtype) + 1) {}

  Buffer buffer() { return Buffer{bytes_.data(), count_, dtype_, Device::CPU()}; }
  Buffer slice(size_t offset, size_t count) {
    return Buffer{bytes_.data() + offset * ElementSize(dtype_), count, dtype_, Device::CPU()};
  }
  size_t size() const { return count_; }
  DType dtype() const { return dtype_; }

  void set(size_t i, double v) {
    uint8_t* p = bytes_.data() + i * ElementSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: Put<float>(p, static_cast<float>(v)); break;
      case DType::kFloat64: Put<double>(p, v); break;
      case DType::kFloat16: Put<uint16_t>(p, FloatToHalf(static_cast<float>(v))); break;
      case DType::kBFloat16: Put<uint16_t>(p, FloatToBFloat16(static_cast<float>(v))); break;
      case DType::kInt8: Put<int8_t>(p, static_cast<int8_t>(v)); break;
      case DType::kUInt8: Put<uint8_t>(p, static_cast<uint8_t>(v)); break;
      case DType::kInt32: Put<int32_t>(p, static_cast<int32_t>(v)); break;
      case DType::kInt64: Put<int64_t>(p, static_cast<int64_t>(v)); break;
    }
  }

  double get(size_t i) const {
    const uint8_t* p = bytes_.data() + i * ElementSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: return Get<float>(p);
      case DType::kFloat64: return Get<double>(p);
      case DType::kFloat16: return HalfToFloat(Get<uint16_t>(p));
      case DType::kBFloat16: return BFloat16ToFloat(Get<uint16_t>(p));
      case DType::kInt8: return Get<int8_t>(p);
      case DType::kUInt8: return Get<uint8_t>(p);
      case DType::kInt32: return Get<int32_t>(p);
      case DType::kInt64: return static_cast<double>(Get<int64_t>(p));
    }
    return 0;
  }

  // Raw bytes, for bit-exact comparisons.
  const std::vector<uint8_t>& raw() const { return bytes_; }

 private:
  template <typename T>
  static void Put(uint8_t* p, T v) { std::memcpy(p, &v, sizeof(T)); }
  template <typename T>
  static T Get(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }

  DType dtype_;
  size_t count_;
  std::vector<uint8_t> bytes_;  // one spare byte so data() is non-null for count 0
};

// Tolerance for comparing a reduced value with its double-precision reference.
inline double Tolerance(DType dtype, double reference) {
  const double mag = reference < 0 ? -reference : reference;
  switch (dtype) {
    case DType::kFloat32: return 1e-6 * (1 + mag);
    case DType::kFloat64: return 1e-12 * (1 + mag);
    case DType::kFloat16: return 1e-3 * (1 + mag);
    case DType::kBFloat16: return 8e-3 * (1 + mag);
    default: return 0;
  }
}

inline const std::vector<DType>& AllDTypes() {
  static const std::vector<DType> all = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                         DType::kInt8,    DType::kUInt8,   DType::kInt32,   DType::kInt64};
  return all;
}

}  // namespace testing
}  // namespace gossipcc
