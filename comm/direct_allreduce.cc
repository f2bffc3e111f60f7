#include "comm/direct_allreduce.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>
#include <vector>

#include "comm/gloo_util.h"
#include "comm/reduce.h"

namespace gossipcc {

void DirectAllreduce(const GlooCall& call, Buffer data, ReduceOp op) {
  gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int me = ctx.rank;
  if (n == 1 || data.count == 0) return;  // one rank: the average of one value is itself
  const size_t element = ElementSize(data.dtype);
  auto begin = [&](int r) { return data.count * static_cast<size_t>(r) / static_cast<size_t>(n); };
  auto chunk_count = [&](int r) { return begin(r + 1) - begin(r); };
  const size_t max_chunk_bytes = (data.count + n - 1) / n * element;
  auto* base = static_cast<uint8_t*>(data.data);
  uint8_t* mine = base + begin(me) * element;
  const size_t my_count = chunk_count(me);
  const size_t my_bytes = my_count * element;

  // Staging for the peers' copies of this rank's chunk; kept by the communicator across calls
  // so steady-state calls neither allocate nor fault pages in.
  CollectiveScratch& scratch = *call.scratch;
  std::vector<uint8_t>& staging = scratch.bytes;
  if (staging.size() < max_chunk_bytes * n) staging.resize(max_chunk_bytes * n);
  auto from = [&](int r) { return staging.data() + static_cast<size_t>(r) * max_chunk_bytes; };

  auto data_ub = ctx.createUnboundBuffer(base, data.bytes());
  auto staging_ub = ctx.createUnboundBuffer(staging.data(), max_chunk_bytes * n);
  const uint64_t scatter_slot = MakeSlot(kDirectAllreduceScatterSlotPrefix, call.tag);
  const uint64_t gather_slot = MakeSlot(kDirectAllreduceGatherSlotPrefix, call.tag);

  // Phase 2's receives go up first, so that each peer finds them announced when it has its
  // reduced chunk and sends at once (Gloo sends only to an announced receive). They may: a
  // peer sends chunk p only after receiving chunk p of ours in phase 1, so phase 1's send of
  // that region is over by the time anything lands in it.
  int gather_recvs = 0;
  for (int p = 0; p < n; ++p) {
    if (p != me && chunk_count(p)) {
      data_ub->recv(p, gather_slot, begin(p) * element, chunk_count(p) * element);
      ++gather_recvs;
    }
  }
  // Phase 1: chunk p of this rank's data to rank p; every peer's copy of chunk `me` in.
  // (Chunks are empty for all ranks alike when count < n, so empty messages are skipped on
  // both ends consistently.)
  int recvs = 0, sends = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (my_bytes) {
      staging_ub->recv(p, scatter_slot, static_cast<size_t>(p) * max_chunk_bytes, my_bytes);
      ++recvs;
    }
    if (chunk_count(p)) {
      data_ub->send(p, scatter_slot, begin(p) * element, chunk_count(p) * element);
      ++sends;
    }
  }
  for (int i = 0; i < recvs; ++i) staging_ub->waitRecv(call.timeout);

  // Reduce chunk `me` over ranks 0, 1, ..., n-1 (the same order on every rank's chunk), in
  // place. ReduceInRankOrder may write over sources 0 and 1 only: a later rank's own chunk
  // moves aside first.
  if (my_count) {
    if (me >= 2 && !IsHalfPrecision(data.dtype)) std::memcpy(from(me), mine, my_bytes);
    std::vector<const void*> sources(n);
    for (int r = 0; r < n; ++r) sources[r] = r == me && (me < 2 || IsHalfPrecision(data.dtype)) ? mine : from(r);
    ReduceInRankOrder(sources, Buffer{mine, my_count, data.dtype, data.device}, op, scratch.wide);
  }
  for (int i = 0; i < sends; ++i) data_ub->waitSend(call.timeout);

  // Phase 2: the reduced chunk `me` to every peer (its receives were posted up front).
  sends = 0;
  for (int p = 0; p < n; ++p) {
    if (p != me && my_bytes) {
      data_ub->send(p, gather_slot, begin(me) * element, my_bytes);
      ++sends;
    }
  }
  for (int i = 0; i < gather_recvs; ++i) data_ub->waitRecv(call.timeout);
  for (int i = 0; i < sends; ++i) data_ub->waitSend(call.timeout);
}
}  // namespace gossipcc
