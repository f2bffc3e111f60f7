#include "torch_backend/communicator_environment.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/cuda_support.h"
#include "comm/core/errors.h"
#include "comm/core/listen_address.h"
#include "compression/power_sgd_math.h"

namespace gossipcc {
namespace torch_backend {
namespace {

using Clock = std::chrono::steady_clock;

// The variable's value; nullptr when it is unset or empty (both leave the setting alone).
const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

[[noreturn]] void Invalid(const char* name, const std::string& text, const std::string& why) {
  throw InvalidArgumentError(absl::StrCat(name, "='", text, "': ", why));
}

// The range checks are the Communicator's own (ValidateCommunicatorOptions) on options that
// differ from the defaults in the one field `set` writes; its message names the field, this one
// the variable.
template <typename Set>
void CheckRange(const char* name, const std::string& text, Set set) {
  CommunicatorOptions probe;
  set(probe);
  try {
    ValidateCommunicatorOptions(probe);
  } catch (const InvalidArgumentError& e) {
    std::string why = e.what();
    if (absl::StartsWith(why, "Communicator: ")) why = why.substr(14);
    Invalid(name, text, absl::StrCat("out of range: ", why));
  }
}

template <typename T>
T ParseNumber(const char* name, const std::string& text, const char* what) {
  T parsed;
  if (!absl::SimpleAtoi(text, &parsed)) {
    throw InvalidArgumentError(absl::StrCat(name, " must be ", what, ", got '", text, "'"));
  }
  return parsed;
}

bool ParseFlag(const char* name, const std::string& text) {
  if (text != "0" && text != "1") throw InvalidArgumentError(absl::StrCat(name, " must be 0 or 1, got '", text, "'"));
  return text == "1";
}

// GOSSIPCC_SOCKET_IFNAME / GLOO_SOCKET_IFNAME take gloo's comma-separated list; gossipcc listens
// on the first interface (ProcessGroupGloo makes a device per interface and spreads its pairs
// over them; gossipcc's lanes and meshes share one listening device), which must exist.
std::string FirstInterface(const char* name, const std::string& list) {
  const std::string first = list.substr(0, list.find(','));
  if (first.empty()) Invalid(name, list, "names no interface first");
  try {
    ChooseListenAddress(first, "");
  } catch (const InvalidArgumentError& e) {
    Invalid(name, list, e.what());
  }
  return first;
}

void CheckCudaDevice(const char* name, const std::string& text, int device) {
  if (device < 0) return;  // -1: the device of the first CUDA tensor
  if (!BuiltWithCuda()) {
    Invalid(name, text, absl::StrCat("cuda:", device, " cannot be used: this gossipcc was built without CUDA (no ",
                                     "CUDA toolkit with NCCL at build time), so it moves CPU tensors only; unset ",
                                     name));
  }
  const int visible = VisibleCudaDevices();
  if (device >= visible) {
    const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
    Invalid(name, text, absl::StrCat("no such CUDA device cuda:", device, ": ", visible, " visible to this process",
                                     visible > 0 ? absl::StrCat(" (cuda:0 to cuda:", visible - 1, ")") : std::string(),
                                     mask != nullptr ? absl::StrCat("; CUDA_VISIBLE_DEVICES='", mask, "'")
                                     : visible == 0  ? std::string(" (no GPU, or no driver)")
                                                     : std::string()));
  }
}

std::string Flag(bool value) { return value ? "1" : "0"; }

// How each variable reaches the options (`apply` validates the value first and throws naming
// the variable), and, for a setting every rank must share, its normal form in the options.
struct Variable {
  EnvironmentVariable doc;
  void (*apply)(CommunicatorOptions& options, const std::string& text);  // nullptr: read elsewhere
  std::string (*shared)(const CommunicatorOptions& options);             // nullptr: ranks may differ
};

const std::vector<Variable>& Variables() {
  static const std::vector<Variable> variables = {
      {{"GOSSIPCC_SOCKET_IFNAME", "unset", false},
       [](CommunicatorOptions& o, const std::string& t) { o.interface = FirstInterface("GOSSIPCC_SOCKET_IFNAME", t); },
       nullptr},
      // Used when GOSSIPCC_SOCKET_IFNAME is unset, as gloo uses it (see UsedInstead).
      {{"GLOO_SOCKET_IFNAME", "unset", false},
       [](CommunicatorOptions& o, const std::string& t) { o.interface = FirstInterface("GLOO_SOCKET_IFNAME", t); },
       nullptr},
      {{"GOSSIPCC_HOSTNAME", "unset", false},
       [](CommunicatorOptions& o, const std::string& t) {
         try {
           ChooseListenAddress("", t);
         } catch (const InvalidArgumentError& e) {
           Invalid("GOSSIPCC_HOSTNAME", t, e.what());
         }
         o.hostname = t;
       },
       nullptr},
      // Read by the Python package (gossipcc.configure takes precedence); shared: see SharedSettings.
      {{"GOSSIPCC_ALLREDUCE", "exact", true}, nullptr, nullptr},
      {{"GOSSIPCC_COLLECTIVE_LANES", "2", true},
       [](CommunicatorOptions& o, const std::string& t) {
         const int lanes = ParseNumber<int>("GOSSIPCC_COLLECTIVE_LANES", t, "a lane count");
         CheckRange("GOSSIPCC_COLLECTIVE_LANES", t, [&](CommunicatorOptions& p) { p.collective_lanes = lanes; });
         o.collective_lanes = lanes;
       },
       [](const CommunicatorOptions& o) { return absl::StrCat(o.collective_lanes); }},
      // Each rank connects this many meshes per lane and payload direction (comm/gloo/striping.h).
      {{"GOSSIPCC_STREAMS_PER_PEER", "1", true},
       [](CommunicatorOptions& o, const std::string& t) {
         const int streams = ParseNumber<int>("GOSSIPCC_STREAMS_PER_PEER", t, "a stream count");
         CheckRange("GOSSIPCC_STREAMS_PER_PEER", t, [&](CommunicatorOptions& p) { p.streams_per_peer = streams; });
         o.streams_per_peer = streams;
       },
       [](const CommunicatorOptions& o) { return absl::StrCat(o.streams_per_peer); }},
      // Which ranks share a host is learned at creation (comm/core/topology.h); this says whether
      // large all-reduces use it (comm/gloo/hierarchical_allreduce.h).
      {{"GOSSIPCC_TOPOLOGY", "auto", true},
       [](CommunicatorOptions& o, const std::string& t) {
         const std::string word = absl::AsciiStrToLower(t);
         if (word == "flat") {
           o.topology = TopologyMode::kFlat;
         } else if (word == "hierarchical") {
           o.topology = TopologyMode::kHierarchical;
         } else if (word == "auto") {
           o.topology = TopologyMode::kAuto;
         } else {
           Invalid("GOSSIPCC_TOPOLOGY", t, "expected flat, hierarchical or auto");
         }
       },
       [](const CommunicatorOptions& o) { return TopologyModeName(o.topology); }},
      // Off on one rank only, that rank would skip the signature exchange its peers wait for.
      {{"GOSSIPCC_VERIFY_COLLECTIVES", "1", true},
       [](CommunicatorOptions& o, const std::string& t) {
         o.verify_collectives = ParseFlag("GOSSIPCC_VERIFY_COLLECTIVES", t);
       },
       [](const CommunicatorOptions& o) { return Flag(o.verify_collectives); }},
      {{"GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE", "0", true},
       [](CommunicatorOptions& o, const std::string& t) {
         o.lossless_float32_allreduce = ParseFlag("GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE", t);
       },
       [](const CommunicatorOptions& o) { return Flag(o.lossless_float32_allreduce); }},
      {{"GOSSIPCC_P2P_SEGMENT_BYTES", "262144", false},
       [](CommunicatorOptions& o, const std::string& t) {
         const uint64_t bytes = ParseNumber<uint64_t>("GOSSIPCC_P2P_SEGMENT_BYTES", t, "a byte count");
         CheckRange("GOSSIPCC_P2P_SEGMENT_BYTES", t,
                    [&](CommunicatorOptions& p) { p.p2p_segment_bytes = static_cast<size_t>(bytes); });
         o.p2p_segment_bytes = static_cast<size_t>(bytes);
       },
       nullptr},
      {{"GOSSIPCC_P2P_CONNECTION_PER_DIRECTION", "1", true},
       [](CommunicatorOptions& o, const std::string& t) {
         o.p2p_connection_per_direction = ParseFlag("GOSSIPCC_P2P_CONNECTION_PER_DIRECTION", t);
       },
       [](const CommunicatorOptions& o) { return Flag(o.p2p_connection_per_direction); }},
      // Any integer: 0 is the default, negative turns the peer check off.
      {{"GOSSIPCC_HEARTBEAT_INTERVAL_MS", "timeout / 10, in [50, 1000]", false},
       [](CommunicatorOptions& o, const std::string& t) {
         o.heartbeat_interval = std::chrono::milliseconds(
             ParseNumber<int64_t>("GOSSIPCC_HEARTBEAT_INTERVAL_MS", t, "a whole number of milliseconds"));
       },
       nullptr},
      // The CUDA device whose NCCL communicator is created at init (needed before any CUDA
      // point-to-point; collectives create it lazily otherwise).
      {{"GOSSIPCC_CUDA_DEVICE", "unset", false},
       [](CommunicatorOptions& o, const std::string& t) {
         const int device = ParseNumber<int>("GOSSIPCC_CUDA_DEVICE", t, "a CUDA device ordinal");
         CheckRange("GOSSIPCC_CUDA_DEVICE", t, [&](CommunicatorOptions& p) { p.cuda_device = device; });
         CheckCudaDevice("GOSSIPCC_CUDA_DEVICE", t, device);
         o.cuda_device = device;
       },
       nullptr},
      // Read by PowerSGD's CPU math when it is first used (compression/power_sgd_math.h).
      {{"GOSSIPCC_POWERSGD_CPU_KERNELS", "unset", false}, nullptr, nullptr},
  };
  return variables;
}

// The variable that makes `name` unused, if one is set (the listening address's precedence:
// GOSSIPCC_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, GOSSIPCC_HOSTNAME).
const char* UsedInstead(const std::string& name) {
  if (name == "GLOO_SOCKET_IFNAME" && Env("GOSSIPCC_SOCKET_IFNAME")) return "GOSSIPCC_SOCKET_IFNAME";
  if (name == "GOSSIPCC_HOSTNAME") {
    if (Env("GOSSIPCC_SOCKET_IFNAME")) return "GOSSIPCC_SOCKET_IFNAME";
    if (Env("GLOO_SOCKET_IFNAME")) return "GLOO_SOCKET_IFNAME";
  }
  return nullptr;
}

// ---- the settings record each rank publishes: length-prefixed fields ----

void PutField(std::string& out, const std::string& field) { absl::StrAppend(&out, field.size(), ":", field); }

bool GetField(const std::string& in, size_t& pos, std::string& field) {
  const size_t colon = in.find(':', pos);
  if (colon == std::string::npos) return false;
  size_t length = 0;
  if (!absl::SimpleAtoi(in.substr(pos, colon - pos), &length) || length > in.size() - colon - 1) return false;
  field = in.substr(colon + 1, length);
  pos = colon + 1 + length;
  return true;
}

constexpr char kRecordVersion[] = "gossipcc-settings-1";

std::string EncodeSettings(const std::vector<SharedSetting>& settings, const std::string& error) {
  std::string out;
  PutField(out, kRecordVersion);
  PutField(out, error.empty() ? "settings" : "error");
  if (!error.empty()) {
    PutField(out, error);
    return out;
  }
  for (const SharedSetting& s : settings) {
    PutField(out, s.id);
    PutField(out, s.name);
    PutField(out, s.value);
    PutField(out, s.set ? "1" : "0");
  }
  return out;
}

// One rank's record: its settings, or the error its settings gave it.
struct Record {
  std::vector<SharedSetting> settings;
  std::string error;
};

Record DecodeSettings(const std::string& in) {
  Record r;
  size_t pos = 0;
  std::string version, kind;
  if (!GetField(in, pos, version) || version != kRecordVersion || !GetField(in, pos, kind)) {
    r.error = "its settings record is not one this gossipcc reads (is every rank running the same gossipcc?)";
    return r;
  }
  if (kind == "error") {
    if (!GetField(in, pos, r.error)) r.error = "(its error message did not arrive whole)";
    return r;
  }
  while (pos < in.size()) {
    SharedSetting s;
    std::string set;
    if (!GetField(in, pos, s.id) || !GetField(in, pos, s.name) || !GetField(in, pos, s.value) ||
        !GetField(in, pos, set)) {
      r.error = "its settings record did not arrive whole";
      return r;
    }
    s.set = set == "1";
    r.settings.push_back(std::move(s));
  }
  return r;
}

// "0, 1, 2" (at most 8 ranks named, then how many more).
std::string RankList(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  if (ranks.size() <= kShown) return absl::StrJoin(ranks, ", ");
  return absl::StrCat(absl::StrJoin(ranks.begin(), ranks.begin() + kShown, ", "), " and ", ranks.size() - kShown,
                      " more");
}

std::string RanksWord(size_t n) { return n == 1 ? "rank " : "ranks "; }

// "GOSSIPCC_COLLECTIVE_LANES differs across ranks: rank 0: '1', rank 1: '2' (unset)", or empty
// when every rank has `mine`'s value. `by_rank[r]` is null for a rank that does not know it.
std::string Difference(const SharedSetting& mine, const std::vector<const SharedSetting*>& by_rank) {
  std::vector<std::string> names;
  bool differs = false;
  for (const SharedSetting* s : by_rank) {
    if (s == nullptr || s->value != mine.value) differs = true;
    if (s != nullptr && std::find(names.begin(), names.end(), s->name) == names.end()) names.push_back(s->name);
  }
  if (!differs) return "";
  const bool one_name = names.size() == 1;
  // Ranks grouped by what they have, in the order of their lowest rank.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const SharedSetting* s = by_rank[r];
    std::string shown;
    if (s == nullptr) {
      shown = "(a gossipcc that does not know this setting)";
    } else {
      shown = absl::StrCat("'", s->value, "'");
      if (!s->set) {
        absl::StrAppend(&shown, " (", one_name ? "" : absl::StrCat(s->name, " "), "unset)");
      } else if (!one_name) {
        absl::StrAppend(&shown, " (", s->name, ")");
      }
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == shown; });
    if (it == groups.end()) {
      groups.push_back({shown, {static_cast<int>(r)}});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  std::vector<std::string> parts;
  for (const auto& [shown, ranks] : groups) parts.push_back(absl::StrCat(RanksWord(ranks.size()), RankList(ranks), ": ", shown));
  return absl::StrCat(absl::StrJoin(names, " / "), " differs across ranks: ",
                      absl::StrJoin(parts, ", "));
}

}  // namespace

const std::vector<EnvironmentVariable>& EnvironmentVariables() {
  static const std::vector<EnvironmentVariable> docs = [] {
    std::vector<EnvironmentVariable> out;
    for (const Variable& v : Variables()) out.push_back(v.doc);
    return out;
  }();
  return docs;
}

CommunicatorOptions CommunicatorOptionsFromEnvironment(CommunicatorOptions c, std::chrono::milliseconds timeout) {
  c.timeout = timeout;
  std::vector<std::string> errors;
  // A variable made unused by another (UsedInstead: at most one of the listening-address
  // variables is read) is skipped, so the order of application does not matter.
  for (const Variable& v : Variables()) {
    const char* text = Env(v.doc.name);
    if (v.apply == nullptr || text == nullptr || UsedInstead(v.doc.name) != nullptr) continue;
    try {
      v.apply(c, text);
    } catch (const InvalidArgumentError& e) {
      errors.push_back(e.what());
    }
  }
  if (!errors.empty()) throw InvalidArgumentError(absl::StrJoin(errors, "; "));
  return c;
}

std::vector<EnvironmentFinding> CheckEnvironment() {
  std::vector<EnvironmentFinding> out;
  for (const Variable& v : Variables()) {
    const char* text = Env(v.doc.name);
    if (text == nullptr) continue;
    EnvironmentFinding f{v.doc.name, text, "", ""};
    if (const char* instead = UsedInstead(f.name)) {
      f.note = absl::StrCat("not used: ", instead, " is set");
      out.push_back(f);
      continue;
    }
    try {
      if (v.apply != nullptr) {
        CommunicatorOptions scratch;
        v.apply(scratch, text);
      } else if (f.name == "GOSSIPCC_ALLREDUCE") {
        AllreducePolicy::Parse(text);
      } else if (f.name == "GOSSIPCC_POWERSGD_CPU_KERNELS") {
        compression::internal::CpuKernelsName();  // selects as PowerSGD does: throws on a bad value
      }
    } catch (const std::exception& e) {
      f.error = e.what();
    }
    out.push_back(f);
  }
  return out;
}

std::vector<SharedSetting> SharedSettings(const CommunicatorOptions& options, const AllreducePolicy& policy,
                                          const std::string& policy_source) {
  std::vector<SharedSetting> out;
  SharedSetting p;
  p.id = "allreduce_policy";
  p.name = policy_source.empty() ? "ProcessGroupOptions::allreduce_policy" : policy_source;
  p.value = policy.Describe();
  p.set = policy_source != "GOSSIPCC_ALLREDUCE" || Env("GOSSIPCC_ALLREDUCE") != nullptr;
  out.push_back(p);
  for (const Variable& v : Variables()) {
    if (v.shared == nullptr) continue;
    out.push_back({v.doc.name, v.doc.name, v.shared(options), Env(v.doc.name) != nullptr});
  }
  return out;
}

void AgreeOnSharedSettings(Store& store, int rank, int size, const std::vector<SharedSetting>& mine,
                           const std::string& own_error, std::chrono::milliseconds timeout) {
  const auto key = [](int r) { return absl::StrCat("gossipcc_settings/", r); };
  const std::string where = absl::StrCat("rank ", rank, " of ", size, ": ");
  const std::string record = EncodeSettings(mine, own_error);
  store.set(key(rank), std::vector<char>(record.begin(), record.end()));
  if (!own_error.empty()) throw InvalidArgumentError(own_error);
  const auto deadline = Clock::now() + timeout;
  const auto left = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                    std::chrono::milliseconds(1));
  };
  std::vector<Record> records(static_cast<size_t>(size));
  records[static_cast<size_t>(rank)].settings = mine;
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    std::vector<char> bytes;
    try {
      // Once one rank is missing, the others are only probed (their records may still be
      // there), so that the error names every missing rank within the timeout.
      bytes = store.get(key(r), missing.empty() ? left() : std::chrono::milliseconds(1));
    } catch (const TimeoutError&) {
      missing.push_back(r);
      continue;
    }
    records[static_cast<size_t>(r)] = DecodeSettings(std::string(bytes.begin(), bytes.end()));
  }
  if (!missing.empty()) {
    throw TimeoutError(absl::StrCat(where, "rendezvous did not complete within ", timeout.count(), " ms: ",
                                    RanksWord(missing.size()), RankList(missing), " never published ",
                                    missing.size() == 1 ? "its" : "their",
                                    " settings (did every rank start and call init_process_group?)"));
  }
  std::vector<std::string> invalid;
  for (int r = 0; r < size; ++r) {
    const Record& rec = records[static_cast<size_t>(r)];
    if (!rec.error.empty()) invalid.push_back(absl::StrCat("rank ", r, ": ", rec.error));
  }
  if (!invalid.empty()) {
    throw InvalidArgumentError(absl::StrCat(where, "the settings of another rank are invalid, so this group cannot ",
                                            "be created: ", absl::StrJoin(invalid, "; ")));
  }
  std::vector<std::string> differences;
  for (const SharedSetting& s : mine) {
    std::vector<const SharedSetting*> by_rank;
    for (const Record& rec : records) {
      auto it = std::find_if(rec.settings.begin(), rec.settings.end(), [&](const SharedSetting& t) { return t.id == s.id; });
      by_rank.push_back(it == rec.settings.end() ? nullptr : &*it);
    }
    std::string d = Difference(s, by_rank);
    if (!d.empty()) differences.push_back(std::move(d));
  }
  if (!differences.empty()) {
    throw InvalidArgumentError(absl::StrCat(where, absl::StrJoin(differences, "; "),
                                            "; every rank must use the same value (docs/pytorch.md, \"Environment "
                                            "variables\")"));
  }
}

}  // namespace torch_backend
}  // namespace gossipcc
