#include "compression/payload.h"

#include <atomic>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <limits>

#include "compression/codecs/common.h"
#include "compression/codecs/quant_kernels.h"

namespace tl {

// Note [host synchronisation]
// On a GPU, anything that brings a device value to the host (.item(), .cpu(), nonzero,
// masked_select, bincount, a bool test of a tensor) waits for every queued kernel, and a pipeline
// stage that does it per message stops overlapping compute with communication. The encode and
// decode paths of the codecs (compression/codecs) avoid it:
//  - byte counts come from shapes: every size in a header is known on the host from the tensor's
//    shape and the codec's parameters (TopK/RandK: k per row; quant: bits and groups; PowerSGD:
//    rank), and selections of a known count are compacted with a scatter instead of nonzero;
//  - sparse index sets on a device use the int or bitmap form (sizes from shapes) unless the
//    spec forces index=delta;
//  - validation of received payloads happens once at the receiver, on the host: deserialize()
//    keeps the host copy (Payload::host_body) and decoders check and parse index sets and nested
//    headers there. A payload made by an encoder of this process is trusted (it is checked by the
//    tests, not per message); nested payloads of a composition travel in Payload::nested;
//  - RNG state stays on the host (BufferedGenerator, layers/nn/rng.h) and is written back to its
//    buffer with non-blocking copies; device-side draws use a device generator seeded from it;
//  - quant's "scale is finite" check runs on CPU tensors only; on a device a non-finite scale
//    makes its group decode to inf/NaN (visible, not clamped) instead of raising.
// What remains, each inherent to what is asked for (listed by the sync-counting test's comments,
// tests/compression/host_sync_test.cpp):
//  - threshold(t) on a device: the number of kept entries is data-dependent: one nonzero per
//    message (the count must reach the host to size the payload);
//  - index=delta forced on a device: the varint stream's length is data-dependent: one .item()
//    per encode;
//  - serialize() of a device payload: the body is copied to the host (that is what it is for);
//  - a from-wire payload whose body was placed on a device without a host copy (not produced by
//    deserialize(); no such transport exists yet) is validated on the device: one sync per index
//    set;
//  - BodyReader on a device body with neither Payload::nested nor host_body (not produced by this
//    code): nested headers are read back, one copy per nested payload;
//  - library internals not under our control: linalg_qr (PowerSGD) may synchronise inside
//    cuSOLVER/MAGMA, at::quantile sorts on the device (no sync in ATen 1.13-2.x);
//  - stateful codecs (compression/stateful: AQ-SGD and error feedback with per-sample caches)
//    check and size their caches from sample ids with .item() (outside this file's codecs).

namespace {

constexpr uint8_t kMagic = 'T';
constexpr uint8_t kVersion = 1;
constexpr size_t kFixedHeader = 8;
constexpr size_t kMaxDims = 16;
constexpr size_t kMaxParams = 64;

// ---- header (de)serialisation -------------------------------------------------------------------
void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v & 0xff));
  out.push_back(static_cast<uint8_t>(v >> 8));
}
void put_i64(std::vector<uint8_t>& out, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>((u >> (8 * i)) & 0xff));
}
int64_t get_i64(const uint8_t* p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<int64_t>(u);
}

bool valid_dtype(uint8_t code) {
  for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble})
    if (code == static_cast<uint8_t>(t)) return true;
  return false;
}

std::vector<uint8_t> header_of(const Payload& p) {
  TORCH_CHECK(p.shape.size() <= kMaxDims, "payload: ", p.shape.size(), " dims; at most ", kMaxDims, " are accepted");
  TORCH_CHECK(p.params.size() <= kMaxParams, "payload: ", p.params.size(), " params; at most ", kMaxParams,
              " are accepted");
  TORCH_CHECK(valid_dtype(static_cast<uint8_t>(p.dtype)), "payload: dtype ", p.dtype,
              " is not accepted (float32, float16, bfloat16, float64)");
  std::vector<uint8_t> out;
  out.reserve(p.header_bytes());
  out.push_back(kMagic);
  out.push_back(kVersion);
  put_u16(out, p.codec);
  out.push_back(static_cast<uint8_t>(p.dtype));
  out.push_back(static_cast<uint8_t>(p.shape.size()));
  out.push_back(static_cast<uint8_t>(p.params.size()));
  out.push_back(0);
  for (int64_t d : p.shape) put_i64(out, d);
  for (int64_t v : p.params) put_i64(out, v);
  put_i64(out, static_cast<int64_t>(p.body_bytes()));
  return out;
}

