#include "compression/codecs/dense.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compression/codecs/common.h"
#include "compression/codecs/inline_parallel.h"

namespace tl {
namespace {

// Note [casts back on the CPU]. A decoded fp16/bf16 section becomes float32 in one loop, on two
// threads only by the rule of Note [codec threads] (a 1 MiB output stays on one): ATen's copy
// kernel started a parallel region for it, and on a loaded 2-core machine a 1 MiB bf16 decode
// then waited 10 ms for the second thread (30 us on one). Every fp16 and bf16 value is a float32:
// bf16 is its top half, fp16 converts exactly (F16C or c10::Half); a section holding a NaN (whose
// payload bits the conversions may treat differently) is left to ATen.

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_CAST_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TL_CAST_CLONES
#endif

TL_CAST_CLONES bool from_bf16(const uint8_t* in, int64_t n, float* out) {
  int32_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    nan |= (h & 0x7fff) > 0x7f80;
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    std::memcpy(out + i, &u, 4);
  }
  return nan != 0;
}

bool from_half_scalar(const uint8_t* in, int64_t n, float* out) {
  int32_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    nan |= (h & 0x7fff) > 0x7c00;
    out[i] = static_cast<float>(c10::Half(h, c10::Half::from_bits()));
  }
  return nan != 0;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target("avx2,f16c"))) bool from_half_f16c(const uint8_t* in, int64_t n, float* out) {
  __m256i nan = _mm256_setzero_si256();
  const __m256i mag = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    nan = _mm256_or_si256(nan, _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_cvtepu16_epi32(h), mag), inf));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  return from_half_scalar(in + 2 * i, n - i, out + i) || !_mm256_testz_si256(nan, nan);
}
#endif

}  // namespace

bool codec::cast_back_cpu(const uint8_t* in, int64_t n, at::ScalarType wire, float* out) {
  [[maybe_unused]] const bool f16c = codec::cpu_has_avx2_f16c();  // GCC builds only
  std::atomic<bool> no_nan{true};
  // 2 bytes read and 4 written an element.
  codec::parallel_for(0, n, 6, [&](int64_t i0, int64_t i1) {
    bool nan;
    if (wire == at::kBFloat16) {
      nan = from_bf16(in + 2 * i0, i1 - i0, out + i0);
    } else {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
      nan = f16c ? from_half_f16c(in + 2 * i0, i1 - i0, out + i0) : from_half_scalar(in + 2 * i0, i1 - i0, out + i0);
#else
      nan = from_half_scalar(in + 2 * i0, i1 - i0, out + i0);
#endif
    }
    if (nan) no_nan = false;
  });
  return no_nan;
}

DenseCodec::DenseCodec(const std::string& name) : SectionedCodec("DenseCodec"), name_(name) {
  if (name == "fp16")
    wire_ = at::kHalf;
  else if (name == "bf16")
    wire_ = at::kBFloat16;
  else
    TORCH_CHECK(name == "identity", "dense codec '", name, "' is not known; accepted: identity, fp16, bf16");
}

CompressorPtr DenseCodec::from_spec(const std::string& name, SpecArgs& args) {
  if (name == "cast") return std::make_shared<DenseCodec>(args.word(0, "to", {"fp16", "bf16"}));
  return std::make_shared<DenseCodec>(name);
}

Payload DenseCodec::encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) {
  Payload p;
  p.codec = codec_id(name_);
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  values = {x};
  return p;
}

std::vector<SectionedCodec::Section> DenseCodec::sections(const Payload& rest) const {
  codec::check_payload(rest, name_.c_str(), 0);
  return {Section{rest.shape, wire_ ? *wire_ : rest.dtype}};
}

at::Tensor DenseCodec::decode_parts(const Payload& rest, const std::vector<at::Tensor>& values,
                                    const CodecContext& ctx) {
  TORCH_CHECK(rest.body_bytes() == 0, name_, ": corrupt payload: ", rest.body_bytes(),
              " bytes besides the value section");
  TORCH_CHECK(values.size() == 1, name_, ": expected one value section, got ", values.size());
  const at::Tensor& v = values[0];
  if (rest.dtype == at::kFloat && (v.scalar_type() == at::kHalf || v.scalar_type() == at::kBFloat16) &&
      codec::use_cpu_kernel(v) && v.is_contiguous()) {  // Note [casts back on the CPU]
    at::Tensor out = at::empty(v.sizes(), v.options().dtype(at::kFloat));
    if (codec::cast_back_cpu(static_cast<const uint8_t*>(v.data_ptr()), v.numel(), v.scalar_type(),
                             out.data_ptr<float>()))
      return out.view(rest.shape);
  }
  return v.to(rest.dtype).view(rest.shape);
}

SectionedCodec::SizedParts DenseCodec::size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  SizedParts out;
  out.rest_bytes = payload_header_bytes(static_cast<int64_t>(shape.size()), 0);
  out.sections = {Section{shape, wire_ ? *wire_ : dtype}};
  out.value_types = {dtype};
  return out;
}

}  // namespace tl
