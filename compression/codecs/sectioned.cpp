#include "compression/codecs/sectioned.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compression/codecs/common.h"
#include "compression/codecs/inline_parallel.h"

namespace tl {
namespace {
constexpr double kHalfMax = 65504.0;  // the largest finite fp16

// Note [values into the body on the CPU]. The ATen form of join makes each section in up to three
// passes, each its own parallel region (the fp16 clamp, the cast, the copy into the body): on the
// loaded 2-core machine a region waits for a second thread that is often descheduled (tens of ms
// for TopK's 1.7M values of a 64 MiB tensor, against 1.5 ms on one thread). For float32 values on
// the CPU, one loop writes each section into the body in its wire type: saturated at the largest
// fp16, then rounded to nearest even, as the ATen cast. A NaN (whose bits the vectorised ATen cast
// and the scalar conversion spell differently) sends its section to the ATen form.

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_SECTION_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TL_SECTION_CLONES
#endif

// One 16-bit value at any byte: a section starts where the previous one ended, odd or even (the fuzz
// harness of specs found the aligned stores misaligned).
inline void store16(uint8_t* p, uint16_t x) { std::memcpy(p, &x, sizeof(x)); }

// fp16 (saturated) or bf16 of v[0, n) at out, rounded to nearest even; true when a NaN was seen.
// Plain loops the compiler vectorises (Note [target clones] in quant_kernels.cpp); fp16 with the
// F16C conversion where the CPU has it (the same rounding as the scalar form and ATen's cast).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target("avx2,f16c"))) bool to_half_f16c(const float* v, int64_t n, uint8_t* out) {
  const __m256 hi = _mm256_set1_ps(static_cast<float>(kHalfMax)), lo = _mm256_set1_ps(-static_cast<float>(kHalfMax));
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m128i h = _mm256_cvtps_ph(_mm256_min_ps(_mm256_max_ps(x, lo), hi), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  bool seen = _mm256_movemask_ps(nan) != 0;
  for (; i < n; ++i) {
    seen |= v[i] != v[i];
    store16(out + 2 * i, at::Half(std::min(std::max(v[i], static_cast<float>(-kHalfMax)), static_cast<float>(kHalfMax))).x);
  }
  return seen;
}
#endif

TL_SECTION_CLONES bool to_bf16(const float* v, int64_t n, uint8_t* out) {
  int32_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, sizeof(u));
    nan |= (u & 0x7fffffffu) > 0x7f800000u;
    store16(out + 2 * i, static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7fffu) >> 16));  // c10::BFloat16's rounding
  }
  return nan != 0;
}

TL_SECTION_CLONES bool to_half(const float* v, int64_t n, uint8_t* out) {
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= v[i] != v[i];
    store16(out + 2 * i, at::Half(std::min(std::max(v[i], static_cast<float>(-kHalfMax)), static_cast<float>(kHalfMax))).x);
  }
  return nan;
}

// Section v (float32, contiguous) in type `wire` at out; false at a NaN (out then partly written).
bool write_values_cpu(const float* v, int64_t n, at::ScalarType wire, uint8_t* out) {
  if (wire == at::kFloat) {
    if (n > 0) std::memcpy(out, v, n * sizeof(float));
    return true;
  }
  [[maybe_unused]] const bool f16c = codec::cpu_has_avx2_f16c();  // GCC builds only
  std::atomic<bool> finite_or_inf{true};
  // 4 bytes read and 2 written an element.
  codec::parallel_for(0, n, 6, [&](int64_t i0, int64_t i1) {
    uint8_t* o = out + 2 * i0;  // a section may start at any byte of the body
    bool nan;
    if (wire == at::kBFloat16) {
      nan = to_bf16(v + i0, i1 - i0, o);
    } else {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
      nan = f16c ? to_half_f16c(v + i0, i1 - i0, o) : to_half(v + i0, i1 - i0, o);
#else
      nan = to_half(v + i0, i1 - i0, o);
#endif
    }
    if (nan) finite_or_inf = false;
  });
  return finite_or_inf;
}
}  // namespace

int64_t SectionedCodec::Section::numel() const { return codec::shape_numel(shape); }

