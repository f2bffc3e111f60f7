// libFuzzer target: the lossless float32 packing (comm/gloo/float32_packing.h), the decoder of what
// the packed ring receives from the wire. Byte 0 picks the direction:
//   even: the rest, after byte 1 (the value count the receiver expects), is a message from the
//         wire. UnpackFloat32 must return an InvalidArgument naming the packed message, or
//         values; values it returns must pack and unpack to the same bits.
//   odd:  the rest are float32 bit patterns. PackFloat32 must stay within PackedFloat32Bound,
//         and UnpackFloat32 of exactly the bytes it wrote must return exactly them.
// Reading outside the message, a crash or a sanitizer report is a finding. Run by
// tools/fuzz.sh; the corpus in corpus/float32_packing/ is replayed by
// //tests/fuzz:float32_packing_fuzz_replay.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/gloo/float32_packing.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void ExpectRoundTrip(const std::string& input, const std::vector<uint32_t>& values) {
  std::vector<uint8_t> packed(gossipcc::PackedFloat32Bound(values.size()));
  const size_t length = gossipcc::PackFloat32(values, packed.data());
  FUZZ_CHECK(input, length <= packed.size(), "packed past its bound");
  packed.resize(length);  // exactly the message: ASan sees any read past it, and a header
                          // stating another length fails the unpack below
  std::vector<uint32_t> back(values.size());
  const absl::Status status = gossipcc::UnpackFloat32(packed, absl::MakeSpan(back));
  FUZZ_CHECK(input, status.ok(), "own message rejected: " + std::string(status.message()));
  FUZZ_CHECK(input, back == values, "round trip changed the bits");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string input(reinterpret_cast<const char*>(data), size);
  if (data[0] % 2 == 0) {
    const std::vector<uint8_t> message(data + 2, data + size);
    std::vector<uint32_t> values(data[1]);
    const absl::Status status = gossipcc::UnpackFloat32(message, absl::MakeSpan(values));
    if (!status.ok()) {
      const std::string text(status.message());
      FUZZ_CHECK(input, status.code() == absl::StatusCode::kInvalidArgument, "not an InvalidArgument: " + text);
      FUZZ_CHECK(input, text.find("float32 message") != std::string::npos, "error does not name the message: " + text);
      return 0;
    }
    ExpectRoundTrip(input, values);
    return 0;
  }
  std::vector<uint32_t> values((size - 1) / 4);
  if (!values.empty()) std::memcpy(values.data(), data + 1, values.size() * 4);
  ExpectRoundTrip(input, values);
  return 0;
}
