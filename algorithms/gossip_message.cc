#include "algorithms/gossip_message.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "comm/errors.h"

namespace gossipcc {
namespace gossip_internal {

namespace {

constexpr size_t kHeaderBytes = 16;
constexpr size_t kWeightBytes = 8;

// A message's storage, 8-byte aligned.
struct Message {
  std::vector<double> storage;
  Buffer view;
};

size_t TotalCount(const std::vector<Buffer>& buffers) {
  size_t n = 0;
  for (const Buffer& b : buffers) n += b.count;
  return n;
}

template <typename T>
Message MakeMessage(size_t payload, bool with_weight) {
  size_t elems = kHeaderBytes / sizeof(T) + payload + (with_weight ? kWeightBytes / sizeof(T) : 0);
  Message m;
  m.storage.resize((elems * sizeof(T) + sizeof(double) - 1) / sizeof(double));
  m.view = Buffer{m.storage.data(), elems, DTypeOf<T>::value, Device::CPU()};
  return m;
}

template <typename T>
T* Payload(Message& m) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(m.storage.data()) + kHeaderBytes);
}

template <typename T>
void Pack(Message& m, const std::vector<Buffer>& buffers, int64_t step, double scale, const double* weight) {
  int64_t header[2] = {step, static_cast<int64_t>(TotalCount(buffers))};
  std::memcpy(m.storage.data(), header, kHeaderBytes);
  T* out = Payload<T>(m);
  const T s = static_cast<T>(scale);
  for (const Buffer& b : buffers) {
    const T* in = static_cast<const T*>(b.data);
    if (scale == 1.0) {
      std::memcpy(out, in, b.count * sizeof(T));
    } else {
      for (size_t e = 0; e < b.count; ++e) out[e] = s * in[e];
    }
    out += b.count;
  }
  if (weight != nullptr) {
    double w = scale * *weight;
    std::memcpy(out, &w, kWeightBytes);
  }
}

template <typename T>
void RunRoundT(Communicator& comm, const std::vector<Buffer>& buffers, const RoundSpec& spec) {
  const size_t payload = TotalCount(buffers);
  const bool with_weight = spec.weight != nullptr;

  // One send message per distinct scale (uniform mixing: one for all peers).
  std::map<double, Message> sends;
  for (double s : spec.send_scale) {
    if (sends.count(s)) continue;
    Message& m = sends[s];
    m = MakeMessage<T>(payload, with_weight);
    Pack<T>(m, buffers, spec.step, s, spec.weight);
  }
  std::vector<Message> recvs;
  recvs.reserve(spec.recv_from.size());
  for (size_t j = 0; j < spec.recv_from.size(); ++j) recvs.push_back(MakeMessage<T>(payload, with_weight));

  std::vector<P2POp> ops;
  for (size_t j = 0; j < spec.send_to.size(); ++j) {
    ops.push_back(P2POp::Send(sends.at(spec.send_scale[j]).view, spec.send_to[j], spec.tag));
  }
  for (size_t j = 0; j < spec.recv_from.size(); ++j) {
    ops.push_back(P2POp::Recv(recvs[j].view, spec.recv_from[j], spec.tag));
  }
  if (!ops.empty()) comm.p2p(ops)->wait();

  for (size_t j = 0; j < recvs.size(); ++j) {
    int64_t header[2];
    std::memcpy(header, recvs[j].storage.data(), kHeaderBytes);
    if (header[0] != spec.step) {
      throw MismatchError(absl::StrCat(spec.algorithm, ": rank ", comm.rank(), " is at step ", spec.step,
                                       " but received a message from rank ", spec.recv_from[j], " at step ",
                                       header[0], " (ranks must call with the same step number)"));
    }
    if (header[1] != static_cast<int64_t>(payload)) {
      throw MismatchError(absl::StrCat(spec.algorithm, ": rank ", comm.rank(), " has ", payload,
                                       " elements but rank ", spec.recv_from[j], " sent ", header[1]));
    }
  }

  // Mix in place.
  const T self = static_cast<T>(spec.self_coef);
  std::vector<T> coef(spec.recv_coef.begin(), spec.recv_coef.end());
  size_t offset = 0;
  for (const Buffer& b : buffers) {
    T* x = static_cast<T*>(b.data);
    for (size_t e = 0; e < b.count; ++e) {
      T acc = self * x[e];
      for (size_t j = 0; j < recvs.size(); ++j) acc += coef[j] * Payload<T>(recvs[j])[offset + e];
      x[e] = acc;
    }
    offset += b.count;
  }
  if (with_weight) {
    double w = spec.self_coef * *spec.weight;
    for (size_t j = 0; j < recvs.size(); ++j) {
      double wj;
      std::memcpy(&wj, Payload<T>(recvs[j]) + payload, kWeightBytes);
      w += spec.recv_coef[j] * wj;
    }
    *spec.weight = w;
  }
}

}  // namespace

DType CheckBuffers(const char* algorithm, const std::vector<Buffer>& buffers) {
  if (buffers.empty()) return DType::kFloat32;
  DType dtype = buffers[0].dtype;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (b.dtype != DType::kFloat32 && b.dtype != DType::kFloat64) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " is ", DTypeName(b.dtype),
                                              "; only float32 and float64 buffers are supported"));
    }
    if (b.dtype != dtype) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " is ", DTypeName(b.dtype),
                                              " but buffer 0 is ", DTypeName(dtype),
                                              "; all buffers of one call must share a dtype"));
    }
    if (b.device.is_cuda()) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " is on ", b.device.ToString(),
                                              "; only CPU buffers are supported"));
    }
    if (b.data == nullptr && b.count > 0) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " has null data"));
    }
  }
  return dtype;
}

void RunRound(Communicator& comm, const std::vector<Buffer>& buffers, const RoundSpec& spec) {
  DType dtype = CheckBuffers(spec.algorithm, buffers);
  if (dtype == DType::kFloat64) {
    RunRoundT<double>(comm, buffers, spec);
  } else {
    RunRoundT<float>(comm, buffers, spec);
  }
}

}  // namespace gossip_internal
}  // namespace gossipcc
