// A transport frame from a peer: the header checks, then the body as a payload. For a body in
// pieces (Note [bodies in pieces] in transport.h) the input holds, after the header, the trailer
// and then the body, whose pieces are checked against the trailer's sums as the receiver does.
#include <stdexcept>

#include "compression/payload.h"
#include "parallel/ranks/checksum.h"
#include "parallel/ranks/transport.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(frame) {
  // Decoders allocate the declared shape: bound it below the fuzzer's 1 GiB allocation limit.
  static const bool limited = (tl::set_max_payload_elements(int64_t(1) << 22), true);
  (void)limited;
  namespace wire = tl::ranks::wire;
  const int64_t tag = 3;
  const wire::FrameHeader h = wire::parse_frame_header(data, size, /*expected_seq=*/0, &tag, /*max=*/1 << 20);
  TL_FUZZ_CHECK(h.body_bytes >= 0 && h.body_bytes <= (1 << 20) && h.seq == 0 && h.tag == tag,
                "header accepted out of range");
  TL_FUZZ_CHECK(h.pieces == 0 || (h.pieces >= 2 && h.pieces <= wire::kMaxPieces), "piece count accepted out of range");
  size_t at = wire::kHeaderBytes;
  if (h.pieces > 0) {
    const size_t trailer = static_cast<size_t>(wire::trailer_words(h.pieces) * 8);
    if (size - at < trailer) throw std::runtime_error("no room for the trailer");
    const std::vector<uint32_t> sums = wire::parse_trailer(data + at, trailer, h.seq, h.pieces);
    at += trailer;
    if (size - at < static_cast<size_t>(h.body_bytes)) throw std::runtime_error("body cut short");
    for (int64_t k = 0; k < h.pieces; ++k) {
      const wire::PieceSpan s = wire::piece_span(h.body_bytes, h.pieces, k);
      TL_FUZZ_CHECK(s.bytes > 0 && s.offset + s.bytes <= h.body_bytes, "piece out of the body");
      if (tl::ranks::crc32c(data + at + s.offset, static_cast<size_t>(s.bytes)) != sums[static_cast<size_t>(k)])
        throw std::runtime_error("piece checksum mismatch");
    }
  }
  const size_t body = std::min(static_cast<size_t>(h.body_bytes), size - at);
  // As the receiver: a body whose checksum differs is rejected before it is read.
  if (h.pieces == 0 && h.body_crc != 0 && wire::body_crc_word(data + at, body) != h.body_crc)
    throw std::runtime_error("body checksum mismatch");
  tl::Payload::deserialize(data + at, body);
}
