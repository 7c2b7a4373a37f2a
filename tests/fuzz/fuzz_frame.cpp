// A transport frame from a peer: the header checks, then the body as a payload.
#include <stdexcept>

#include "compression/payload.h"
#include "parallel/ranks/transport.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(frame) {
  // Decoders allocate the declared shape: bound it below the fuzzer's 1 GiB allocation limit.
  static const bool limited = (tl::set_max_payload_elements(int64_t(1) << 22), true);
  (void)limited;
  namespace wire = tl::ranks::wire;
  const int64_t tag = 3;
  const wire::FrameHeader h = wire::parse_frame_header(data, size, /*expected_seq=*/0, &tag, /*max=*/1 << 20);
  TL_FUZZ_CHECK(h.body_bytes >= 0 && h.body_bytes <= (1 << 20) && h.seq == 0 && h.tag == tag, "header accepted out of range");
  const size_t body = std::min(static_cast<size_t>(h.body_bytes), size - wire::kHeaderBytes);
  // As the receiver: a body whose checksum differs is rejected before it is read.
  if (h.body_crc != 0 && wire::body_crc_word(data + wire::kHeaderBytes, body) != h.body_crc)
    throw std::runtime_error("body checksum mismatch");
  tl::Payload::deserialize(data + wire::kHeaderBytes, body);
}
