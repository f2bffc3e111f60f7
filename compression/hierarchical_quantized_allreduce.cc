#include "compression/hierarchical_quantized_allreduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "compression/quantized_check.h"

namespace gossipcc {

QuantizedAllreduceStats HierarchicalQuantizedAllreduce(HostGroups& groups, Buffer data,
                                                       const QuantizedAllreduceOptions& options,
                                                       QuantizedResidual residual, QuantizedAllreduceScratch* scratch) {
  const size_t g = static_cast<size_t>(groups.host->size());
  const size_t h = static_cast<size_t>(groups.across->size());

  // 1. The check over every rank: the host's headers, then every host's, put in parent rank order.
  std::vector<int64_t> mine = quantized_internal::CheckHeader(data, options, residual);
  const size_t fields = mine.size();
  std::vector<int64_t> host_headers(fields * g);
  groups.host->allgather(CpuBuffer(mine.data(), fields), CpuBuffer(host_headers.data(), host_headers.size()))->wait();
  std::vector<int64_t> gathered(fields * g * h);
  groups.across->allgather(CpuBuffer(host_headers.data(), host_headers.size()),
                           CpuBuffer(gathered.data(), gathered.size()))
      ->wait();
  std::vector<int64_t> table(gathered.size());
  for (size_t host = 0; host < h; ++host) {
    const std::vector<int>& ranks = groups.topology.ranks_on_host(static_cast<int>(host));
    for (size_t local = 0; local < g; ++local) {
      std::memcpy(table.data() + static_cast<size_t>(ranks[local]) * fields,
                  gathered.data() + (host * g + local) * fields, fields * sizeof(int64_t));
    }
  }
  const int me = groups.topology.ranks_on_host(groups.host_index)[static_cast<size_t>(groups.local_rank)];
  quantized_internal::JudgeHeaders(table, me, data, options);
  if (data.count == 0) return {};

  // 2. The host's value, slice by slice (whole blocks): this rank gets slice `local_rank`.
  const size_t count = data.count;
  const size_t block = options.block_size;
  const size_t slice = ((count + g - 1) / g + block - 1) / block * block;
  const size_t first = std::min(count, slice * static_cast<size_t>(groups.local_rank));
  const size_t length = std::min(count, first + slice) - first;
  QuantizedAllreduceScratch own;
  if (scratch == nullptr) scratch = &own;
  std::vector<float>& padded = scratch->host_value;
  std::vector<float>& part = scratch->host_slice;
  padded.resize(slice * g);
  part.resize(slice);
  std::memcpy(padded.data(), data.data, count * sizeof(float));
  std::fill(padded.begin() + static_cast<ptrdiff_t>(count), padded.end(), 0.0f);
  groups.host->reduce_scatter(CpuBuffer(padded.data(), padded.size()), CpuBuffer(part.data(), slice), options.op)
      ->wait();

  // 3. Quantized across hosts, among the ranks holding the same slice on every host.
  QuantizedResidual mine_residual;
  if (residual.enabled()) {
    mine_residual.sent = CpuBuffer(static_cast<float*>(residual.sent.data) + first, length);
    mine_residual.owned = CpuBuffer(static_cast<float*>(residual.owned.data) + first, length);
  }
  const QuantizedAllreduceStats stats = quantized_internal::QuantizedAllreduceChecked(
      *groups.across, CpuBuffer(part.data(), length), options, mine_residual, scratch);

  // 4. Every slice to every rank of the host.
  groups.host->allgather(CpuBuffer(part.data(), slice), CpuBuffer(padded.data(), padded.size()))->wait();
  std::memcpy(data.data, padded.data(), count * sizeof(float));
  return stats;
}

}  // namespace gossipcc
