// Point-to-point payloads larger than CommunicatorOptions::p2p_segment_bytes travel as
// segments: sizes around the segment size, receive from any source, mismatches, senders and
// receivers with different settings, sends gathered from pieces, and the options' validation. Data is checked element by
// element and the traffic counters byte by byte.
#include <algorithm>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"
#include "tests/comm/typed_array.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr size_t kSegment = kMinP2PSegmentBytes;  // 1 KiB: many segments from small buffers

CommunicatorOptions Segmented(size_t segment_bytes = kSegment, bool connection_per_direction = true) {
  CommunicatorOptions o;
  o.timeout = std::chrono::seconds(20);
  o.p2p_segment_bytes = segment_bytes;
  o.p2p_connection_per_direction = connection_per_direction;
  return o;
}

// A byte that depends on who sent it, to whom, with which tag and where: a segment landing
// at the wrong offset or from the wrong sender shows.
uint8_t Pattern(int from, int to, uint32_t tag, size_t i) {
  return static_cast<uint8_t>((from * 131 + to * 71 + tag * 17 + i * 7 + i / 1024) & 0xff);
}

// Byte sizes around the 1 KiB segment: none, tiny, exactly one, one byte over, many
// segments, a tail that is not a multiple, and a float32 count whose segments split elements.
const std::vector<size_t> kByteSizes = {0, 1, kSegment - 1, kSegment, kSegment + 1, 4 * kSegment,
                                        10 * kSegment + 17, 64 * kSegment + 3};

// Threads or processes; payloads on a connection per direction or on the collectives' mesh.
class P2PSegmentsTest : public ::testing::TestWithParam<std::tuple<LaunchMode, bool>> {
 protected:
  LaunchMode mode() const { return std::get<0>(GetParam()); }
  bool per_direction() const { return std::get<1>(GetParam()); }
  CommunicatorOptions Options(size_t segment_bytes = kSegment) const {
    return Segmented(segment_bytes, per_direction());
  }
};

// Every rank sends to both ring neighbours and receives from both in one batch (a gossip
// round), for every size; the counters count exactly the payload bytes.
TEST_P(P2PSegmentsTest, RingExchangeAtEverySizeAroundTheSegment) {
  RunRanks(3, mode(), [](Communicator& comm) {
    const int n = comm.size(), me = comm.rank();
    const int right = (me + 1) % n, left = (me - 1 + n) % n;
    uint64_t expected_bytes = 0;
    for (size_t bytes : kByteSizes) {
      std::vector<uint8_t> to_right(bytes), to_left(bytes), from_left(bytes, 0xee), from_right(bytes, 0xee);
      for (size_t i = 0; i < bytes; ++i) {
        to_right[i] = Pattern(me, right, 1, i);
        to_left[i] = Pattern(me, left, 2, i);
      }
      auto buf = [](std::vector<uint8_t>& v) { return Buffer{v.data(), v.size(), DType::kUInt8, Device::CPU()}; };
      std::vector<P2POp> ops = {P2POp::Recv(buf(from_left), left, 1), P2POp::Send(buf(to_right), right, 1),
                                P2POp::Send(buf(to_left), left, 2), P2POp::Recv(buf(from_right), right, 2)};
      comm.p2p(ops)->wait();
      for (size_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(from_left[i], Pattern(left, me, 1, i)) << bytes << " bytes, byte " << i;
        ASSERT_EQ(from_right[i], Pattern(right, me, 2, i)) << bytes << " bytes, byte " << i;
      }
      expected_bytes += 2 * bytes;
      const TrafficCounters t = comm.traffic();
      EXPECT_EQ(t.p2p_bytes_sent, expected_bytes);
      EXPECT_EQ(t.p2p_bytes_received, expected_bytes);
    }
    // 257 float32 = 1028 bytes: the segment boundary falls inside an element.
    TypedArray out(DType::kFloat32, 257), in(DType::kFloat32, 257);
    for (size_t i = 0; i < 257; ++i) out.set(i, me * 1000.0 + i + 0.25);
    auto s = comm.send(out.buffer(), right, 5);
    comm.recv(in.buffer(), left, 5)->wait();
    s->wait();
    for (size_t i = 0; i < 257; ++i) ASSERT_EQ(in.get(i), left * 1000.0 + i + 0.25);
  }, Options());
}

