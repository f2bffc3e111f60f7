// P2POp: one operation of a point-to-point batch (Communicator::p2p), and kAnySource. Below
// the Communicator (which re-exports it) and the transports that carry the batches
// (comm/p2p/exchange.h on Gloo, comm/nccl/nccl_transport.h on NCCL).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/core/transfer_progress.h"
#include "comm/core/types.h"

namespace gossipcc {

// A receive's peer that matches a message from any other rank (CPU buffers only).
inline constexpr int kAnySource = -1;

// One operation of a grouped point-to-point batch.
struct P2POp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind;
  Buffer buffer;
  int peer;  // for a receive in a p2p() batch on CPU buffers: kAnySource matches any sender
  uint32_t tag = 0;
  // Receives: if set, the sender's rank is written here before the Work completes.
  int* source = nullptr;
  // Sends on CPU memory only: when not empty, the message is these pieces' elements
  // concatenated (each of buffer.dtype; buffer.data unused, buffer.count their sum), and the
  // receiver sees one message of buffer.count elements. It saves the caller from packing a
  // message out of parts it already has (a header, a model's parameters, a trailer): every
  // segment of the payload that lies inside one piece is sent from that piece's memory; only
  // the few segments that straddle two pieces are copied (into a buffer the batch owns).
  std::vector<Buffer> gather;
  // CPU memory only: if set, the transport reports how much of the payload has moved while
  // the operation is in flight (comm/core/transfer_progress.h), so the caller can work on a large
  // message's first part before its last byte.
  std::shared_ptr<TransferProgress> progress;

  static P2POp Send(Buffer b, int peer, uint32_t tag = 0) { return {Kind::kSend, b, peer, tag}; }
  static P2POp Recv(Buffer b, int peer, uint32_t tag = 0, int* source = nullptr) {
    return {Kind::kRecv, b, peer, tag, source};
  }
  static P2POp SendGather(std::vector<Buffer> pieces, int peer, uint32_t tag = 0);
};

}  // namespace gossipcc
