// ChooseListenAddress (comm/core/listen_address.h): the address a rank listens on, chosen as
// ProcessGroupGloo chooses it, and a clear error for an interface or host that is not this
// host's.
#include "comm/core/listen_address.h"

#include <string>

#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string ErrorOf(const std::string& interface, const std::string& hostname) {
  try {
    ChooseListenAddress(interface, hostname);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for interface '" << interface << "', host '" << hostname << "'";
  return "";
}

TEST(ListenAddressTest, AnInterfaceThatExistsIsUsed) {
  const ListenAddress a = ChooseListenAddress("lo", "");
  EXPECT_EQ(a.interface, "lo");
  EXPECT_TRUE(a.loopback);
  EXPECT_THAT(a.description, HasSubstr("127.0.0.1"));
}

TEST(ListenAddressTest, AMissingInterfaceIsNamedWithThisHostsInterfaces) {
  EXPECT_THAT(ErrorOf("nosuchif0", ""),
              AllOf(HasSubstr("network interface 'nosuchif0' does not exist"), HasSubstr("lo (127.0.0.1")));
}

TEST(ListenAddressTest, AHostnameMustResolveToAnAddressOfThisHost) {
  const ListenAddress a = ChooseListenAddress("", "127.0.0.1");
  EXPECT_EQ(a.hostname, "127.0.0.1");
  EXPECT_TRUE(a.loopback);
  // 192.0.2.123 (TEST-NET-1) is nobody's address here.
  EXPECT_THAT(ErrorOf("", "192.0.2.123"),
              AllOf(HasSubstr("resolves to 192.0.2.123"), HasSubstr("none of which is an address of this host"),
                    HasSubstr("lo (")));
  EXPECT_THAT(ErrorOf("", "no-such-host.invalid"), HasSubstr("cannot resolve the listening host 'no-such-host.invalid'"));
}

TEST(ListenAddressTest, NeitherGivenPicksThisHostsNameOrTheLoopback) {
  const ListenAddress a = ChooseListenAddress("", "");
  EXPECT_TRUE(a.interface.empty());
  EXPECT_FALSE(a.hostname.empty());
  // Whichever it picked, it can listen there.
  EXPECT_NO_THROW(ChooseListenAddress("", a.hostname));
}

TEST(ListenAddressTest, LoopbackAddressesInGloosMessagesAreRecognised) {
  EXPECT_TRUE(MentionsLoopbackAddress("connect [127.0.0.1]:17284: Connection refused"));
  EXPECT_TRUE(MentionsLoopbackAddress("Connect timeout [::1]:4000"));
  EXPECT_FALSE(MentionsLoopbackAddress("connect [10.0.0.2]:17284: Connection refused"));
}

}  // namespace
}  // namespace gossipcc