// The default (256 KiB) cuts a 4 MB + tail message into 17 segments; several messages on one
// tag from one sender arrive whole and in order.
TEST_P(P2PSegmentsTest, DefaultSegmentSizeAndBackToBackMessagesOnOneTag) {
  RunRanks(2, mode(), [](Communicator& comm) {
    const int me = comm.rank(), peer = 1 - me;
    const size_t bytes = (4u << 20) + 12345;
    std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(bytes)), in(3, std::vector<uint8_t>(bytes));
    for (uint32_t k = 0; k < 3; ++k) {
      for (size_t i = 0; i < bytes; ++i) out[k][i] = Pattern(me, peer, k, i);
    }
    auto buf = [](std::vector<uint8_t>& v) { return Buffer{v.data(), v.size(), DType::kUInt8, Device::CPU()}; };
    std::vector<std::shared_ptr<Work>> sends;
    for (uint32_t k = 0; k < 3; ++k) sends.push_back(comm.send(buf(out[k]), peer, 9));
    for (uint32_t k = 0; k < 3; ++k) comm.recv(buf(in[k]), peer, 9)->wait();  // one at a time: in order
    for (auto& s : sends) s->wait();
    for (uint32_t k = 0; k < 3; ++k) {
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(in[k][i], Pattern(peer, me, k, i)) << "message " << k << " byte " << i;
    }
    EXPECT_EQ(comm.traffic().p2p_bytes_sent, 3 * bytes);
    EXPECT_EQ(comm.traffic().p2p_bytes_received, 3 * bytes);
  }, Options(CommunicatorOptions().p2p_segment_bytes));
}

// Rank 0 receives one segmented message from each other rank without naming the sender:
// every byte of each payload comes from the sender the receive reports.
TEST_P(P2PSegmentsTest, ReceiveFromAnySourceTakesEverySegmentFromTheHeadersSender) {
  RunRanks(4, mode(), [](Communicator& comm) {
    const int n = comm.size(), me = comm.rank();
    const size_t bytes = 20 * kSegment + 5;
    if (me == 0) {
      std::vector<std::vector<uint8_t>> got(n - 1, std::vector<uint8_t>(bytes));
      std::vector<int> sources(n - 1, -7);
      std::vector<std::shared_ptr<Work>> works;
      for (int k = 0; k < n - 1; ++k) {
        works.push_back(comm.recv_any_source(Buffer{got[k].data(), bytes, DType::kUInt8, Device::CPU()}, 4, &sources[k]));
      }
      for (auto& w : works) w->wait();
      std::vector<int> seen;
      for (int k = 0; k < n - 1; ++k) {
        ASSERT_GE(sources[k], 1);
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(got[k][i], Pattern(sources[k], 0, 4, i)) << "byte " << i;
        seen.push_back(sources[k]);
      }
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(seen, (std::vector<int>{1, 2, 3}));
      EXPECT_EQ(comm.traffic().p2p_bytes_received, (n - 1) * bytes);
    } else {
      std::vector<uint8_t> out(bytes);
      for (size_t i = 0; i < bytes; ++i) out[i] = Pattern(me, 0, 4, i);
      comm.send(Buffer{out.data(), bytes, DType::kUInt8, Device::CPU()}, 0, 4)->wait();
    }
  }, Options());
}

