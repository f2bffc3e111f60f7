// Throughput and size of the lossless float32 packing (comm/gloo/float32_packing.h) on 1 MiB
// segments (the packed ring's largest), one thread, against memcpy of the same bytes.
//
//   bazel run //comm/bench:float32_packing_bench
//
// Data: normal random values; gradient-like values (magnitudes spread over a few binades,
// a third exact zeros in runs, as ReLU layers leave them); uniformly random bit patterns
// (incompressible: the raw fallback). A real model's gradients: tools/bench/packing_ratio.py.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/gloo/float32_packing.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint32_t> Make(const std::string& kind, size_t count) {
  std::mt19937 rng(1);
  std::vector<uint32_t> v(count);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < count; ++i) {
    float f = 0.0f;
    if (kind == "normal") {
      f = normal(rng);
    } else if (kind == "gradient-like") {
      f = (i / 256) % 3 == 0 ? 0.0f : normal(rng) * 1e-3f;
    } else {
      const uint32_t bits = static_cast<uint32_t>(rng());
      v[i] = bits;
      continue;
    }
    std::memcpy(&v[i], &f, 4);
  }
  return v;
}

// Best of `reps` timings of fn, in seconds.
template <typename Fn>
double Best(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  const size_t count = (size_t{1} << 20) / 4;
  const int segments = 64;  // 64 MiB per timing
  std::printf("| data | packed / raw | pack (GB/s of raw) | unpack (GB/s of raw) | memcpy (GB/s) |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const std::string kind : {"normal", "gradient-like", "random bits"}) {
    const std::vector<uint32_t> values = Make(kind, count);
    std::vector<uint8_t> packed(gossipcc::PackedFloat32Bound(count));
    std::vector<uint32_t> back(count), copy(count);
    size_t bytes = 0;
    const double pack = Best(5, [&] {
      for (int s = 0; s < segments; ++s) bytes = gossipcc::PackFloat32(values, packed.data());
    });
    const double unpack = Best(5, [&] {
      for (int s = 0; s < segments; ++s) {
        if (!gossipcc::UnpackFloat32(packed, absl::MakeSpan(back)).ok()) std::abort();
      }
    });
    const double memcpy_s = Best(5, [&] {
      for (int s = 0; s < segments; ++s) std::memcpy(copy.data(), values.data(), count * 4);
    });
    if (back != values) {
      std::fprintf(stderr, "%s: round trip changed the values\n", kind.c_str());
      return 1;
    }
    const double total = static_cast<double>(count) * 4 * segments / 1e9;
    std::printf("| %s | %.3f | %.2f | %.2f | %.2f |\n", kind.c_str(), static_cast<double>(bytes) / (count * 4.0),
                total / pack, total / unpack, total / memcpy_s);
  }
  return 0;
}
