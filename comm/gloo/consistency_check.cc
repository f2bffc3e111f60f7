#include "comm/gloo/consistency_check.h"

#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
#include "comm/core/options.h"
#include "comm/gloo/deadline_wait.h"
#include "comm/gloo/fingerprint.h"
#include "comm/gloo/gloo_error.h"
#include "comm/gloo/pair_teardown.h"
#include "comm/gloo/slots.h"

namespace gossipcc {
namespace {

constexpr size_t kHeaderBytes = kFingerprintBytes;

// Bytes of payload every rank appends at most, summed over the peers it goes to. Direct
// exchange sends (n-1) x payload per rank where a ring all-reduce sends 2(n-1)/n x payload
// in 2(n-1) steps: below this the saved latencies are worth more than the extra bytes. Sized
// for slow links (at 100 Mbit/s a transfer of this size costs about what the saved ring steps
// do); on loopback a larger budget would still pay.
constexpr size_t kEagerFanoutBytes = size_t{128} << 10;

// The bound buffers' slots, per parity (Gloo keeps bound and unbound slots apart; no other
// bound buffer lives on a lane's signature mesh). A send buffer's destructor unregisters its
// slot too, so TakeRetiredBuffers drops the receive buffers first.
constexpr int kHeaderBufferSlot[2] = {kFingerprintSlotPrefix << 8, (kFingerprintSlotPrefix << 8) | 1};

}  // namespace

size_t EagerCollectiveMaxBytes(int size) {
  if (size <= 1) return 0;
  return (kEagerFanoutBytes / static_cast<size_t>(size - 1)) & ~size_t{63};
}

CollectiveHandshake::CollectiveHandshake(gloo::Context& mesh)
    : mesh_(mesh),
      size_(mesh.size),
      own_rank_(mesh.rank),
      stride_(kHeaderBytes + EagerCollectiveMaxBytes(size_)),
      outgoing_(std::max(kHeaderBytes * static_cast<size_t>(size_), stride_)),
      incoming_{std::vector<uint8_t>(stride_ * static_cast<size_t>(size_)),
                std::vector<uint8_t>(stride_ * static_cast<size_t>(size_))},
      verdicts_in_(kHeaderBytes * static_cast<size_t>(size_)),
      verdict_out_(kHeaderBytes) {
  if (size_ == 1) return;
  try {
    for (int i = 0; i < 2; ++i) {
      in_[i].resize(static_cast<size_t>(size_));
      out_[i].resize(static_cast<size_t>(size_));
      for (int p = 0; p < size_; ++p) {
        if (p == own_rank_) continue;
        auto& pair = mesh_.getPair(p);
        in_[i][static_cast<size_t>(p)] = pair->createRecvBuffer(
            kHeaderBufferSlot[i], incoming_[i].data() + static_cast<size_t>(p) * stride_, stride_);
        out_[i][static_cast<size_t>(p)] =
            pair->createSendBuffer(kHeaderBufferSlot[i], outgoing_.data(), outgoing_.size());
      }
    }
  } catch (const std::exception& e) {
    RethrowGlooError(absl::StrCat("rank ", own_rank_, " of ", size_, ": registering the signature buffers"), e);
  }
}

CollectiveHandshake::~CollectiveHandshake() = default;

const uint8_t* CollectiveHandshake::Header(int rank) const {
  return rank == own_rank_ ? outgoing_.data() + own_offset_
                           : incoming_[current_].data() + static_cast<size_t>(rank) * stride_;
}

const uint8_t* CollectiveHandshake::payload(int rank) const { return Header(rank) + kHeaderBytes; }

size_t CollectiveHandshake::payload_bytes(int rank) const { return Fingerprint::Read(Header(rank)).payload_bytes; }

std::vector<std::shared_ptr<void>> CollectiveHandshake::TakeRetiredBuffers() {
  TakePairsOffTheDeviceThread(mesh_);
  for (int i = 0; i < 2; ++i) {
    in_[i].clear();
    out_[i].clear();
  }
  std::vector<std::shared_ptr<void>> retired;
  for (auto* ub : {&verdicts_in_ub_, &verdict_out_ub_}) {
    if (*ub) retired.push_back(std::move(*ub));
  }
  return retired;
}

// Sends `send_bytes` at send_offset(p) of `out` to every peer p and waits for those sends
// and for n-1 receives on `in`, which the caller has posted; every wait ends by `deadline`.
template <typename SendOffset>
static void SendToAllAndWait(gloo::Context& context, gloo::transport::UnboundBuffer& in,
                             gloo::transport::UnboundBuffer& out, SendOffset send_offset, size_t send_bytes,
                             uint64_t slot, std::chrono::steady_clock::time_point deadline) {
  const int n = context.size;
  for (int p = 0; p < n; ++p) {
    if (p != context.rank) out.send(p, slot, send_offset(p), send_bytes);
  }
  for (int p = 0; p < n - 1; ++p) {
    in.waitRecv(TimeLeft(deadline));
    out.waitSend(TimeLeft(deadline));
  }
}

// Receives up to `recv_bytes` from every peer p at p * recv_bytes of `in`, sends as above.
template <typename SendOffset>
static void ExchangeWithAll(gloo::Context& context, gloo::transport::UnboundBuffer& in, size_t recv_bytes,
                            gloo::transport::UnboundBuffer& out, SendOffset send_offset, size_t send_bytes,
                            uint64_t slot, std::chrono::steady_clock::time_point deadline) {
  for (int p = 0; p < context.size; ++p) {
    if (p != context.rank) in.recv(p, slot, static_cast<size_t>(p) * recv_bytes, recv_bytes);
  }
  SendToAllAndWait(context, in, out, send_offset, send_bytes, slot, deadline);
}

// alltoallv's second round: every rank's verdict (`bytes` <= kHeaderBytes) to every peer;
// the table lands in verdicts_in_.
void CollectiveHandshake::ExchangeVerdicts(const OpSpec& spec, const void* mine, size_t bytes) {
  std::fill(verdict_out_.begin(), verdict_out_.end(), 0);
  std::memcpy(verdict_out_.data(), mine, bytes);
  std::memcpy(verdicts_in_.data() + static_cast<size_t>(mesh_.rank) * kHeaderBytes, verdict_out_.data(),
              kHeaderBytes);
  try {
    if (!verdicts_in_ub_) verdicts_in_ub_ = mesh_.createUnboundBuffer(verdicts_in_.data(), verdicts_in_.size());
    if (!verdict_out_ub_) verdict_out_ub_ = mesh_.createUnboundBuffer(verdict_out_.data(), verdict_out_.size());
    ExchangeWithAll(mesh_, *verdicts_in_ub_, kHeaderBytes, *verdict_out_ub_, [](int) { return size_t{0}; },
                    kHeaderBytes, MakeSlot(kVerdictSlotPrefix, static_cast<uint32_t>(spec.seq)), deadline_);
  } catch (const std::exception& e) {
    RethrowGlooError(absl::StrCat(spec.Describe(), " on rank ", mesh_.rank, " of ", size_, ": exchanging verdicts"),
                     e);
  }
}

namespace {
std::atomic<void (*)(int)> after_check_hook{nullptr};
}  // namespace

void SetAfterSignatureCheckHookForTesting(void (*hook)(int rank)) { after_check_hook.store(hook); }

void CollectiveHandshake::Run(const OpSpec& spec, absl::Span<const uint8_t> payload,
                              std::chrono::steady_clock::time_point deadline) {
  Begin(spec, payload, deadline);
  Finish();
}

void CollectiveHandshake::Begin(const OpSpec& spec, absl::Span<const uint8_t> payload,
                                std::chrono::steady_clock::time_point deadline, int first) {
  const int n = size_;
  const int me = own_rank_;
  if (payload.size() > EagerCollectiveMaxBytes(n)) {
    throw InvalidArgumentError(absl::StrCat(spec.Describe(), " on rank ", me, ": eager payload of ", payload.size(),
                                            " bytes exceeds the limit of ", EagerCollectiveMaxBytes(n)));
  }
  spec_ = &spec;
  deadline_ = deadline;
  // This rank's own header (and payload) stays in outgoing_, where Header(me) finds it.
  own_offset_ = spec.kind == OpKind::kAlltoallv ? static_cast<size_t>(me) * kHeaderBytes : 0;
  const size_t send_bytes = WriteFingerprints(spec, payload, n, outgoing_.data());
  arrived_.assign(static_cast<size_t>(n), false);
  arrived_[static_cast<size_t>(me)] = true;
  if (n == 1) return;
  const uint64_t index = runs_++;
  current_ = static_cast<int>(index % 2);
  send_bytes_ = send_bytes;
  if (first == kEveryPeer) {
    sent_only_to_ = kEveryPeer;
    for (int p = 0; p < n; ++p) {
      if (p != me) SendHeader(p);
    }
  } else {
    if (first < 0 || first >= n || first == me) {
      throw InvalidArgumentError(absl::StrCat(spec.Describe(), " on rank ", me, " of ", n,
                                              ": the first header's peer must be another rank, got ", first));
    }
    SendHeader(first);
    sent_only_to_ = first;
  }
}

void CollectiveHandshake::SendRemainingHeaders() {
  if (sent_only_to_ == kEveryPeer) return;
  const int first = sent_only_to_;
  sent_only_to_ = kEveryPeer;
  for (int p = 0; p < size_; ++p) {
    if (p != own_rank_ && p != first) SendHeader(p);
  }
}

void CollectiveHandshake::SendHeader(int peer) {
  // Every receive buffer has room for header + the eager maximum (stride_), whatever this
  // rank was asked to do, so no peer's message can overflow it.
  try {
    const bool per_peer = spec_->kind == OpKind::kAlltoallv;
    out_[current_][static_cast<size_t>(peer)]->send(per_peer ? static_cast<size_t>(peer) * kHeaderBytes : size_t{0},
                                                    send_bytes_);
  } catch (const std::exception& e) {
    RethrowGlooError(absl::StrCat(spec_->Describe(), " on rank ", own_rank_, " of ", size_,
                                  ": exchanging signatures (sending to rank ", peer, ")"),
                     e);
  }
}

void CollectiveHandshake::AwaitHeader(int peer) {
  if (arrived_[static_cast<size_t>(peer)]) return;
  WaitBoundBuffer(*in_[current_][static_cast<size_t>(peer)], BoundBufferWait::kRecv, deadline_,
                  absl::StrCat("no header from rank ", peer));
  arrived_[static_cast<size_t>(peer)] = true;
}

bool CollectiveHandshake::PeerAgrees(int peer) {
  try {
    AwaitHeader(peer);
  } catch (const std::exception& e) {
    RethrowGlooError(absl::StrCat(spec_->Describe(), " on rank ", own_rank_, " of ", size_,
                                  ": exchanging signatures (waiting for rank ", peer, ")"),
                     e);
  }
  return std::memcmp(Header(peer), Header(own_rank_), kHeaderBytes) == 0;
}

void CollectiveHandshake::Finish() {
  const OpSpec& spec = *spec_;
  const int n = size_;
  const int me = own_rank_;
  if (n == 1) return;
  SendRemainingHeaders();
  try {
    for (int p = 0; p < n; ++p) AwaitHeader(p);
    for (int p = 0; p < n; ++p) {
      if (p != me) {
        WaitBoundBuffer(*out_[current_][static_cast<size_t>(p)], BoundBufferWait::kSend, deadline_,
                        absl::StrCat("header not written to rank ", p));
      }
    }
  } catch (const std::exception& e) {
    RethrowGlooError(absl::StrCat(spec.Describe(), " on rank ", me, " of ", n, ": exchanging signatures"), e);
  }
  std::vector<Fingerprint> all(n);
  for (int p = 0; p < n; ++p) all[p] = Fingerprint::Read(Header(p));
  const std::string where = absl::StrCat(spec.Describe(), " on rank ", me, " of ", n);
  CompareFingerprints(spec, all, where);
  if (spec.kind == OpKind::kAlltoallv) {
    const PairVerdict mine = PairVerdict::Judge(spec, me, all);
    ExchangeVerdicts(spec, &mine, sizeof(mine));  // its waits, too, end at deadline_
    ThrowOnBadPair(verdicts_in_.data(), n, where);
  }
  if (auto* hook = after_check_hook.load(std::memory_order_relaxed)) hook(me);
}

}  // namespace gossipcc
