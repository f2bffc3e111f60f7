#include "tests/algorithms/host_round_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gtest/gtest.h"

namespace gossipcc {
namespace testing {

std::vector<std::vector<double>> HostMeans(const HostLayout& layout, size_t count,
                                           const std::function<float(int, size_t)>& input, double* total) {
  std::vector<std::vector<double>> means(layout.hosts, std::vector<double>(count, 0.0));
  *total = 0.0;
  for (int r = 0; r < layout.size(); ++r) {
    for (size_t i = 0; i < count; ++i) {
      means[r / layout.per_host][i] += input(r, i) / layout.per_host;
      *total += input(r, i);
    }
  }
  return means;
}

void CheckHostRound(const HostLayout& layout, const std::vector<std::vector<float>>& got,
                    const std::vector<std::vector<double>>& want, double total,
                    const std::vector<uint64_t>& sent_across, const std::function<uint64_t(int host)>& messages,
                    uint64_t header_bytes) {
  const int n = layout.size();
  const size_t count = want[0].size();
  const size_t slice = (count + layout.per_host - 1) / layout.per_host;
  double got_total = 0.0;
  for (int r = 0; r < n; ++r) {
    const int h = r / layout.per_host;
    for (size_t i = 0; i < count; ++i) {
      got_total += got[r][i];
      if (std::abs(got[r][i] - want[h][i]) > 1e-4) {
        FAIL() << "rank " << r << " (host " << h << "), element " << i << ": " << got[r][i] << ", want " << want[h][i];
      }
    }
    const int first = h * layout.per_host;
    EXPECT_EQ(std::memcmp(got[r].data(), got[first].data(), count * sizeof(float)), 0)
        << "rank " << r << " differs from rank " << first << " of its host";
    // The slice's elements of x, not its padding: the last local rank's slice is shorter.
    const size_t slice_first = std::min(count, slice * static_cast<size_t>(r % layout.per_host));
    const size_t length = std::min(count, slice_first + slice) - slice_first;
    EXPECT_EQ(sent_across[r], messages(h) * (length * sizeof(float) + header_bytes)) << "rank " << r;
  }
  EXPECT_NEAR(got_total, total, 1e-6 * n * count * 4);
}

}  // namespace testing
}  // namespace gossipcc
