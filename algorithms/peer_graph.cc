#include "algorithms/peer_graph.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "comm/core/errors.h"

namespace gossipcc {

PeerGraph::PeerGraph(int world_size) : world_size_(world_size) {
  if (world_size < 1) {
    throw InvalidArgumentError(absl::StrCat("peer graph: world size must be >= 1, got ", world_size));
  }
}

void PeerGraph::CheckRank(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    throw InvalidArgumentError(
        absl::StrCat("peer graph ", name(), ": rank ", rank, " out of range [0, ", world_size_, ")"));
  }
}

std::vector<int> PeerGraph::OutPeers(int rank, int64_t step) const {
  CheckRank(rank);
  if (step < 0) {
    throw InvalidArgumentError(absl::StrCat("peer graph ", name(), ": negative step ", step));
  }
  std::vector<int> raw = RawOutPeers(rank, step % period());
  std::vector<int> out;
  out.reserve(raw.size());
  for (int p : raw) {
    int q = ((p % world_size_) + world_size_) % world_size_;
    if (q != rank) out.push_back(q);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> PeerGraph::InPeers(int rank, int64_t step) const {
  CheckRank(rank);
  std::vector<int> in;
  for (int j = 0; j < world_size_; ++j) {
    if (j == rank) continue;
    std::vector<int> out = OutPeers(j, step);
    if (std::binary_search(out.begin(), out.end(), rank)) in.push_back(j);
  }
  return in;
}

double PeerGraph::UniformShare(int rank, int64_t step) const {
  return 1.0 / static_cast<double>(OutPeers(rank, step).size() + 1);
}

bool PeerGraph::IsSymmetricAt(int64_t step) const {
  for (int i = 0; i < world_size_; ++i) {
    for (int j : OutPeers(i, step)) {
      std::vector<int> back = OutPeers(j, step);
      if (!std::binary_search(back.begin(), back.end(), i)) return false;
    }
  }
  return true;
}

int CeilLog2(int n) {
  int t = 0;
  while ((int64_t{1} << t) < n) ++t;
  return t;
}

namespace {

// A graph given by a rule function.
class RuleGraph : public PeerGraph {
 public:
  using Rule = std::function<std::vector<int>(int rank, int64_t step)>;
  RuleGraph(int world_size, std::string name, int64_t period, Rule rule)
      : PeerGraph(world_size), name_(std::move(name)), period_(std::max<int64_t>(1, period)),
        rule_(std::move(rule)) {}
  std::string name() const override { return name_; }
  int64_t period() const override { return period_; }

 protected:
  std::vector<int> RawOutPeers(int rank, int64_t step) const override { return rule_(rank, step); }

 private:
  std::string name_;
  int64_t period_;
  Rule rule_;
};

// Offsets cycled one per step; de-duplicated modulo n (same for every rank), zero dropped.
std::unique_ptr<PeerGraph> CyclingOffsetGraph(int n, std::string name, const std::vector<int64_t>& raw) {
  std::vector<int64_t> offsets;
  std::set<int64_t> seen;
  for (int64_t o : raw) {
    int64_t m = ((o % n) + n) % n;
    if (m == 0 || !seen.insert(m).second) continue;
    offsets.push_back(m);
  }
  if (offsets.empty()) offsets.push_back(0);  // n == 1: no peers
  int64_t period = static_cast<int64_t>(offsets.size());
  return std::make_unique<RuleGraph>(n, std::move(name), period, [offsets, n](int rank, int64_t step) {
    return std::vector<int>{static_cast<int>((rank + offsets[step]) % n)};
  });
}

}  // namespace

std::unique_ptr<PeerGraph> MakeExponentialGraph(int n, int peers) {
  if (peers < 1) throw InvalidArgumentError(absl::StrCat("exponential graph: peers must be >= 1, got ", peers));
  if (n < 1) throw InvalidArgumentError(absl::StrCat("peer graph: world size must be >= 1, got ", n));
  // T = floor(log_{p+1}(n-1)) + 1; powers[m] = (p+1)^m for m < T.
  std::vector<int64_t> powers;
  if (n > 1) {
    int64_t pw = 1;
    while (pw <= n - 1) {
      powers.push_back(pw);
      pw *= int64_t{peers} + 1;  // int64: peers may be INT_MAX
    }
  } else {
    powers.push_back(0);
  }
  std::string name = absl::StrCat("exponential(peers=", peers, ")");
  return std::make_unique<RuleGraph>(n, name, static_cast<int64_t>(powers.size()),
                                     [powers, peers, n](int rank, int64_t step) {
                                       std::vector<int> out;
                                       if (n == 1) return out;
                                       // j and j + n give the same peer: listing j <= n is enough
                                       // (and keeps a huge `peers` from costing memory and time).
                                       const int distinct = std::min(peers, n);
                                       for (int j = 1; j <= distinct; ++j) {
                                         out.push_back(static_cast<int>((rank + j * powers[step]) % n));
                                       }
                                       return out;
                                     });
}

std::unique_ptr<PeerGraph> MakeDirectedExponentialGraph(int n) {
  std::vector<int64_t> raw;
  for (int64_t pw = 1; pw < n; pw *= 2) {
    raw.push_back(pw);
    raw.push_back(-pw);
  }
  return CyclingOffsetGraph(n, "directed_exponential", raw);
}

std::unique_ptr<PeerGraph> MakeBipartiteExponentialGraph(int n) {
  if (n > 1 && n % 2 != 0) {
    throw InvalidArgumentError(absl::StrCat("bipartite_exponential graph needs an even world size, got ", n));
  }
  std::vector<int64_t> raw = {1, -1};
  for (int64_t pw = 2; 1 + pw < n; pw *= 2) {
    raw.push_back(1 + pw);
    raw.push_back(-(1 + pw));
  }
  return CyclingOffsetGraph(n, "bipartite_exponential", raw);
}

std::unique_ptr<PeerGraph> MakeRingGraph(int n, bool directed) {
  return std::make_unique<RuleGraph>(n, directed ? "ring(directed)" : "ring", 1, [n, directed](int rank, int64_t) {
    if (directed) return std::vector<int>{rank + 1};
    return std::vector<int>{rank + 1, rank - 1 + n};
  });
}

std::unique_ptr<PeerGraph> MakeCompleteGraph(int n) {
  return std::make_unique<RuleGraph>(n, "complete", 1, [n](int, int64_t) {
    std::vector<int> out(n);
    for (int j = 0; j < n; ++j) out[j] = j;
    return out;
  });
}

std::unique_ptr<PeerGraph> MakeStaticExponentialGraph(int n) {
  int tau = CeilLog2(n);
  return std::make_unique<RuleGraph>(n, "static_exponential", 1, [n, tau](int rank, int64_t) {
    std::vector<int> out;
    for (int m = 0; m < tau; ++m) out.push_back(static_cast<int>((rank + (int64_t{1} << m)) % n));
    return out;
  });
}

std::unique_ptr<PeerGraph> MakeHypercubeGraph(int n) {
  int tau = CeilLog2(n);
  if (n < 1 || (1 << tau) != n) {
    throw InvalidArgumentError(absl::StrCat("hypercube graph needs a power-of-two world size, got ", n));
  }
  return std::make_unique<RuleGraph>(n, "hypercube", std::max(1, tau), [tau](int rank, int64_t step) {
    if (tau == 0) return std::vector<int>{};
    return std::vector<int>{rank ^ (1 << step)};
  });
}

namespace {

class EdgeListGraph : public PeerGraph {
 public:
  EdgeListGraph(int n, std::vector<std::vector<std::vector<int>>> out) : PeerGraph(n), out_(std::move(out)) {}
  std::string name() const override {
    return out_.size() == 1 ? "edges" : absl::StrCat("edges(", out_.size(), " phases)");
  }
  int64_t period() const override { return static_cast<int64_t>(out_.size()); }

 protected:
  std::vector<int> RawOutPeers(int rank, int64_t step) const override { return out_[step][rank]; }

 private:
  std::vector<std::vector<std::vector<int>>> out_;  // [phase][rank] -> out-peers
};

std::string EdgeName(const Edge& e) { return absl::StrCat(e.first, ">", e.second); }

}  // namespace

std::unique_ptr<PeerGraph> MakeEdgeListGraph(int n, std::vector<std::vector<Edge>> phases) {
  if (n < 1) throw InvalidArgumentError(absl::StrCat("edge-list graph: world size must be >= 1, got ", n));
  if (phases.empty()) throw InvalidArgumentError("edge-list graph: no phases given");
  std::vector<std::vector<std::vector<int>>> out(phases.size(), std::vector<std::vector<int>>(n));
  std::vector<std::vector<int>> adj(n), radj(n);  // union graph
  for (size_t k = 0; k < phases.size(); ++k) {
    std::set<Edge> seen;
    for (const Edge& e : phases[k]) {
      std::string where = phases.size() > 1 ? absl::StrCat(" in phase ", k) : "";
      if (e.first < 0 || e.first >= n || e.second < 0 || e.second >= n) {
        throw InvalidArgumentError(absl::StrCat("edge-list graph: edge ", EdgeName(e), where,
                                                " has a rank out of range [0, ", n, ")"));
      }
      if (e.first == e.second) {
        throw InvalidArgumentError(absl::StrCat("edge-list graph: edge ", EdgeName(e), where, " is a self loop"));
      }
      if (!seen.insert(e).second) {
        throw InvalidArgumentError(absl::StrCat("edge-list graph: duplicate edge ", EdgeName(e), where));
      }
      out[k][e.first].push_back(e.second);
      adj[e.first].push_back(e.second);
      radj[e.second].push_back(e.first);
    }
  }
  // Strong connectivity of the union graph: every rank reachable from 0, and 0 from every rank.
  auto reach = [n](const std::vector<std::vector<int>>& g) {
    std::vector<bool> seen(n, false);
    std::vector<int> stack = {0};
    seen[0] = true;
    while (!stack.empty()) {
      int v = stack.back();
      stack.pop_back();
      for (int w : g[v]) {
        if (!seen[w]) {
          seen[w] = true;
          stack.push_back(w);
        }
      }
    }
    return seen;
  };
  std::vector<bool> fwd = reach(adj), bwd = reach(radj);
  for (int r = 0; r < n; ++r) {
    if (radj[r].empty()) {
      throw InvalidArgumentError(absl::StrCat("edge-list graph: rank ", r, " is never reached (no edge into it)"));
    }
    if (adj[r].empty()) {
      throw InvalidArgumentError(absl::StrCat("edge-list graph: rank ", r, " never sends (no edge out of it)"));
    }
    if (!fwd[r]) {
      throw InvalidArgumentError(absl::StrCat("edge-list graph: rank ", r, " is never reached from rank 0"));
    }
    if (!bwd[r]) {
      throw InvalidArgumentError(absl::StrCat("edge-list graph: rank 0 is never reached from rank ", r));
    }
  }
  return std::make_unique<EdgeListGraph>(n, std::move(out));
}

namespace {

constexpr const char* kValidGraphs =
    "valid graphs: exponential[:peers=P], directed_exponential, bipartite_exponential, "
    "ring[:directed=0|1], complete, static_exponential, hypercube, edges:A>B,C>D[;...]";

int ParseInt(absl::string_view s, absl::string_view what, const std::string& spec) {
  int v = 0;
  if (!absl::SimpleAtoi(s, &v)) {
    throw InvalidArgumentError(absl::StrCat("peer graph spec '", spec, "': ", what, " '", s,
                                            "' is not an integer"));
  }
  return v;
}

}  // namespace

std::unique_ptr<PeerGraph> MakePeerGraph(const std::string& spec, int world_size) {
  absl::string_view s = spec;
  size_t colon = s.find(':');
  // Graph names and option keys in any case ("Ring", "ring:Directed=1"), as every option string.
  const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(0, colon)));
  absl::string_view rest = colon == absl::string_view::npos ? absl::string_view() : s.substr(colon + 1);

  if (name == "edges") {
    std::vector<std::vector<Edge>> phases;
    for (absl::string_view phase : absl::StrSplit(rest, ';')) {
      std::vector<Edge> edges;
      for (absl::string_view e : absl::StrSplit(phase, ',', absl::SkipWhitespace())) {
        std::vector<absl::string_view> ab = absl::StrSplit(e, '>');
        if (ab.size() != 2) {
          throw InvalidArgumentError(absl::StrCat("peer graph spec '", spec, "': edge '", e,
                                                  "' is not of the form SRC>DST"));
        }
        edges.emplace_back(ParseInt(absl::StripAsciiWhitespace(ab[0]), "rank", spec),
                           ParseInt(absl::StripAsciiWhitespace(ab[1]), "rank", spec));
      }
      phases.push_back(std::move(edges));
    }
    return MakeEdgeListGraph(world_size, std::move(phases));
  }

  std::map<std::string, std::string> kv;
  for (absl::string_view item : absl::StrSplit(rest, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (parts.size() != 2) {
      throw InvalidArgumentError(absl::StrCat("peer graph spec '", spec, "': option '", item,
                                              "' is not of the form key=value"));
    }
    kv[absl::AsciiStrToLower(absl::StripAsciiWhitespace(parts[0]))] =
        std::string(absl::StripAsciiWhitespace(parts[1]));
  }
  auto allow = [&](std::vector<std::string> keys) {
    for (const auto& [k, v] : kv) {
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
        throw InvalidArgumentError(absl::StrCat(
            "peer graph spec '", spec, "': unknown key '", k, "' for graph '", name, "'; valid keys: ",
            keys.empty() ? std::string("(none)") : absl::StrJoin(keys, ", ")));
      }
    }
  };
  if (name == "exponential") {
    allow({"peers"});
    int peers = kv.count("peers") ? ParseInt(kv["peers"], "peers", spec) : 1;
    return MakeExponentialGraph(world_size, peers);
  }
  if (name == "ring") {
    allow({"directed"});
    int d = kv.count("directed") ? ParseInt(kv["directed"], "directed", spec) : 0;
    if (d != 0 && d != 1) {
      throw InvalidArgumentError(absl::StrCat("peer graph spec '", spec, "': directed must be 0 or 1"));
    }
    return MakeRingGraph(world_size, d == 1);
  }
  allow({});
  if (name == "directed_exponential") return MakeDirectedExponentialGraph(world_size);
  if (name == "bipartite_exponential") return MakeBipartiteExponentialGraph(world_size);
  if (name == "complete") return MakeCompleteGraph(world_size);
  if (name == "static_exponential") return MakeStaticExponentialGraph(world_size);
  if (name == "hypercube") return MakeHypercubeGraph(world_size);
  throw InvalidArgumentError(absl::StrCat("peer graph spec '", spec, "': unknown graph '", name, "'; ",
                                          kValidGraphs));
}

}  // namespace gossipcc
