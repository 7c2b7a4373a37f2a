#include "compression/codecs/quantile.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "compression/codecs/common.h"
#include "compression/codecs/quant_kernels.h"

namespace tl {
namespace {
constexpr const char* kQuantileName = "quantile";
constexpr int64_t kMaxSample = int64_t(1) << 24;  // at::quantile's input limit

// Note [quantile codewords on the CPU]. at::quantile(sample, probs) sorts the sample (m elements),
// then for each p takes the sorted values at below = floor(r) and above = ceil(r), r = p * (m - 1),
// and returns values_below.lerp_(values_above, r - below). Here the sorted values come from
// sorted_values_cpu (Note [sorted by radix]) and the interpolation is the same ATen lerp_ on
// tensors of L elements, so the codewords are at::quantile's bit for bit. The one thing that is
// not the same in every libtorch is r's precision: PyTorch 2.15 forms it in double, older
// versions (1.13's Sorting.cpp: q * last_index) in the input's float, which differs once
// p * (m - 1) needs more than 24 bits (256 levels of 65536 elements). rank_in_double() asks the
// linked libtorch once, with a probe where the two differ.
bool rank_in_double() {
  static const bool in_double = [] {
    // Sorted: 32896 zeros, then ones. The 128.5/256 quantile lies between positions 32895 and
    // 32896 at r - 32895: 0.498046875 with r in double, 0.5 with r rounded to float.
    const at::Tensor probe = at::cat({at::zeros({32896}, at::kFloat), at::ones({32640}, at::kFloat)});
    const at::Tensor p = at::full({1}, 128.5f / 256.0f, at::kFloat);
    return at::quantile(probe, p).item<float>() != 0.5f;
  }();
  return in_double;
}

// The L codewords at::quantile(sample, probs_i = (i + 0.5) / L) gives, sample = x[0], x[stride],
// ... (count elements), on the CPU; false where sorted_values_cpu leaves it to ATen.
bool quantile_words_cpu(const float* x, int64_t count, int64_t stride, int64_t levels, float* words) {
  std::vector<int64_t> ranks(2 * levels);  // below[0, L), above[0, L)
  std::vector<float> weights(levels), above(levels);
  const bool in_double = rank_in_double();
  for (int64_t i = 0; i < levels; ++i) {
    const float p = (static_cast<float>(i) + 0.5f) / static_cast<float>(levels);  // exact: L is 2^bits
    const double r = in_double ? static_cast<double>(p) * static_cast<double>(count - 1)
                               : static_cast<double>(p * static_cast<float>(count - 1));
    ranks[i] = static_cast<int64_t>(r);
    ranks[levels + i] = static_cast<int64_t>(std::ceil(r));
    weights[i] = static_cast<float>(r - static_cast<double>(ranks[i]));
  }
  std::vector<float> values(2 * levels);
  if (!codec::sorted_values_cpu(x, count, stride, ranks.data(), 2 * levels, values.data())) return false;
  std::memcpy(words, values.data(), levels * sizeof(float));
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
  at::from_blob(words, {levels}, f32)
      .lerp_(at::from_blob(values.data() + levels, {levels}, f32), at::from_blob(weights.data(), {levels}, f32));
  return true;
}
}  // namespace

QuantileCodec::QuantileCodec(QuantileOptions o) : Compressor("QuantileCodec"), o_(o) {
  TORCH_CHECK(o_.bits >= 1 && o_.bits <= 8, kQuantileName, ": bits=", o_.bits, " is not accepted; accepted: 1..8");
  TORCH_CHECK(o_.sample >= 1 && o_.sample <= kMaxSample, kQuantileName, ": sample=", o_.sample,
              " is not accepted; accepted: 1..", kMaxSample);
}

CompressorPtr QuantileCodec::from_spec(SpecArgs& args) {
  constexpr size_t kNamed = SpecArgs::kNamedOnly;
  QuantileOptions o;
  o.bits = args.integer(0, "bits", 8);
  if (o.bits < 1 || o.bits > 8) args.fail(0, "bits", "an integer in 1..8");
  o.sample = args.integer(kNamed, "sample", 65536);
  if (o.sample < 1 || o.sample > kMaxSample) args.fail(kNamed, "sample", "an integer in 1..16777216");
  o.mean_centers = args.word(kNamed, "centers", {"mean", "quantile"}, std::string("mean")) == "mean";
  o.codebook = codec::wire_type_from_word(args.word(kNamed, "codebook", codec::wire_type_words(), std::string("fp32")));
  return std::make_shared<QuantileCodec>(o);
}

std::string QuantileCodec::spec() const {
  return "quantile(" + std::to_string(o_.bits) + ", sample=" + std::to_string(o_.sample) +
         ", centers=" + (o_.mean_centers ? "mean" : "quantile") + ", codebook=" + codec::wire_type_word(o_.codebook) +
         ")";
}

Payload QuantileCodec::encode(const at::Tensor& x, const CodecContext& ctx) {
  codec::check_input(x, kQuantileName);
  at::Tensor xf = x.to(at::kFloat).contiguous().reshape({-1});
  Payload p;
  p.codec = codec_id(kQuantileName);
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  p.params = {o_.bits, o_.sample, o_.mean_centers ? 1 : 0, codec::wire_type_param(o_.codebook)};
  p.body = codec::use_cpu_kernel(xf) ? encode_cpu(xf) : encode_portable(xf);
  return p;
}

// The portable path (any device): ATen ops.
at::Tensor QuantileCodec::encode_portable(const at::Tensor& xf) const {
  const int64_t n = xf.numel(), levels = int64_t(1) << o_.bits;
  at::Tensor book = at::zeros({levels}, xf.options());
  at::Tensor codes = at::empty({n}, xf.options().dtype(at::kByte));
  if (n > 0) {
    const int64_t stride = n > o_.sample ? n / o_.sample : 1;
    at::Tensor sample = stride > 1 ? xf.slice(0, 0, stride * o_.sample, stride) : xf;
    at::Tensor probs = (at::arange(levels, xf.options()) + 0.5) / static_cast<double>(levels);
    at::Tensor words = at::quantile(sample, probs);  // (L) sorted
    at::Tensor mid = ((words.narrow(0, 1, levels - 1) + words.narrow(0, 0, levels - 1)) / 2).contiguous();  // (L-1)
    at::Tensor c = at::bucketize(xf, mid, /*out_int32=*/true);
    codes = c.to(at::kByte);
    book = words;
    if (o_.mean_centers) {
      at::Tensor cl = c.to(at::kLong);
      at::Tensor sums = at::zeros({levels}, xf.options().dtype(at::kDouble)).index_add_(0, cl, xf.to(at::kDouble));
      at::Tensor counts =
          at::zeros({levels}, cl.options()).index_add_(0, cl, at::ones_like(cl));  // bincount would sync
      book = at::where(counts > 0, sums / counts.clamp_min(1), words.to(at::kDouble)).to(at::kFloat);
    }
  }
  BodyWriter w;
  w.put(book.to(o_.codebook));
  w.put(pack_bits(codes, o_.bits));
  return w.finish();
}

// The CPU path: the body is made once (the codebook, then the packed codes; 8-bit codes are
// written into it directly), the codewords by Note [quantile codewords on the CPU], the per-code
// arithmetic in plain loops: the same values as the portable path's ATen ops on (L) tensors.
at::Tensor QuantileCodec::encode_cpu(const at::Tensor& xf) const {
  const int64_t n = xf.numel(), levels = int64_t(1) << o_.bits;
  const int64_t book_bytes = levels * static_cast<int64_t>(c10::elementSize(o_.codebook));
  at::Tensor body = at::empty({book_bytes + (n * o_.bits + 7) / 8}, xf.options().dtype(at::kByte));
  std::vector<float> book(levels, 0.0f);
  if (n > 0) {
    const int64_t stride = n > o_.sample ? n / o_.sample : 1, count = stride > 1 ? o_.sample : n;
    const float* xp = xf.data_ptr<float>();
    std::vector<float> words(levels);
    if (!quantile_words_cpu(xp, count, stride, levels, words.data())) {
      const at::Tensor probs = (at::arange(levels, xf.options()) + 0.5) / static_cast<double>(levels);
      const at::Tensor w = at::quantile(xf.slice(0, 0, stride * count, stride), probs).contiguous();  // (L)
      std::memcpy(words.data(), w.data_ptr<float>(), levels * sizeof(float));
    }
    std::vector<float> mid(levels - 1);
    for (int64_t i = 0; i + 1 < levels; ++i) mid[i] = (words[i + 1] + words[i]) / 2;
    std::vector<double> sums(o_.mean_centers ? levels : 0);
    std::vector<int64_t> counts(o_.mean_centers ? levels : 0);
    at::Tensor codes = o_.bits == 8 ? body.narrow(0, book_bytes, n) : at::empty({n}, xf.options().dtype(at::kByte));
    codec::nearest_codes_cpu(xp, n, mid.data(), static_cast<int>(o_.bits), codes.data_ptr<uint8_t>(),
                             o_.mean_centers ? sums.data() : nullptr, o_.mean_centers ? counts.data() : nullptr);
    for (int64_t l = 0; l < levels; ++l)
      book[l] =
          !o_.mean_centers || counts[l] == 0 ? words[l] : static_cast<float>(sums[l] / static_cast<double>(counts[l]));
    if (o_.bits < 8)
      codec::pack_codes_cpu(codes.data_ptr<uint8_t>(), n, static_cast<int>(o_.bits),
                            body.data_ptr<uint8_t>() + book_bytes);
  }
  uint8_t* out = body.data_ptr<uint8_t>();
  if (o_.codebook == at::kFloat) {
    std::memcpy(out, book.data(), book_bytes);
  } else {
    const at::Tensor b = at::from_blob(book.data(), {levels}, at::kFloat).to(o_.codebook);  // ATen's rounding
    std::memcpy(out, b.data_ptr(), book_bytes);
  }
  return body;
}

at::Tensor QuantileCodec::decode(const Payload& p, const CodecContext& ctx) {
  codec::check_payload(p, kQuantileName, 4);
  const int64_t bits = p.params[0];
  TORCH_CHECK(bits >= 1 && bits <= 8, kQuantileName, ": corrupt payload: bits=", bits);
  TORCH_CHECK(p.params[1] >= 1 && (p.params[2] == 0 || p.params[2] == 1), kQuantileName, ": corrupt payload: sample ",
              p.params[1], ", centers ", p.params[2]);
  const at::ScalarType book_type = codec::wire_type_from_param(p.params[3], kQuantileName);
  const int64_t n = p.numel(), levels = int64_t(1) << bits;
  BodyReader r(p, kQuantileName);
  at::Tensor book = r.take(book_type, levels).to(at::kFloat).contiguous();
  const at::Tensor packed = r.take(at::kByte, (n * bits + 7) / 8);
  r.finish();
  // 4-bit codes are looked up where they lie, two a byte (Note [small books in registers]).
  if (bits == 4 && codec::use_cpu_kernel(packed)) {
    const at::Tensor bytes = packed.contiguous();
    at::Tensor out = at::empty({n}, book.options());
    if (codec::packed4_lookup_cpu(bytes.data_ptr<uint8_t>(), n, book.data_ptr<float>(), out.data_ptr<float>()))
      return out.to(p.dtype).view(p.shape);
  }
  // 8-bit codes are read where they lie on the CPU (unpack_bits would copy them).
  at::Tensor codes = bits == 8 && codec::use_cpu_kernel(packed) ? packed.contiguous() : unpack_bits(packed, bits, n);
  at::Tensor out;
  if (codec::use_cpu_kernel(codes)) {
    out = at::empty({n}, book.options());
    codec::codebook_lookup_cpu(codes.data_ptr<uint8_t>(), n, book.data_ptr<float>(), levels, out.data_ptr<float>());
  } else {
    out = book.index_select(0, codes.to(at::kLong));
  }
  return out.to(p.dtype).view(p.shape);
}

}  // namespace tl
