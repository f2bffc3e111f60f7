// What the tests of the two-level gossip rounds (hierarchical_*_test.cc) check the same way: the
// host means a reference starts from, and a run's result against the reference over the hosts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {

// Each host's mean of its ranks' inputs input(rank, i), i < count; `total` gets the sum over all.
std::vector<std::vector<double>> HostMeans(const HostLayout& layout, size_t count,
                                           const std::function<float(int, size_t)>& input, double* total);

// got[rank] (each rank's final buffer) against want[host] elementwise (to 1e-4), every rank of a
// host bitwise equal, the sum over all ranks equal to `total` (float32 rounding), and
// sent_across[rank] equal to per_round_messages(host) x (its slice's bytes + header_bytes).
void CheckHostRound(const HostLayout& layout, const std::vector<std::vector<float>>& got,
                    const std::vector<std::vector<double>>& want, double total,
                    const std::vector<uint64_t>& sent_across, const std::function<uint64_t(int host)>& messages,
                    uint64_t header_bytes);

}  // namespace testing
}  // namespace gossipcc