// A segmented message longer or shorter than the receive buffer fails the receive with a
// MismatchError, leaves the buffer untouched, counts nothing, and the next message on the
// same tag still arrives intact (the stream stays in step).
TEST_P(P2PSegmentsTest, MismatchedSegmentedMessageFailsAndLeavesTheStreamInStep) {
  RunRanks(2, mode(), [](Communicator& comm) {
    const size_t count = 3000;  // 12000 bytes of float32: 12 segments
    std::vector<float> big(count + 500, 7.0f), exact(count);
    for (size_t i = 0; i < count; ++i) exact[i] = static_cast<float>(i);
    if (comm.rank() == 0) {
      comm.send(CpuBuffer(big.data(), count + 500), 1, 3)->wait();
      comm.send(CpuBuffer(big.data(), count - 1000), 1, 3)->wait();
      comm.send(CpuBuffer(exact.data(), count), 1, 3)->wait();
    } else {
      std::vector<float> mine(count, -1.0f);
      for (const char* sent : {"rank 0 sent 3500 x float32", "rank 0 sent 2000 x float32"}) {
        try {
          comm.recv(CpuBuffer(mine.data(), count), 0, 3)->wait();
          ADD_FAILURE() << "expected a MismatchError";
        } catch (const MismatchError& e) {
          EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("expected 3000 x float32"), HasSubstr(sent)));
        }
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(mine[i], -1.0f) << "buffer must be untouched";
      }
      EXPECT_EQ(comm.traffic().p2p_bytes_received, 0u);
      comm.recv(CpuBuffer(mine.data(), count), 0, 3)->wait();
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(mine[i], static_cast<float>(i));
      EXPECT_EQ(comm.traffic().p2p_bytes_received, count * sizeof(float));
    }
    comm.barrier()->wait();
  }, Options());
}

// P2POp::progress: a watcher thread samples both sides of a segmented exchange (plain and
// gathered sends, several sizes) while it is in flight. Every sample is a prefix that ends on
// a segment boundary (or the payload's end), samples only grow, and the receiver's prefix
// holds the sender's bytes when sampled. At the end both ended at the whole payload. A
// mismatched receive ends at 0.
TEST_P(P2PSegmentsTest, ProgressReportsSegmentPrefixesAndEndsAtTheWholePayload) {
  RunRanks(2, mode(), [](Communicator& comm) {
    const int me = comm.rank(), peer = 1 - me;
    for (size_t bytes : {size_t{0}, kSegment - 1, 10 * kSegment + 17, 512 * kSegment + 5}) {
      for (bool gathered : {false, true}) {
        std::vector<uint8_t> out(bytes), in(bytes, 0);
        for (size_t i = 0; i < bytes; ++i) out[i] = Pattern(me, peer, 5, i);
        P2POp send = P2POp::Send(CpuBuffer(out.data(), bytes), peer, 5);
        if (gathered && bytes > 2) {
          // Three pieces: segments straddle the boundaries (and are sent from a copy).
          const size_t a = bytes / 3, b = bytes / 3 + 1;
          send = P2POp::SendGather({CpuBuffer(out.data(), a), CpuBuffer(out.data() + a, b),
                                    CpuBuffer(out.data() + a + b, bytes - a - b)},
                                   peer, 5);
        }
        P2POp recv = P2POp::Recv(CpuBuffer(in.data(), bytes), peer, 5);
        send.progress = std::make_shared<TransferProgress>();
        recv.progress = std::make_shared<TransferProgress>();
        std::vector<size_t> seen_sent, seen_received;
        std::vector<std::string> problems;
        std::thread watcher([&] {
          size_t checked = 0;
          for (;;) {
            const bool done = send.progress->ended() && recv.progress->ended();
            const size_t s = send.progress->bytes(), r = recv.progress->bytes();
            if (seen_sent.empty() || s != seen_sent.back()) seen_sent.push_back(s);
            if (seen_received.empty() || r != seen_received.back()) seen_received.push_back(r);
            for (; checked < r; ++checked) {
              if (in[checked] != Pattern(peer, me, 5, checked)) {
                problems.push_back(absl::StrCat("byte ", checked, " of a landed prefix of ", r, " is wrong"));
                break;
              }
            }
            if (done) break;
            std::this_thread::yield();
          }
        });
        const P2POp ops[] = {send, recv};
        comm.p2p(ops)->wait();
        watcher.join();
        const std::string where = absl::StrCat(bytes, " bytes", gathered ? " gathered" : "");
        EXPECT_THAT(problems, ::testing::IsEmpty()) << where;
        for (const auto* seen : {&seen_sent, &seen_received}) {
          EXPECT_TRUE(std::is_sorted(seen->begin(), seen->end())) << where;
          for (size_t v : *seen) EXPECT_TRUE(v % kSegment == 0 || v == bytes) << where << ": prefix " << v;
        }
        EXPECT_EQ(send.progress->bytes(), bytes) << where;
        EXPECT_EQ(recv.progress->bytes(), bytes) << where;
        EXPECT_TRUE(send.progress->ended() && recv.progress->ended()) << where;
        EXPECT_EQ(recv.progress->WaitFor(bytes + 1), bytes) << where << ": an ended transfer does not block";
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(in[i], Pattern(peer, me, 5, i)) << where << " byte " << i;
      }
    }
    // A mismatched receive: its progress ends at 0 and the buffer is untouched.
    std::vector<float> mine(4 * kSegment, -1.0f), theirs(4 * kSegment + 1, 2.0f);
    if (me == 0) {
      comm.send(CpuBuffer(theirs.data(), theirs.size()), 1, 6)->wait();
    } else {
      P2POp recv = P2POp::Recv(CpuBuffer(mine.data(), mine.size()), 0, 6);
      recv.progress = std::make_shared<TransferProgress>();
      EXPECT_THROW(comm.p2p(absl::MakeConstSpan(&recv, 1))->wait(), MismatchError);
      EXPECT_TRUE(recv.progress->ended());
      EXPECT_EQ(recv.progress->bytes(), 0u);
      for (float v : mine) ASSERT_EQ(v, -1.0f);
    }
    comm.barrier()->wait();
  }, Options());
}

