#include "comm/core/listen_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace {

std::string AddressText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool IsLoopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  }
  return false;
}

// Interface name -> its addresses (IPv4 and IPv6), in the order getifaddrs lists them.
std::vector<std::pair<std::string, std::vector<std::string>>> HostInterfaces() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == i->ifa_name; });
    if (it == out.end()) it = out.insert(out.end(), {i->ifa_name, {}});
    it->second.push_back(AddressText(i->ifa_addr));
  }
  freeifaddrs(list);
  return out;
}

struct Resolved {
  std::vector<std::string> addresses;  // everything the name resolved to
  bool bindable = false;               // one of them is an address of this host
  bool loopback = false;               // the first bindable one is a loopback address
  std::string bound;                   // the first bindable one
  std::string error;                   // getaddrinfo's complaint, if it failed
};

// Resolves `name` as Gloo's TCP device does (getaddrinfo, any family, stream sockets) and
// tries to bind each address in turn (port 0), as Gloo does before listening.
Resolved Resolve(const std::string& name) {
  Resolved r;
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    r.error = gai_strerror(rc);
    return r;
  }
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    r.addresses.push_back(AddressText(a->ai_addr));
    if (r.bindable) continue;
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      r.bindable = true;
      r.loopback = IsLoopback(a->ai_addr);
      r.bound = AddressText(a->ai_addr);
    }
    close(fd);
  }
  freeaddrinfo(result);
  return r;
}

std::string ThisHostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

std::string DescribeHostInterfaces() {
  std::vector<std::string> parts;
  for (const auto& [name, addresses] : HostInterfaces()) {
    parts.push_back(absl::StrCat(name, " (", absl::StrJoin(addresses, ", "), ")"));
  }
  return parts.empty() ? "none found" : absl::StrJoin(parts, ", ");
}

bool MentionsLoopbackAddress(const std::string& text) {
  return text.find("[127.") != std::string::npos || text.find("[::1]") != std::string::npos ||
         text.find(" 127.") != std::string::npos;
}

ListenAddress ChooseListenAddress(const std::string& interface, const std::string& hostname) {
  ListenAddress out;
  if (!interface.empty()) {
    for (const auto& [name, addresses] : HostInterfaces()) {
      if (name != interface) continue;
      out.interface = interface;
      out.description = absl::StrCat("interface ", interface, " (", absl::StrJoin(addresses, ", "), ")");
      out.loopback = std::all_of(addresses.begin(), addresses.end(), [](const std::string& a) {
        return a.rfind("127.", 0) == 0 || a == "::1";
      });
      return out;
    }
    throw InvalidArgumentError(absl::StrCat("network interface '", interface,
                                            "' does not exist on this host or has no address; this host's interfaces: ",
                                            DescribeHostInterfaces()));
  }
  if (!hostname.empty()) {
    const Resolved r = Resolve(hostname);
    if (!r.error.empty()) {
      throw InvalidArgumentError(absl::StrCat("cannot resolve the listening host '", hostname, "': ", r.error));
    }
    if (!r.bindable) {
      throw InvalidArgumentError(absl::StrCat("the listening host '", hostname, "' resolves to ",
                                              absl::StrJoin(r.addresses, ", "),
                                              ", none of which is an address of this host; this host's interfaces: ",
                                              DescribeHostInterfaces()));
    }
    out.hostname = hostname;
    out.loopback = r.loopback;
    out.description = absl::StrCat("host ", hostname, " (", r.bound, ")");
    return out;
  }
  // Neither: ProcessGroupGloo's rule.
  const std::string name = ThisHostName();
  if (!name.empty()) {
    const Resolved r = Resolve(name);
    if (r.bindable) {
      out.hostname = name;
      out.loopback = r.loopback;
      out.description = absl::StrCat("this host's name ", name, " (", r.bound, ")");
      return out;
    }
  }
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr,
                 "gossipcc: warning: this host's name '%s' does not resolve to an address this host can bind; "
                 "listening on the loopback address 127.0.0.1, which other hosts cannot reach. For a job on several "
                 "hosts set GOSSIPCC_SOCKET_IFNAME or GLOO_SOCKET_IFNAME to the network interface to use (this "
                 "host's interfaces: %s), or GOSSIPCC_HOSTNAME to this host's address.\n",
                 name.c_str(), DescribeHostInterfaces().c_str());
  });
  out.hostname = "127.0.0.1";
  out.loopback = true;
  out.description = "the loopback address 127.0.0.1 (this host's name does not resolve to an address it can bind)";
  return out;
}

}  // namespace gossipcc