// Parses and validates a header from `avail` bytes; returns the payload without body, the header
// size and the body size it announces. `what` prefixes errors ("payload", "nested payload").
Payload parse_header(const uint8_t* data, size_t avail, const char* what, size_t& header_size, size_t& body_size) {
  TORCH_CHECK(avail >= kFixedHeader, what, " truncated: ", avail, " bytes, the fixed header alone needs ",
              kFixedHeader);
  TORCH_CHECK(data[0] == kMagic, what, ": bad magic byte 0x", std::hex, static_cast<int>(data[0]),
              " (expected 0x54 'T'): not a tapeline payload");
  TORCH_CHECK(data[1] == kVersion, what, ": unsupported version ", static_cast<int>(data[1]), " (this build reads ",
              static_cast<int>(kVersion), ")");
  Payload p;
  p.codec = static_cast<uint16_t>(data[2] | (data[3] << 8));
  codec_name(p.codec);  // unknown id: error
  TORCH_CHECK(valid_dtype(data[4]), what, ": unknown dtype code ", static_cast<int>(data[4]),
              "; accepted: float32, float16, bfloat16, float64");
  p.dtype = static_cast<at::ScalarType>(data[4]);
  const size_t ndim = data[5], nparams = data[6];
  TORCH_CHECK(ndim <= kMaxDims && nparams <= kMaxParams, what, ": corrupt header: ", ndim, " dims and ", nparams,
              " params (at most ", kMaxDims, " and ", kMaxParams, ")");
  TORCH_CHECK(data[7] == 0, what, ": corrupt header: reserved byte is ", static_cast<int>(data[7]), ", expected 0");
  header_size = kFixedHeader + 8 * (ndim + nparams) + 8;
  TORCH_CHECK(avail >= header_size, what, " truncated: ", avail, " bytes, its header alone needs ", header_size);
  const uint8_t* q = data + kFixedHeader;
  for (size_t i = 0; i < ndim; ++i, q += 8) p.shape.push_back(get_i64(q));
  for (size_t i = 0; i < nparams; ++i, q += 8) p.params.push_back(get_i64(q));
  const int64_t numel = codec::shape_numel(p.shape);  // negative or overflowing extents: error
  TORCH_CHECK(numel <= max_payload_elements(), what, ": shape ", c10::IntArrayRef(p.shape), " declares ", numel,
              " elements; accepted at most ", max_payload_elements(), " (set_max_payload_elements in compression/payload.h)");
  const int64_t body = get_i64(q);
  TORCH_CHECK(body >= 0, what, ": corrupt header: negative body length ", body);
  body_size = static_cast<size_t>(body);
  return p;
}

}  // namespace

namespace {
std::atomic<int64_t> g_max_payload_elements{int64_t(1) << 31};
}  // namespace

int64_t max_payload_elements() { return g_max_payload_elements.load(std::memory_order_relaxed); }
void set_max_payload_elements(int64_t n) {
  TORCH_CHECK(n > 0, "set_max_payload_elements(", n, "): expected a positive count");
  g_max_payload_elements.store(n, std::memory_order_relaxed);
}

// Codec ids (codec_id, codec_name, register_codec_id) are the wire ids of the codec records:
// compression/registry.cpp.

// ---- Payload ------------------------------------------------------------------------------------------
int64_t Payload::numel() const { return codec::shape_numel(shape); }

std::vector<uint8_t> Payload::serialize() const {
  std::vector<uint8_t> out = header_of(*this);
  const size_t body = body_bytes();
  if (body > 0) {
    TORCH_CHECK(this->body.scalar_type() == at::kByte && this->body.dim() == 1, "payload body must be 1-D uint8");
    at::Tensor host = this->body.contiguous().cpu();
    const size_t h = out.size();
    out.resize(h + body);
    std::memcpy(out.data() + h, host.data_ptr<uint8_t>(), body);
  }
  return out;
}

void Payload::serialize_into(uint8_t* out) const {
  const std::vector<uint8_t> header = header_of(*this);
  std::memcpy(out, header.data(), header.size());
  const size_t body = body_bytes();
  if (body > 0) {
    TORCH_CHECK(this->body.scalar_type() == at::kByte && this->body.dim() == 1, "payload body must be 1-D uint8");
    at::Tensor host = this->body.contiguous().cpu();
    std::memcpy(out + header.size(), host.data_ptr<uint8_t>(), body);
  }
}

