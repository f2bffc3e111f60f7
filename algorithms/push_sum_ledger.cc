#include "algorithms/push_sum_ledger.h"

namespace gossipcc {
namespace {

void Record(std::map<int, std::vector<double>>& records, int peer, const double* msg, size_t words, double sign) {
  std::vector<double>& rec = records[peer];
  rec.resize(words, 0.0);
  for (size_t k = 0; k < words; ++k) rec[k] += sign * msg[k];
}

}  // namespace

void MassLedger::Sent(int peer, const double* mass, size_t words) {
  Record(sent_, peer, mass, words, 1.0);
  Record(net_, peer, mass, words, 1.0);
}

void MassLedger::Received(int peer, const double* mass, size_t words) {
  Record(recv_, peer, mass, words, 1.0);
  Record(net_, peer, mass, words, -1.0);
}

std::vector<double> MassLedger::Settle(const std::vector<int>& dead,
                                       const std::vector<std::pair<int, std::vector<double>>>& sent_to_me,
                                       const std::vector<int>& survivors, size_t words) {
  std::vector<double> corr(words, 0.0);
  auto add = [&](const std::vector<double>& v, double sign, std::vector<double>* also = nullptr) {
    for (size_t k = 0; k < v.size() && k < words; ++k) {
      corr[k] += sign * v[k];
      if (also) {
        also->resize(words, 0.0);
        (*also)[k] -= sign * v[k];  // what we take in from a peer lowers our net flow to it
      }
    }
  };
  // The dead: undo every exchange with them since the start (net = sent - received).
  for (int d : dead) {
    if (auto it = net_.find(d); it != net_.end()) {
      add(it->second, +1);
      net_.erase(it);
    }
  }
  // Survivors: mass in flight (sent, not applied) or half-applied (applied, not recorded as
  // sent) since the last recovery.
  for (const auto& [j, buf] : sent_to_me) add(buf, +1, &net_[j]);
  for (int j : survivors) {
    if (auto it = recv_.find(j); it != recv_.end()) add(it->second, -1, &net_[j]);
  }
  sent_.clear();
  recv_.clear();
  return corr;
}

}  // namespace gossipcc