// Receives outstanding at once on the same peer and tag get whole messages in posting order:
// their segments never interleave.
TEST_P(P2PSegmentsTest, ConcurrentReceivesOnOnePeerAndTagGetWholeMessagesInOrder) {
  RunRanks(2, mode(), [](Communicator& comm) {
    const size_t bytes = 30 * kSegment + 9;
    std::vector<std::vector<uint8_t>> msgs(2, std::vector<uint8_t>(bytes));
    for (uint32_t k = 0; k < 2; ++k) {
      for (size_t i = 0; i < bytes; ++i) msgs[k][i] = Pattern(0, 1, 10 + k, i);
    }
    auto buf = [](std::vector<uint8_t>& v) { return Buffer{v.data(), v.size(), DType::kUInt8, Device::CPU()}; };
    for (int round = 0; round < 5; ++round) {
      if (comm.rank() == 0) {
        auto a = comm.send(buf(msgs[0]), 1, 6);
        auto b = comm.send(buf(msgs[1]), 1, 6);
        a->wait();
        b->wait();
      } else {
        std::vector<std::vector<uint8_t>> got(2, std::vector<uint8_t>(bytes));
        auto a = comm.recv(buf(got[0]), 0, 6);
        auto b = comm.recv(buf(got[1]), 0, 6);
        a->wait();
        b->wait();
        EXPECT_TRUE(got[0] == msgs[0]) << "round " << round;
        EXPECT_TRUE(got[1] == msgs[1]) << "round " << round;
      }
    }
    comm.barrier()->wait();
  }, Options());
}

