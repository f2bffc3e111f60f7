#include "comm/cuda_support.h"

#include "comm/nccl/nccl_transport.h"

namespace gossipcc {

bool BuiltWithCuda() { return NcclTransport::BuiltWithCuda(); }
int VisibleCudaDevices() { return NcclTransport::DeviceCount(); }

}  // namespace gossipcc
