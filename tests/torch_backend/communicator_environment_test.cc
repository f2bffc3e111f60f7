// The check at process group creation that every rank shares the settings that must agree
// (torch_backend/communicator_environment.h), on ranks as threads over an in-process store; and
// the environment's parsing naming the variable. Torch-free.
#include "torch_backend/communicator_environment.h"

#include <stdlib.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/core/errors.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace torch_backend {
namespace {

using std::chrono::milliseconds;

// Runs AgreeOnSharedSettings on `settings.size()` ranks (threads); each rank's error text, or "".
std::vector<std::string> Agree(const std::vector<std::vector<SharedSetting>>& settings,
                               const std::vector<std::string>& errors, milliseconds timeout = milliseconds(20000),
                               int absent = -1) {
  const int size = static_cast<int>(settings.size());
  auto store = MakeHashStore();
  std::vector<std::string> out(settings.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    if (r == absent) continue;
    threads.emplace_back([&, r] {
      try {
        AgreeOnSharedSettings(*store, r, size, settings[r], errors[r], timeout);
      } catch (const std::exception& e) {
        out[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<SharedSetting> Settings(const std::string& policy, int lanes, bool lanes_set) {
  CommunicatorOptions o;
  o.collective_lanes = lanes;
  if (lanes_set) {
    setenv("GOSSIPCC_COLLECTIVE_LANES", std::to_string(lanes).c_str(), 1);
  } else {
    unsetenv("GOSSIPCC_COLLECTIVE_LANES");
  }
  auto s = SharedSettings(o, AllreducePolicy::Parse(policy), "gossipcc.configure(allreduce=...)");
  unsetenv("GOSSIPCC_COLLECTIVE_LANES");
  return s;
}

TEST(SharedSettingsTest, EqualSettingsPass) {
  const auto s = Settings("powersgd:rank=2", 2, false);
  EXPECT_EQ(Agree({s, s, s}, {"", "", ""}), std::vector<std::string>(3, ""));
}

TEST(SharedSettingsTest, EveryRankNamesEachDifferenceAndEveryRanksValue) {
  const auto a = Settings("exact", 2, false);
  const auto b = Settings("POWERSGD:Rank=2", 3, true);
  const auto out = Agree({a, b, a}, {"", "", ""});
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(out[r].find("rank " + std::to_string(r) + " of 3: gossipcc.configure(allreduce=...) differs across "
                          "ranks: ranks 0, 2: 'exact', rank 1: 'powersgd:rank=2'; GOSSIPCC_COLLECTIVE_LANES differs "
                          "across ranks: ranks 0, 2: '2' (unset), rank 1: '3'; every rank must use the same value"),
              std::string::npos)
        << out[r];
  }
}

TEST(SharedSettingsTest, AnInvalidRankFailsItselfAndEveryOther) {
  const auto s = Settings("exact", 2, false);
  const auto out = Agree({s, {}, s}, {"", "GOSSIPCC_COLLECTIVE_LANES='99': out of range", ""});
  EXPECT_EQ(out[1], "GOSSIPCC_COLLECTIVE_LANES='99': out of range");
  for (int r : {0, 2}) {
    EXPECT_NE(out[r].find("the settings of another rank are invalid, so this group cannot be created: rank 1: "
                          "GOSSIPCC_COLLECTIVE_LANES='99': out of range"),
              std::string::npos)
        << out[r];
  }
}

TEST(SharedSettingsTest, AMissingRankIsNamedWithinTheTimeout) {
  const auto s = Settings("exact", 2, false);
  const auto start = std::chrono::steady_clock::now();
  const auto out = Agree({s, s, s}, {"", "", ""}, milliseconds(300), /*absent=*/2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));  // a safety net, not a bound
  for (int r : {0, 1}) {
    EXPECT_NE(out[r].find("rendezvous did not complete within 300 ms: rank 2 never published its settings"),
              std::string::npos)
        << out[r];
  }
}

TEST(EnvironmentTest, ErrorsNameTheVariable) {
  setenv("GOSSIPCC_COLLECTIVE_LANES", "99", 1);
  setenv("GOSSIPCC_P2P_SEGMENT_BYTES", "12", 1);
  try {
    CommunicatorOptionsFromEnvironment(CommunicatorOptions{}, milliseconds(1000));
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgumentError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GOSSIPCC_COLLECTIVE_LANES='99': out of range: collective_lanes must be in [1, 8], got 99"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("GOSSIPCC_P2P_SEGMENT_BYTES='12': out of range: p2p_segment_bytes must be 0 (off) or in"),
              std::string::npos)
        << msg;
  }
  unsetenv("GOSSIPCC_COLLECTIVE_LANES");
  unsetenv("GOSSIPCC_P2P_SEGMENT_BYTES");
  const auto findings = CheckEnvironment();
  EXPECT_TRUE(findings.empty());
}

}  // namespace
}  // namespace torch_backend
}  // namespace gossipcc
