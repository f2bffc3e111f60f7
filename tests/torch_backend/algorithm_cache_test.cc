// torch_backend/algorithm_cache.h: one object per (type, key), made once, nothing kept when the
// maker throws, counters per name.
#include "torch_backend/algorithm_cache.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace gossipcc {
namespace torch_backend {
namespace {

struct Graph {
  std::string name;
};
struct State {
  int value = 0;
};

TEST(AlgorithmCacheTest, MakesOncePerTypeAndKey) {
  AlgorithmCache cache;
  int made = 0;
  auto make = [&] {
    ++made;
    return std::make_shared<Graph>(Graph{"ring"});
  };
  std::shared_ptr<Graph> a = cache.Get<Graph>("ring", make);
  std::shared_ptr<Graph> b = cache.Get<Graph>("ring", make);
  EXPECT_EQ(a, b);
  EXPECT_EQ(made, 1);
  EXPECT_NE(cache.Get<Graph>("complete", make), a);
  EXPECT_EQ(made, 2);
  // The same key under another type is another object.
  std::shared_ptr<State> s = cache.Get<State>("ring", [] { return std::make_shared<State>(State{7}); });
  EXPECT_EQ(s->value, 7);
  EXPECT_EQ(cache.Get<Graph>("ring", make)->name, "ring");
  EXPECT_EQ(made, 2);
}

TEST(AlgorithmCacheTest, FindReturnsOnlyWhatWasMade) {
  AlgorithmCache cache;
  EXPECT_EQ(cache.Find<Graph>("ring"), nullptr);
  auto g = cache.Get<Graph>("ring", [] { return std::make_shared<Graph>(Graph{"ring"}); });
  EXPECT_EQ(cache.Find<Graph>("ring"), g);
  EXPECT_EQ(cache.Find<State>("ring"), nullptr);
}

TEST(AlgorithmCacheTest, AMakerThatThrowsLeavesNothing) {
  AlgorithmCache cache;
  EXPECT_THROW(cache.Get<Graph>("bad", []() -> std::shared_ptr<Graph> { throw std::invalid_argument("bad spec"); }),
               std::invalid_argument);
  EXPECT_EQ(cache.Find<Graph>("bad"), nullptr);
  auto g = cache.Get<Graph>("bad", [] { return std::make_shared<Graph>(Graph{"second try"}); });
  EXPECT_EQ(g->name, "second try");
}

TEST(AlgorithmCacheTest, KeepsConstObjects) {
  AlgorithmCache cache;
  std::shared_ptr<const Graph> g = cache.Get<const Graph>("ring", [] { return std::make_shared<const Graph>(Graph{"ring"}); });
  EXPECT_EQ(cache.Find<const Graph>("ring"), g);
  EXPECT_EQ(cache.Find<State>("ring"), nullptr);  // another type
}

TEST(AlgorithmCacheTest, CountersCountPerName) {
  AlgorithmCache cache;
  EXPECT_EQ(cache.Next("a"), 0);
  EXPECT_EQ(cache.Next("a"), 1);
  EXPECT_EQ(cache.Next("b"), 0);
  EXPECT_EQ(cache.Next("a"), 2);
}

TEST(AlgorithmCacheTest, ConcurrentCallersShareOneObject) {
  AlgorithmCache cache;
  std::atomic<int> made{0};
  std::vector<std::shared_ptr<State>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      got[t] = cache.Get<State>("x", [&] {
        ++made;
        return std::make_shared<State>();
      });
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(made.load(), 1);
  for (const auto& g : got) EXPECT_EQ(g, got[0]);
}

}  // namespace
}  // namespace torch_backend
}  // namespace gossipcc