Payload Payload::deserialize_view(const at::Tensor& buffer, size_t offset, size_t size) {
  TORCH_CHECK(buffer.scalar_type() == at::kByte && buffer.dim() == 1 && buffer.is_contiguous() && buffer.is_cpu(),
              "payload: deserialize_view needs a contiguous 1-D uint8 CPU buffer");
  TORCH_CHECK(offset + size <= static_cast<size_t>(buffer.numel()), "payload: bytes [", offset, ", ", offset + size,
              ") lie outside a buffer of ", buffer.numel());
  const uint8_t* data = buffer.data_ptr<uint8_t>() + offset;
  size_t header = 0, body = 0;
  Payload p = parse_header(data, size, "payload", header, body);
  TORCH_CHECK(size - header == body, "payload: body length mismatch: the header announces ", body,
              " body bytes, the buffer holds ", size - header, " after the ", header, "-byte header");
  p.body = buffer.narrow(0, static_cast<int64_t>(offset + header), static_cast<int64_t>(body));
  p.from_wire = true;
  return p;
}

Payload Payload::deserialize(const uint8_t* data, size_t size, at::Device device) {
  TORCH_CHECK(data != nullptr || size == 0, "payload: null buffer");
  size_t header = 0, body = 0;
  Payload p = parse_header(data, size, "payload", header, body);
  TORCH_CHECK(size - header == body, "payload: body length mismatch: the header announces ", body,
              " body bytes, the buffer holds ", size - header, " after the ", header, "-byte header");
  at::Tensor host = at::empty({static_cast<int64_t>(body)}, at::kByte);
  if (body > 0) std::memcpy(host.data_ptr<uint8_t>(), data + header, body);
  p.body = device.is_cpu() ? host : host.to(device);
  if (!device.is_cpu()) p.host_body = host;  // decoders validate and parse here, not on the device
  p.from_wire = true;
  return p;
}

// ---- BodyWriter / BodyReader -----------------------------------------------------------------------
void BodyWriter::put(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "BodyWriter: undefined section");
  at::Tensor flat = t.contiguous().reshape({-1});
  at::Tensor bytes = flat.scalar_type() == at::kByte ? flat : flat.view(at::kByte);
  bytes_ += bytes.numel();
  parts_.push_back(bytes);
  owned_.push_back(false);
}

void BodyWriter::put_owned(const at::Tensor& t) {
  put(t);
  owned_.back() = t.is_contiguous() && t.storage_offset() == 0 &&
                  static_cast<int64_t>(t.storage().nbytes()) == parts_.back().numel();
}

void BodyWriter::put_payload(const Payload& p) {
  nested_.push_back(p);
  std::vector<uint8_t> h = header_of(p);
  at::Tensor header = at::empty({static_cast<int64_t>(h.size())}, at::kByte);
  std::memcpy(header.data_ptr<uint8_t>(), h.data(), h.size());
  put(header);
  if (p.body_bytes() > 0) put(p.body);
}

