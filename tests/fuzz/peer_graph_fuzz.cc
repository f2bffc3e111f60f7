// libFuzzer target: gossipcc::MakePeerGraph (algorithms/peer_graph.h), the graph-spec parser
// including user edge lists ("edges:0>1,1>0;1>2,2>1"). Input: the first byte picks the world
// size (1 + byte % 16), the rest is the spec. MakePeerGraph must either throw
// InvalidArgumentError or return a graph whose peer lists keep the header's promises (sorted,
// no duplicates, no self, in range; InPeers exactly the reverse of OutPeers). Any other
// exception, crash, sanitizer report, timeout or out-of-memory is a finding. Run by
// tools/fuzz.sh; the corpus in corpus/peer_graph/ is replayed by
// //tests/fuzz:peer_graph_fuzz_replay.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/peer_graph.h"
#include "comm/core/errors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckGraph(const std::string& input, const gossipcc::PeerGraph& g, int n) {
  FUZZ_CHECK(input, g.world_size() == n, "world_size() differs from the requested size");
  FUZZ_CHECK(input, !g.name().empty(), "empty name()");
  const int64_t period = g.period();
  FUZZ_CHECK(input, period >= 1, "period() < 1");
  // A few steps of the first period, and one far out (step % period must be used).
  std::vector<int64_t> steps;
  for (int64_t k = 0; k < std::min<int64_t>(period, 4); ++k) steps.push_back(k);
  steps.push_back(period * 1000003 + period - 1);
  for (int64_t step : steps) {
    std::vector<std::vector<int>> out(n);
    for (int r = 0; r < n; ++r) {
      out[r] = g.OutPeers(r, step);
      const std::vector<int>& o = out[r];
      FUZZ_CHECK(input, std::is_sorted(o.begin(), o.end()), "OutPeers not sorted");
      FUZZ_CHECK(input, std::adjacent_find(o.begin(), o.end()) == o.end(), "OutPeers has duplicates");
      for (int q : o) {
        FUZZ_CHECK(input, q >= 0 && q < n, "OutPeers has a rank out of range");
        FUZZ_CHECK(input, q != r, "OutPeers contains the rank itself");
      }
      const double share = g.UniformShare(r, step);
      FUZZ_CHECK(input, share > 0 && share <= 1, "UniformShare outside (0, 1]");
    }
    if (step == steps.back()) {
      // The far step behaves like its residue.
      std::vector<int> near = g.OutPeers(0, step % period);
      FUZZ_CHECK(input, near == out[0], "OutPeers(step) != OutPeers(step % period)");
    }
    for (int r = 0; r < n; ++r) {
      std::vector<int> expected;
      for (int j = 0; j < n; ++j) {
        if (std::binary_search(out[j].begin(), out[j].end(), r)) expected.push_back(j);
      }
      FUZZ_CHECK(input, g.InPeers(r, step) == expected, "InPeers is not the reverse of OutPeers");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int n = 1 + data[0] % 16;
  const std::string spec(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<gossipcc::PeerGraph> g;
  try {
    g = gossipcc::MakePeerGraph(spec, n);
  } catch (const gossipcc::InvalidArgumentError& e) {
    FUZZ_CHECK(input, e.what()[0] != '\0', "empty error message");
    return 0;
  } catch (const std::exception& e) {
    gossipcc::fuzz::Finding(input, std::string("exception other than InvalidArgumentError: ") + e.what());
  } catch (...) {
    gossipcc::fuzz::Finding(input, "non-std exception");
  }
  FUZZ_CHECK(input, g != nullptr, "null graph");
  try {
    CheckGraph(input, *g, n);
  } catch (const std::exception& e) {
    gossipcc::fuzz::Finding(input, std::string("exception from a parsed graph's peer lists: ") + e.what());
  }
  return 0;
}
