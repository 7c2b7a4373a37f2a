#pragma once
// Payload: the bytes one compressed message puts on the wire. A fixed-layout header (codec id,
// original dtype and shape, codec parameters, body length) followed by the packed body. nbytes()
// is exact: it is what the statistics count and what a transport sends.
//
// Wire layout (little endian):
//   u8 magic 'T', u8 version, u16 codec, u8 dtype, u8 ndim, u8 nparams, u8 reserved,
//   i64 shape[ndim], i64 params[nparams], u64 body_bytes, body[body_bytes]
// so header_bytes() = 8 + 8 * (ndim + nparams) + 8.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tl {

struct Payload {
  uint16_t codec = 0;                 // id of the codec that packed it (see codec_id())
  at::ScalarType dtype = at::kFloat;  // of the original tensor
  std::vector<int64_t> shape;         // of the original tensor
  std::vector<int64_t> params;        // what the decoder needs: k, bits, rank, flags, ...
  at::Tensor body;                    // 1-D uint8 on the tensor's device (may be empty)

  // Not on the wire: what a decoder may use instead of reading a device body back to the host
  // (Note [host synchronisation] in payload.cpp).
  /// Whether the payload came from deserialize() (another process, or a file): decoders then
  /// validate everything data-dependent; a payload made by an encoder of this process is trusted.
  bool from_wire = false;
  /// The body's bytes on the host when the body lives on a device and a host copy existed anyway
  /// (deserialize() had them there). Decoders validate and parse from it without a device sync.
  at::Tensor host_body;
  /// The nested payloads of a composition, as its encoder wrote them into the body: decoders in
  /// the same process take them from here instead of reading their headers back from the device.
  std::shared_ptr<const std::vector<Payload>> nested;

  size_t header_bytes() const { return 8 + 8 * (shape.size() + params.size()) + 8; }
  size_t body_bytes() const { return body.defined() ? static_cast<size_t>(body.numel()) : 0; }
  size_t nbytes() const { return header_bytes() + body_bytes(); }
  int64_t numel() const;

  /// Header and body as host bytes (what a transport sends).
  std::vector<uint8_t> serialize() const;
  /// The same nbytes() bytes written to `out`, without an intermediate buffer.
  void serialize_into(uint8_t* out) const;
  /// Validates everything before use: a truncated or corrupt buffer is an error that says what
  /// was wrong. The body is placed on `device` (non-CPU: host_body keeps the host copy).
  static Payload deserialize(const uint8_t* data, size_t size, at::Device device = at::kCPU);
  /// As deserialize() for bytes [offset, offset + size) of `buffer` (1-D uint8 on the CPU), with
  /// the body a view of them, not a copy: `buffer` must not change while the payload is used.
  static Payload deserialize_view(const at::Tensor& buffer, size_t offset, size_t size);
};

/// The payload the identity codec's encode() makes of floating-point `x` (the same header and body
/// bytes), with the body a view of x's memory instead of a copy: senders that copy the bytes into
/// a message anyway save a pass. `x` must not change while the payload is used.
Payload identity_payload_view(const at::Tensor& x);

/// The most elements a payload from the wire may declare (its shape's product). Decoders allocate
/// the declared shape, and a sparse or low-rank body can be small whatever the shape, so the
/// bound is on the shape: a corrupt or hostile header is an error, not a huge allocation. Default
/// 2^31 (8 GiB as float32), process-wide; a message over it names this setting.
int64_t max_payload_elements();
void set_max_payload_elements(int64_t n);

/// Stable small ids for codec names: the wire ids of the codec records (compression/registry.h),
/// fixed by each codec's registration. Unknown name: error.
uint16_t codec_id(const std::string& name);
const std::string& codec_name(uint16_t id);
/// Adds a name to the table (for codecs outside it). The id must be fixed by the caller, not
/// counted, so that every process agrees; reusing a taken id or name with a different partner is
/// an error, registering the same pair twice is a no-op.
void register_codec_id(const std::string& name, uint16_t id);

/// Appends sections to a body. Sections are byte-aligned and packed back to back; put the widest
/// element types first so that decode can view them in place without copies.
class BodyWriter {
 public:
  /// Appends the raw bytes of `t` (made contiguous); they are copied into the body.
  void put(const at::Tensor& t);
  /// As put, for a tensor the caller will not use again (e.g. a fresh cast): when it is the only
  /// section, it becomes the body without a copy.
  void put_owned(const at::Tensor& t);
  /// Appends a whole payload (header and body), e.g. the inner payloads of a composition.
  void put_payload(const Payload& p);
  /// The body: one uint8 tensor on the device of the sections (CPU if none; CPU sections such as
  /// nested headers are moved to the device of the others).
  at::Tensor finish();
  /// The payloads given to put_payload since the last call, in order (for Payload::nested).
  std::shared_ptr<const std::vector<Payload>> take_nested();

 private:
  std::vector<Payload> nested_;
  std::vector<at::Tensor> parts_;
  std::vector<bool> owned_;
  int64_t bytes_ = 0;
};

/// Reads sections back, with bounds checks that name the codec.
class BodyReader {
 public:
  BodyReader(const Payload& p, const char* codec_name);
  /// The next `numel` elements of type `type` (a view when aligned, a copy otherwise).
  at::Tensor take(at::ScalarType type, int64_t numel);
  /// The next nested payload written by BodyWriter::put_payload (header validated as in
  /// Payload::deserialize; its body is a view of this body). From Payload::nested when the
  /// payload carries them, else parsed (from host_body when there is one).
  Payload take_payload();
  /// Bytes not yet taken.
  int64_t remaining() const { return body_.numel() - offset_; }
  /// Error unless every byte was consumed.
  void finish() const;

 private:
  at::Tensor body_;
  at::Tensor host_body_;  // host copy of body_, or undefined
  std::shared_ptr<const std::vector<Payload>> nested_;
  size_t next_nested_ = 0;
  bool from_wire_ = false;
  int64_t offset_ = 0;
  const char* codec_;
};

/// Bit packing of integer codes in [0, 2^bits), bits in 1..8: n codes -> ceil(n * bits / 8) bytes.
/// Code i occupies bits [i * bits, (i + 1) * bits) of the little-endian bit stream; only the low
/// `bits` bits of each code are kept.
at::Tensor pack_bits(const at::Tensor& codes, int64_t bits);
at::Tensor unpack_bits(const at::Tensor& packed, int64_t bits, int64_t n);

}  // namespace tl