// The receiver follows the sender's segmentation (carried in the header), so ranks with
// different settings, segmentation off included, exchange correctly.
TEST_P(P2PSegmentsTest, RanksWithDifferentSegmentSizesInteroperate) {
  RunRanksWithStore(3, mode(), [per_direction = per_direction()](int rank, std::shared_ptr<Store> store) {
    const size_t settings[] = {0, kSegment, 3 * kSegment + 1};
    auto comm = Communicator::Create(store, rank, 3, Segmented(settings[rank], per_direction));
    const int n = 3, right = (rank + 1) % n, left = (rank + n - 1) % n;
    const size_t bytes = 9 * kSegment + 100;
    std::vector<uint8_t> out(bytes), in(bytes);
    for (size_t i = 0; i < bytes; ++i) out[i] = Pattern(rank, right, 0, i);
    std::vector<P2POp> ops = {P2POp::Send(Buffer{out.data(), bytes, DType::kUInt8, Device::CPU()}, right),
                              P2POp::Recv(Buffer{in.data(), bytes, DType::kUInt8, Device::CPU()}, left)};
    comm->p2p(ops)->wait();
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(in[i], Pattern(left, rank, 0, i)) << "byte " << i;
    comm->barrier()->wait();
  });
}

// A send gathered from pieces (P2POp::gather) arrives as one message, whichever segments
// lie inside a piece (sent from its memory) or straddle pieces (copied), segmented or not:
// a header and a trailer around payloads of sizes around the segment, empty pieces, pieces
// far smaller than a segment (every segment straddles) and a single piece.
TEST_P(P2PSegmentsTest, GatheredSendArrivesAsOneMessage) {
  constexpr size_t kFloatsPerSegment = kSegment / sizeof(float);
  std::vector<std::vector<size_t>> layouts;  // piece lengths in floats
  for (size_t payload : {size_t{0}, size_t{1}, kFloatsPerSegment - 1, kFloatsPerSegment, kFloatsPerSegment + 1,
                         10 * kFloatsPerSegment + 5}) {
    layouts.push_back({4, payload, 2});
  }
  layouts.push_back({0, 3, 0, 0, kFloatsPerSegment * 3, 0, 1, 0});
  layouts.push_back(std::vector<size_t>(40, 7));
  layouts.push_back({5 * kFloatsPerSegment + 3});
  for (size_t segment : {kSegment, size_t{0}}) {
    RunRanks(3, mode(), [&layouts](Communicator& comm) {
      const int n = comm.size(), me = comm.rank();
      const int right = (me + 1) % n, left = (me - 1 + n) % n;
      auto value = [](int from, size_t i) { return static_cast<float>(from * 100000 + i); };
      const uint64_t sent_before = comm.traffic().p2p_bytes_sent;
      uint64_t expected_bytes = 0;
      for (const std::vector<size_t>& layout : layouts) {
        size_t total = 0;
        for (size_t len : layout) total += len;
        std::vector<std::vector<float>> pieces;
        std::vector<Buffer> views;
        size_t at = 0;
        for (size_t len : layout) {
          pieces.emplace_back(len);
          for (size_t i = 0; i < len; ++i) pieces.back()[i] = value(me, at + i);
          at += len;
        }
        for (auto& piece : pieces) views.push_back(CpuBuffer(piece.data(), piece.size()));
        std::vector<float> in(total, -1.0f);
        std::vector<P2POp> ops = {P2POp::SendGather(views, right, 3), P2POp::Recv(CpuBuffer(in.data(), total), left, 3)};
        comm.p2p(ops)->wait();
        const std::string where = absl::StrCat(layout.size(), " pieces, ", total, " floats");
        for (size_t i = 0; i < total; ++i) ASSERT_EQ(in[i], value(left, i)) << where << ", element " << i;
        at = 0;
        for (const auto& piece : pieces) {
          for (float v : piece) ASSERT_EQ(v, value(me, at++)) << where << ": the sender's pieces changed";
        }
        expected_bytes += total * sizeof(float);
      }
      EXPECT_EQ(comm.traffic().p2p_bytes_sent - sent_before, expected_bytes);
    }, Options(segment));
  }
}