at::Tensor BodyWriter::finish() {
  at::Device device = at::kCPU;
  for (const auto& t : parts_)
    if (!t.device().is_cpu()) device = t.device();
  std::vector<size_t> nonempty;
  for (size_t i = 0; i < parts_.size(); ++i)
    if (parts_[i].numel() > 0) nonempty.push_back(i);
  at::Tensor out;
  if (nonempty.size() == 1 && owned_[nonempty[0]] && parts_[nonempty[0]].device() == device) {
    out = parts_[nonempty[0]];  // a section nobody else holds becomes the body as is
  } else {
    out = at::empty({bytes_}, at::TensorOptions().dtype(at::kByte).device(device));
    // Note [host parts of a device body]. Nested headers are made on the host. Copied from pageable
    // memory to a device they would wait for the device (a synchronous copy, found by
    // HostSync.CudaEncodeDecodeNeverSynchronises on an H200); staged in one pinned buffer they
    // are copied without blocking, and the caching host allocator keeps that buffer until the
    // copies have run.
    at::Tensor staged;
    if (!device.is_cpu()) {
      int64_t host_bytes = 0;
      for (size_t i : nonempty)
        if (parts_[i].is_cpu()) host_bytes += parts_[i].numel();
      if (host_bytes > 0) staged = at::empty({host_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    }
    int64_t offset = 0, staged_at = 0;
    for (size_t i : nonempty) {
      const at::Tensor& part = parts_[i];
      const int64_t n = part.numel();
      if (staged.defined() && part.is_cpu()) {
        at::Tensor slot = staged.narrow(0, staged_at, n);
        std::memcpy(slot.data_ptr<uint8_t>(), part.data_ptr<uint8_t>(), static_cast<size_t>(n));
        out.narrow(0, offset, n).copy_(slot, /*non_blocking=*/true);
        staged_at += n;
      } else {
        out.narrow(0, offset, n).copy_(part);
      }
      offset += n;
    }
  }
  parts_.clear();
  owned_.clear();
  bytes_ = 0;
  return out;
}

std::shared_ptr<const std::vector<Payload>> BodyWriter::take_nested() {
  auto out = std::make_shared<const std::vector<Payload>>(std::move(nested_));
  nested_.clear();
  return out;
}

BodyReader::BodyReader(const Payload& p, const char* codec_name)
    : nested_(p.nested), from_wire_(p.from_wire), codec_(codec_name) {
  body_ = p.body.defined() ? p.body : at::empty({0}, at::kByte);
  TORCH_CHECK(body_.scalar_type() == at::kByte && body_.dim() == 1, codec_,
              ": payload body must be a 1-D uint8 tensor, got ", body_.scalar_type(), " of shape ", body_.sizes());
  body_ = body_.contiguous();
  if (!body_.device().is_cpu() && p.host_body.defined() && p.host_body.numel() == body_.numel())
    host_body_ = p.host_body.contiguous();
}

at::Tensor BodyReader::take(at::ScalarType type, int64_t numel) {
  TORCH_CHECK(numel >= 0, codec_, ": corrupt payload: negative section length ", numel);
  const int64_t esize = static_cast<int64_t>(c10::elementSize(type));
  TORCH_CHECK(numel <= (std::numeric_limits<int64_t>::max() - offset_) / esize, codec_,
              ": corrupt payload: section of ", numel, " elements overflows");
  const int64_t bytes = numel * esize;
  TORCH_CHECK(offset_ + bytes <= body_.numel(), codec_, ": payload body truncated: a section of ", numel, " ", type,
              " (", bytes, " bytes) at offset ", offset_, " runs past the end of the ", body_.numel(), "-byte body");
  at::Tensor slice = body_.narrow(0, offset_, bytes);
  offset_ += bytes;
  if (type == at::kByte) return slice;
  const auto addr = reinterpret_cast<uintptr_t>(slice.data_ptr());
  if (addr % esize != 0) {  // unaligned: copy, then view in place
    if (slice.device().is_cpu() && slice.is_contiguous()) {
      // By memcpy: a clone of more than 32 KiB is a parallel region (TopK's fp16 values after an
      // odd count of delta index bytes).
      at::Tensor copy = at::empty({bytes}, slice.options());
      std::memcpy(copy.data_ptr(), slice.data_ptr(), bytes);
      slice = copy;
    } else {
      slice = slice.clone();
    }
  }
  return slice.view(type);
}

Payload BodyReader::take_payload() {
  const int64_t avail = remaining();
  if (nested_ && next_nested_ < nested_->size()) {
    // Written by this process's encoder: its header fields are known, nothing to read back.
    Payload p = (*nested_)[next_nested_++];
    const int64_t size = static_cast<int64_t>(p.nbytes());
    TORCH_CHECK(size <= avail, codec_, ": nested payload truncated: ", size, " bytes, only ", avail, " remain");
    offset_ += size;
    return p;
  }
  // The fixed header says how long the whole header is; read it on the host (from host_body_ when
  // there is one: no device synchronisation).
  const at::Tensor& source = host_body_.defined() ? host_body_ : body_;
  at::Tensor fixed = source.narrow(0, offset_, std::min<int64_t>(avail, kFixedHeader)).cpu();
  std::vector<uint8_t> head(fixed.data_ptr<uint8_t>(), fixed.data_ptr<uint8_t>() + fixed.numel());
  size_t header = 0, body = 0;
  if (head.size() >= kFixedHeader) {
    const size_t full = kFixedHeader + 8 * (head[5] + head[6]) + 8;
    at::Tensor all = source.narrow(0, offset_, std::min<int64_t>(avail, full)).cpu();
    head.assign(all.data_ptr<uint8_t>(), all.data_ptr<uint8_t>() + all.numel());
  }
  std::string what = std::string(codec_) + ": nested payload";
  Payload p = parse_header(head.data(), head.size(), what.c_str(), header, body);
  TORCH_CHECK(static_cast<size_t>(avail) - header >= body, codec_, ": nested payload truncated: its header announces ",
              body, " body bytes, only ", avail - static_cast<int64_t>(header), " remain");
  offset_ += header;
  p.body = body_.narrow(0, offset_, body);
  if (host_body_.defined()) p.host_body = host_body_.narrow(0, offset_, body);
  p.from_wire = from_wire_;
  offset_ += body;
  return p;
}

void BodyReader::finish() const {
  TORCH_CHECK(offset_ == body_.numel(), codec_, ": payload body length mismatch: ", body_.numel(),
              " bytes, the sections account for ", offset_);
}

// ---- bit packing ------------------------------------------------------------------------------------
at::Tensor pack_bits(const at::Tensor& codes, int64_t bits) {
  TORCH_CHECK(bits >= 1 && bits <= 8, "pack_bits: bits=", bits, " is not accepted; accepted: 1..8");
  TORCH_CHECK(!at::isFloatingType(codes.scalar_type()), "pack_bits: codes must be integers, got ", codes.scalar_type());
  at::Tensor c = codes.reshape({-1});
  if (c.scalar_type() != at::kByte) c = c.to(at::kByte);
  c = c.contiguous();
  const int64_t n = c.numel();
  const int64_t out_bytes = (n * bits + 7) / 8;
  if (codec::use_cpu_kernel(c)) {
    at::Tensor out = at::empty({out_bytes}, c.options());
    codec::pack_codes_cpu(c.data_ptr<uint8_t>(), n, static_cast<int>(bits), out.data_ptr<uint8_t>());
    return out;
  }
  if (bits == 8) return c.clone();
  // Portable path: (G, 8) codes -> shift into one int64 per group -> its low `bits` bytes.
  const int64_t groups = (n + 7) / 8;
  at::Tensor padded = at::constant_pad_nd(c, {0, groups * 8 - n}, 0).view({groups, 8});
  at::Tensor field = at::bitwise_and(padded.to(at::kLong), (1 << bits) - 1);
  at::Tensor weights = at::pow(2, at::arange(0, 8 * bits, bits, c.options().dtype(at::kLong)));  // (8)
  at::Tensor acc = (field * weights).sum(1);  // (G) disjoint bit fields: sum == or, < 2^56
  at::Tensor bytes = acc.view(at::kByte).view({groups, 8}).narrow(1, 0, bits).reshape({-1});
  return bytes.narrow(0, 0, out_bytes).contiguous();
}

at::Tensor unpack_bits(const at::Tensor& packed, int64_t bits, int64_t n) {
  TORCH_CHECK(bits >= 1 && bits <= 8, "unpack_bits: bits=", bits, " is not accepted; accepted: 1..8");
  TORCH_CHECK(n >= 0, "unpack_bits: negative count ", n);
  TORCH_CHECK(packed.scalar_type() == at::kByte, "unpack_bits: packed bytes must be uint8, got ", packed.scalar_type());
  at::Tensor p = packed.reshape({-1}).contiguous();
  const int64_t need = (n * bits + 7) / 8;
  TORCH_CHECK(p.numel() == need, "unpack_bits: ", n, " codes of ", bits, " bits need ", need, " bytes, got ",
              p.numel());
  if (codec::use_cpu_kernel(p)) {
    at::Tensor out = at::empty({n}, p.options());
    codec::unpack_codes_cpu(p.data_ptr<uint8_t>(), n, static_cast<int>(bits), out.data_ptr<uint8_t>());
    return out;
  }
  if (bits == 8) return p.clone();
  const int64_t groups = (n + 7) / 8;
  at::Tensor padded = at::constant_pad_nd(p, {0, groups * bits - need}, 0).view({groups, bits});
  at::Tensor weights = at::pow(2, at::arange(0, 8 * bits, 8, p.options().dtype(at::kLong)));  // (bits)
  at::Tensor acc = (padded.to(at::kLong) * weights).sum(1, /*keepdim=*/true);                 // (G, 1)
  at::Tensor shifts = at::arange(0, 8 * bits, bits, p.options().dtype(at::kLong));            // (8)
  at::Tensor codes = at::bitwise_and(at::bitwise_right_shift(acc, shifts), (1 << bits) - 1);  // (G, 8)
  return codes.reshape({-1}).narrow(0, 0, n).to(at::kByte);
}

Payload identity_payload_view(const at::Tensor& x) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "identity_payload_view: a floating-point tensor, got ",
              x.scalar_type());
  Payload p;
  p.codec = codec_id("identity");
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  const at::Tensor flat = x.contiguous().reshape({-1});
  p.body = flat.view(at::kByte);
  return p;
}

}  // namespace tl