Payload SectionedCodec::join(Payload rest, const std::vector<at::Tensor>& values,
                             const std::vector<Section>& secs) const {
  TORCH_CHECK(values.size() == secs.size(), codec(), ": encoder produced ", values.size(),
              " sections, its header announces ", secs.size());
  int64_t bytes = static_cast<int64_t>(rest.body_bytes());
  bool cpu = !rest.body.defined() || rest.body.device().is_cpu();
  for (size_t i = 0; i < values.size(); ++i) {
    TORCH_CHECK(values[i].numel() == secs[i].numel(), codec(), ": section ", i, " has ", values[i].numel(),
                " values, its header announces ", secs[i].numel());
    bytes += secs[i].numel() * static_cast<int64_t>(c10::elementSize(secs[i].wire_type));
    const at::ScalarType wt = secs[i].wire_type;
    cpu = cpu && values[i].scalar_type() == at::kFloat && codec::use_cpu_kernel(values[i]) &&
          (wt == at::kFloat || wt == at::kHalf || wt == at::kBFloat16);
  }
  if (cpu && !values.empty()) {                       // Note [values into the body on the CPU]
    at::Tensor body = at::empty({bytes}, at::kByte);  // (bytes)
    uint8_t* out = body.data_ptr<uint8_t>();
    const int64_t head = static_cast<int64_t>(rest.body_bytes());
    if (head > 0) std::memcpy(out, rest.body.contiguous().data_ptr<uint8_t>(), head);
    out += head;
    for (size_t i = 0; i < values.size(); ++i) {
      const at::Tensor v = values[i].contiguous();
      const int64_t n = v.numel(), size = n * static_cast<int64_t>(c10::elementSize(secs[i].wire_type));
      if (!write_values_cpu(v.data_ptr<float>(), n, secs[i].wire_type, out)) {
        const bool saturate = secs[i].wire_type == at::kHalf;
        at::Tensor w = (saturate ? v.clamp(-kHalfMax, kHalfMax) : v).to(secs[i].wire_type).contiguous();
        std::memcpy(out, w.data_ptr(), size);
      }
      out += size;
    }
    rest.body = body;
    return rest;
  }
  BodyWriter w;
  if (rest.body_bytes() > 0) w.put(rest.body);
  for (size_t i = 0; i < values.size(); ++i) {
    // fp16 saturates at its largest finite value: an overflow to inf would turn into NaN at the
    // receiver (inf * 0) and end training, where a clipped value is only a large error.
    const bool saturate = secs[i].wire_type == at::kHalf && c10::elementSize(values[i].scalar_type()) > 2;
    at::Tensor v = (saturate ? values[i].clamp(-kHalfMax, kHalfMax) : values[i]).to(secs[i].wire_type);
    if (v.is_same(values[i]))
      w.put(v);  // may alias the caller's tensor (identity): copied
    else
      w.put_owned(v);  // a fresh cast: becomes the body without a copy when it is all of it
  }
  rest.body = w.finish();
  return rest;
}

SectionedCodec::Parts SectionedCodec::split_with(const Payload& p, const std::vector<Section>& secs) const {
  int64_t section_bytes = 0;
  for (const auto& s : secs) section_bytes += s.numel() * static_cast<int64_t>(c10::elementSize(s.wire_type));
  const int64_t body = static_cast<int64_t>(p.body_bytes());
  TORCH_CHECK(body >= section_bytes, codec(), ": payload body truncated: ", body,
              " bytes, its value sections alone need ", section_bytes);
  BodyReader r(p, codec());
  Parts parts;
  parts.rest = p;
  parts.rest.nested = nullptr;
  parts.rest.body = r.take(at::kByte, body - section_bytes);
  parts.rest.host_body = p.host_body.defined() && p.host_body.numel() == body
                             ? p.host_body.narrow(0, 0, body - section_bytes)
                             : at::Tensor();
  for (const auto& s : secs) parts.values.push_back(r.take(s.wire_type, s.numel()).view(s.shape));
  r.finish();
  return parts;
}

SectionedCodec::Parts SectionedCodec::split(const Payload& p) const {
  check_payload_codec(p);
  Payload header = p;
  header.body = at::Tensor();
  return split_with(p, sections(header));
}

