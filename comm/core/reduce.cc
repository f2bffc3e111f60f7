#include "comm/core/reduce.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace {

template <typename T>
struct Sum { static T Apply(T a, T b) { return static_cast<T>(a + b); } };
template <typename T>
struct Prod { static T Apply(T a, T b) { return static_cast<T>(a * b); } };
template <typename T>
struct Min { static T Apply(T a, T b) { return std::min(a, b); } };
template <typename T>
struct Max { static T Apply(T a, T b) { return std::max(a, b); } };
// Floating min/max propagate NaN, as torch.minimum/maximum and NCCL do. std::min/max would
// keep or drop a NaN depending on the operand order, i.e. on which rank held it.
template <typename T>
struct NanMin { static T Apply(T a, T b) { return (a != a || b != b) ? a + b : std::min(a, b); } };
template <typename T>
struct NanMax { static T Apply(T a, T b) { return (a != a || b != b) ? a + b : std::max(a, b); } };

// Integer sums wrap (two's complement) like torch and NCCL; do them unsigned to avoid UB.
template <typename T>
struct WrappingSum {
  static T Apply(T a, T b) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
};
template <typename T>
struct WrappingProd {
  static T Apply(T a, T b) {
    using U = std::make_unsigned_t<T>;
    using Wide = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<Wide>(static_cast<U>(a)) * static_cast<Wide>(static_cast<U>(b))));
  }
};

template <typename T>
struct BitAnd { static T Apply(T a, T b) { return static_cast<T>(a & b); } };
template <typename T>
struct BitOr { static T Apply(T a, T b) { return static_cast<T>(a | b); } };
template <typename T>
struct BitXor { static T Apply(T a, T b) { return static_cast<T>(a ^ b); } };

template <typename T, template <typename> class Op>
void Kernel(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op<T>::Apply(x[i], y[i]);
}

template <typename T>
ReduceFn ForFloat(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return &Kernel<T, Sum>;
    case ReduceOp::kProduct: return &Kernel<T, Prod>;
    case ReduceOp::kMin: return &Kernel<T, NanMin>;
    case ReduceOp::kMax: return &Kernel<T, NanMax>;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: return nullptr;  // refused by CheckReduceSupported
  }
  return nullptr;
}

template <typename T>
ReduceFn ForInt(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &Kernel<T, WrappingSum>;
    case ReduceOp::kProduct: return &Kernel<T, WrappingProd>;
    case ReduceOp::kMin: return &Kernel<T, Min>;
    case ReduceOp::kMax: return &Kernel<T, Max>;
    case ReduceOp::kBand: return &Kernel<T, BitAnd>;
    case ReduceOp::kBor: return &Kernel<T, BitOr>;
    case ReduceOp::kBxor: return &Kernel<T, BitXor>;
    case ReduceOp::kAvg: return nullptr;
  }
  return nullptr;
}

}  // namespace

void CheckReduceSupported(DType dtype, ReduceOp op) {
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
    throw InvalidArgumentError(absl::StrCat("reduce op avg is not supported for integer dtype ", DTypeName(dtype),
                                            " (integer division would truncate); use sum and divide"));
  }
  if (IsBitwise(op) && IsFloatingPoint(dtype)) {
    throw InvalidArgumentError(absl::StrCat("reduce op ", ReduceOpName(op), " needs an integer dtype (int8, uint8, int32, ",
                                            "int64; bool travels as uint8), got ", DTypeName(dtype)));
  }
}

ReduceFn GetReduceFn(DType dtype, ReduceOp op) {
  CheckReduceSupported(dtype, op);
  switch (dtype) {
    case DType::kFloat32: return ForFloat<float>(op);
    case DType::kFloat64: return ForFloat<double>(op);
    case DType::kInt8: return ForInt<int8_t>(op);
    case DType::kUInt8: return ForInt<uint8_t>(op);
    case DType::kInt32: return ForInt<int32_t>(op);
    case DType::kInt64: return ForInt<int64_t>(op);
    case DType::kFloat16:
    case DType::kBFloat16: break;
  }
  throw InvalidArgumentError(absl::StrCat("no direct reduction kernel for ", DTypeName(dtype),
                                          ": half-precision data is widened to float32 first"));
}

void ScaleInPlace(void* data, size_t count, DType dtype, double factor) {
  if (dtype == DType::kFloat32) {
    float* p = static_cast<float*>(data);
    const float f = static_cast<float>(factor);
    for (size_t i = 0; i < count; ++i) p[i] *= f;
  } else if (dtype == DType::kFloat64) {
    double* p = static_cast<double*>(data);
    for (size_t i = 0; i < count; ++i) p[i] *= factor;
  } else {
    throw InvalidArgumentError(absl::StrCat("ScaleInPlace: unsupported dtype ", DTypeName(dtype)));
  }
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24 -> mantissa into 10-bit subnormal field
    uint32_t half_m = m >> (shift);
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  // normal: rebias exponent, round mantissa to 10 bits (nearest even)
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float BFloat16ToFloat(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

uint16_t FloatToBFloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

void WidenToFloat(const void* src, DType dtype, float* dst, size_t count) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(s[i]);
  } else if (dtype == DType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) dst[i] = BFloat16ToFloat(s[i]);
  } else {
    throw InvalidArgumentError(absl::StrCat("WidenToFloat: not a half dtype: ", DTypeName(dtype)));
  }
}

void NarrowFromFloat(const float* src, float scale, DType dtype, void* dst, size_t count) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < count; ++i) d[i] = FloatToHalf(src[i] * scale);
  } else if (dtype == DType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) d[i] = FloatToBFloat16(src[i] * scale);
  } else {
    throw InvalidArgumentError(absl::StrCat("NarrowFromFloat: not a half dtype: ", DTypeName(dtype)));
  }
}

void ReduceInRankOrder(const std::vector<const void*>& sources, Buffer out, ReduceOp op, WideScratch& scratch) {
  const size_t count = out.count;
  const int n = static_cast<int>(sources.size());
  if (count == 0 || n == 0) return;
  if (IsHalfPrecision(out.dtype)) {
    if (scratch.acc.size() < count) scratch.acc.resize(count), scratch.next.resize(count);
    const ReduceFn fn = GetReduceFn(DType::kFloat32, op);
    WidenToFloat(sources[0], out.dtype, scratch.acc.data(), count);
    for (int r = 1; r < n; ++r) {
      WidenToFloat(sources[r], out.dtype, scratch.next.data(), count);
      fn(scratch.acc.data(), scratch.acc.data(), scratch.next.data(), count);
    }
    const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(n) : 1.0f;
    NarrowFromFloat(scratch.acc.data(), scale, out.dtype, out.data, count);
    return;
  }
  const ReduceFn fn = GetReduceFn(out.dtype, op);
  if (n == 1) {
    if (out.data != sources[0]) std::memmove(out.data, sources[0], out.bytes());
  } else {
    fn(out.data, sources[0], sources[1], count);  // element-wise, so out may alias either
    for (int r = 2; r < n; ++r) fn(out.data, out.data, sources[r], count);
  }
  if (op == ReduceOp::kAvg) ScaleInPlace(out.data, count, out.dtype, 1.0 / static_cast<double>(n));
}

}  // namespace gossipcc
