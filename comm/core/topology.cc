#include "comm/core/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gossipcc {

Topology Topology::Flat(int size) {
  std::vector<std::string> keys, names;
  for (int r = 0; r < size; ++r) {
    keys.push_back(absl::StrCat(r));
    names.push_back(absl::StrCat("host of rank ", r));
  }
  return FromHostKeys(keys, names);
}

Topology Topology::FromHostKeys(const std::vector<std::string>& keys, const std::vector<std::string>& names) {
  Topology t;
  std::map<std::string, int> host_by_key;
  for (size_t r = 0; r < keys.size(); ++r) {
    auto [it, fresh] = host_by_key.emplace(keys[r], static_cast<int>(t.ranks_of_host_.size()));
    if (fresh) {
      t.ranks_of_host_.emplace_back();
      t.host_names_.push_back(names[r]);
    }
    std::vector<int>& ranks = t.ranks_of_host_[static_cast<size_t>(it->second)];
    t.host_of_.push_back(it->second);
    t.local_rank_.push_back(static_cast<int>(ranks.size()));
    ranks.push_back(static_cast<int>(r));
  }
  return t;
}

std::vector<int> Topology::across_hosts(int rank) const {
  std::vector<int> out;
  for (const auto& ranks : ranks_of_host_) out.push_back(ranks[static_cast<size_t>(local_rank(rank))]);
  return out;
}

bool Topology::uniform() const {
  for (const auto& ranks : ranks_of_host_) {
    if (ranks.size() != ranks_of_host_.front().size()) return false;
  }
  return true;
}

bool Topology::any_host_shared() const {
  for (const auto& ranks : ranks_of_host_) {
    if (ranks.size() > 1) return true;
  }
  return false;
}

std::string Topology::Describe() const {
  std::vector<std::string> parts;
  for (size_t h = 0; h < ranks_of_host_.size(); ++h) {
    parts.push_back(absl::StrCat(host_names_[h], " (rank", ranks_of_host_[h].size() == 1 ? " " : "s ",
                                 absl::StrJoin(ranks_of_host_[h], ", "), ")"));
  }
  return absl::StrCat(hosts(), hosts() == 1 ? " host: " : " hosts: ", absl::StrJoin(parts, ", "));
}

namespace {

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// The network namespace's inode (0 where /proc does not say).
unsigned long NetNamespace() {
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) != 0) return 0;
  return static_cast<unsigned long>(st.st_ino);
}

unsigned long InitNetNamespace() {
  struct stat st {};
  if (stat("/proc/1/ns/net", &st) != 0) return 0;  // not readable in some containers
  return static_cast<unsigned long>(st.st_ino);
}

}  // namespace

std::string DefaultHostKey() { return absl::StrCat(BootId(), "/net:", NetNamespace()); }

std::string DefaultHostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  const unsigned long ns = NetNamespace();
  if (ns == InitNetNamespace()) return name;
  return absl::StrCat(name, "/net:", ns);
}

}  // namespace gossipcc