SectionedCodec::Parts SectionedCodec::split_shared(const Payload& p, const Payload& fwd_rest) const {
  check_payload_codec(p);
  Payload header = p;
  header.body = at::Tensor();
  return split_with(p, shared_sections(header, fwd_rest));
}

void SectionedCodec::check_payload_codec(const Payload& p) const {
  const uint16_t mine = codec_id(codec());
  TORCH_CHECK(p.codec == mine, codec(), ": cannot decode a payload packed by '", codec_name(p.codec), "' (codec id ",
              p.codec, ", expected ", mine, ")");
}

Payload SectionedCodec::join_parts(Payload rest, const std::vector<at::Tensor>& values) const {
  Payload header = rest;
  header.body = at::Tensor();
  return join(std::move(rest), values, sections(header));
}

Payload SectionedCodec::encode(const at::Tensor& x, const CodecContext& ctx) {
  codec::check_input(x, codec());
  std::vector<at::Tensor> values;
  Payload rest = encode_parts(x, ctx, values);
  return join_parts(std::move(rest), values);
}

at::Tensor SectionedCodec::decode(const Payload& p, const CodecContext& ctx) {
  Parts parts = split(p);
  return decode_parts(parts.rest, parts.values, ctx);
}

Payload SectionedCodec::encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) {
  if (!supports_shared()) return Compressor::encode_shared(g, fwd, ctx);
  codec::check_input(g, codec());
  Parts f = split(fwd);
  if (!shared_uses_forward_values()) f.values.clear();
  std::vector<at::Tensor> values;
  Payload rest = encode_shared_parts(g, f.rest, f.values, ctx, values);
  Payload header = rest;
  header.body = at::Tensor();
  return join(std::move(rest), values, shared_sections(header, f.rest));
}

at::Tensor SectionedCodec::decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) {
  if (!supports_shared()) return Compressor::decode_shared(p, fwd, ctx);
  Parts f = split(fwd);
  if (!shared_uses_forward_values()) f.values.clear();
  Parts parts = split_shared(p, f.rest);
  return decode_shared_parts(parts.rest, f.rest, f.values, parts.values, ctx);
}

Payload SectionedCodec::encode_shared_parts(const at::Tensor& g, const Payload& fwd_rest,
                                            const std::vector<at::Tensor>& fwd_values, const CodecContext& ctx,
                                            std::vector<at::Tensor>& values) {
  return Compressor::encode_shared(g, fwd_rest, ctx);
}

std::vector<SectionedCodec::Section> SectionedCodec::shared_sections(const Payload& rest,
                                                                     const Payload& fwd_rest) const {
  TORCH_CHECK(false, codec(), ": backward mode 'shared' is not supported");
}

at::Tensor SectionedCodec::decode_shared_parts(const Payload& rest, const Payload& fwd_rest,
                                               const std::vector<at::Tensor>& fwd_values,
                                               const std::vector<at::Tensor>& values, const CodecContext& ctx) {
  return Compressor::decode_shared(rest, fwd_rest, ctx);
}

// ---- sizing (Note [sizing a payload]) ----------------------------------------------------------

SectionedCodec::SizedParts SectionedCodec::size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  return SizedParts{Compressor::payload_size(shape, dtype).bytes};  // refuses
}

SectionedCodec::SizedParts SectionedCodec::size_shared_parts(const std::vector<int64_t>& shape,
                                                             at::ScalarType dtype) const {
  return SizedParts{Compressor::shared_payload_size(shape, dtype).bytes};  // refuses
}

namespace {
PayloadSize sum_parts(const SectionedCodec::SizedParts& parts) {
  PayloadSize out{parts.rest_bytes, parts.kind};
  for (const auto& s : parts.sections) out.bytes += s.numel() * static_cast<int64_t>(c10::elementSize(s.wire_type));
  return out;
}
}  // namespace

PayloadSize SectionedCodec::payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  return sum_parts(size_parts(shape, dtype));
}

PayloadSize SectionedCodec::shared_payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  if (!supports_shared()) return Compressor::shared_payload_size(shape, dtype);
  return sum_parts(size_shared_parts(shape, dtype));
}

}  // namespace tl
