#include "comm/core/p2p_op.h"

#include <utility>

namespace gossipcc {

P2POp P2POp::SendGather(std::vector<Buffer> pieces, int peer, uint32_t tag) {
  Buffer message{nullptr, 0, pieces.empty() ? DType::kFloat32 : pieces[0].dtype, Device::CPU()};
  for (const Buffer& piece : pieces) message.count += piece.count;
  P2POp op = Send(message, peer, tag);
  op.gather = std::move(pieces);
  return op;
}

}  // namespace gossipcc
