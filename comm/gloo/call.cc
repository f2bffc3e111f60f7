#include "comm/gloo/call.h"

namespace gossipcc {

void RunCheck(const GlooCall& call) {
  if (call.check == nullptr) return;
  call.check->Begin(DeferredSignatureCheck::kEveryPeer);
  call.check->Finish();
}

}  // namespace gossipcc
