#include "comm/core/options.h"

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {

std::string TopologyModeName(TopologyMode mode) {
  switch (mode) {
    case TopologyMode::kFlat:
      return "flat";
    case TopologyMode::kHierarchical:
      return "hierarchical";
    case TopologyMode::kAuto:
      return "auto";
  }
  return absl::StrCat("TopologyMode(", static_cast<int>(mode), ")");
}

void ValidateCommunicatorOptions(const CommunicatorOptions& options) {
  if (options.rendezvous_timeout.count() < 0) {
    throw InvalidArgumentError(absl::StrCat("Communicator: rendezvous_timeout must be >= 0 (0: the timeout), got ",
                                            options.rendezvous_timeout.count(), " ms"));
  }
  if (options.timeout.count() <= 0) {
    throw InvalidArgumentError(absl::StrCat("Communicator: timeout must be positive, got ", options.timeout.count(),
                                            " ms"));
  }
  if (options.p2p_segment_bytes != 0 &&
      (options.p2p_segment_bytes < kMinP2PSegmentBytes || options.p2p_segment_bytes > kMaxP2PSegmentBytes)) {
    throw InvalidArgumentError(absl::StrCat("Communicator: p2p_segment_bytes must be 0 (off) or in [",
                                            kMinP2PSegmentBytes, ", ", kMaxP2PSegmentBytes, "], got ",
                                            options.p2p_segment_bytes));
  }
  if (options.collective_lanes < 1 || options.collective_lanes > kMaxCollectiveLanes) {
    throw InvalidArgumentError(absl::StrCat("Communicator: collective_lanes must be in [1, ", kMaxCollectiveLanes,
                                            "], got ", options.collective_lanes));
  }
  if (options.streams_per_peer < 1 || options.streams_per_peer > kMaxStreamsPerPeer) {
    throw InvalidArgumentError(absl::StrCat("Communicator: streams_per_peer must be in [1, ", kMaxStreamsPerPeer,
                                            "], got ", options.streams_per_peer));
  }
  if (options.topology != TopologyMode::kFlat && options.topology != TopologyMode::kHierarchical &&
      options.topology != TopologyMode::kAuto) {
    throw InvalidArgumentError(absl::StrCat("Communicator: topology must be kFlat, kHierarchical or kAuto, got ",
                                            static_cast<int>(options.topology)));
  }
  if (options.cuda_device < -1) {
    throw InvalidArgumentError(absl::StrCat("Communicator: cuda_device must be a CUDA device ordinal, or -1 to take ",
                                            "the device of the first CUDA buffer; got ", options.cuda_device));
  }
}

}  // namespace gossipcc