// A gathered send's pieces must be CPU memory of the message's dtype adding up to its count,
// and only a send gathers: otherwise the post fails at once, naming the piece and the problem.
TEST(P2PGatherTest, BadPiecesAreRejectedAtThePost) {
  RunRanks(2, LaunchMode::kThreads, [](Communicator& comm) {
    const int peer = 1 - comm.rank();
    std::vector<float> a(8), b(8);
    std::vector<double> d(8);
    auto expect_rejected = [&](P2POp op, const std::string& what) {
      try {
        comm.p2p({op})->wait();
        ADD_FAILURE() << "accepted: " << what;
      } catch (const InvalidArgumentError& e) {
        EXPECT_THAT(std::string(e.what()), HasSubstr(what));
      }
    };
    expect_rejected(P2POp::SendGather({CpuBuffer(a.data(), 8), CpuBuffer(d.data(), 8)}, peer),
                    "gather piece 1 is float64 but the message is float32");
    P2POp short_count = P2POp::SendGather({CpuBuffer(a.data(), 8), CpuBuffer(b.data(), 8)}, peer);
    short_count.buffer.count = 15;
    expect_rejected(short_count, "the gather pieces hold 16 elements but the message is 15 x float32 on cpu");
    expect_rejected(P2POp::SendGather({CpuBuffer(a.data(), 8), Buffer{nullptr, 4, DType::kFloat32, Device::CPU()}}, peer),
                    "gather piece 1 is null but has 4 elements");
    expect_rejected(P2POp::SendGather({Buffer{a.data(), 8, DType::kFloat32, Device::CUDA(0)}}, peer),
                    "gather piece 0 is on cuda:0");
    P2POp recv = P2POp::Recv(CpuBuffer(a.data(), 8), peer);
    recv.gather = {CpuBuffer(b.data(), 8)};
    expect_rejected(recv, "only a send can gather its message from pieces");
    // Nothing was posted: the pair still exchanges normally.
    std::fill(a.begin(), a.end(), 1.0f);
    std::fill(b.begin(), b.end(), 2.0f);
    std::vector<float> in(8, 0.0f);
    std::vector<P2POp> ops = {P2POp::SendGather({CpuBuffer(a.data(), 3), CpuBuffer(b.data(), 5)}, peer),
                              P2POp::Recv(CpuBuffer(in.data(), 8), peer)};
    comm.p2p(ops)->wait();
    EXPECT_EQ(in, (std::vector<float>{1, 1, 1, 2, 2, 2, 2, 2}));
  });
}

TEST(P2PSegmentOptionTest, OutOfRangeSegmentSizesAreRejected) {
  RunRanksWithStore(1, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    for (size_t bad : {size_t{1}, kMinP2PSegmentBytes - 1, kMaxP2PSegmentBytes + 1}) {
      try {
        Communicator::Create(store, rank, 1, Segmented(bad));
        ADD_FAILURE() << "accepted p2p_segment_bytes = " << bad;
      } catch (const InvalidArgumentError& e) {
        EXPECT_THAT(std::string(e.what()),
                    AllOf(HasSubstr("p2p_segment_bytes must be 0 (off) or in [1024, 1073741824]"),
                          HasSubstr(absl::StrCat("got ", bad))));
      }
    }
  });
}

// Ranks that disagree on p2p_connection_per_direction would connect different meshes: every
// rank fails at creation, naming the setting and the ranks that differ, within the timeout.
TEST(P2PConnectionOptionTest, RanksThatDisagreeFailAtCreation) {
  ExpectCreateFailsOnEveryRank(
      3, [](int rank) { return Segmented(kSegment, /*connection_per_direction=*/rank != 2); },
      "p2p_connection_per_direction",
      [](int rank) { return rank == 2 ? "false here but true on rank(s) 0, 1" : "true here but false on rank(s) 2"; });
}

INSTANTIATE_TEST_SUITE_P(Modes, P2PSegmentsTest,
                         ::testing::Combine(::testing::ValuesIn(LaunchModes()),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return LaunchModeName(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_ConnectionPerDirection" : "_SharedConnection");
                         });

}  // namespace
}  // namespace testing
}  // namespace gossipcc
