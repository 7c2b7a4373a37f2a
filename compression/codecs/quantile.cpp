#include "compression/codecs/quantile.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "compression/codecs/common.h"
#include "compression/codecs/quant_kernels.h"

namespace tl {
namespace {
constexpr const char* kName = "quantile";
constexpr int64_t kMaxSample = int64_t(1) << 24;  // at::quantile's input limit
}  // namespace

QuantileCodec::QuantileCodec(QuantileOptions o) : Compressor("QuantileCodec"), o_(o) {
  TORCH_CHECK(o_.bits >= 1 && o_.bits <= 8, kName, ": bits=", o_.bits, " is not accepted; accepted: 1..8");
  TORCH_CHECK(o_.sample >= 1 && o_.sample <= kMaxSample, kName, ": sample=", o_.sample,
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
  codec::check_input(x, kName);
  at::Tensor xf = x.to(at::kFloat).contiguous().reshape({-1});
  const int64_t n = xf.numel(), levels = int64_t(1) << o_.bits;
  at::Tensor book = at::zeros({levels}, xf.options());
  // On the CPU the body is made once: the codebook, then the packed codes; 8-bit codes are written
  // into it directly (the ATen form copies them twice: pack_bits, then BodyWriter).
  const bool cpu = codec::use_cpu_kernel(xf);
  const int64_t book_bytes = levels * static_cast<int64_t>(c10::elementSize(o_.codebook));
  at::Tensor body = cpu ? at::empty({book_bytes + (n * o_.bits + 7) / 8}, xf.options().dtype(at::kByte)) : at::Tensor();
  at::Tensor codes =
      cpu && o_.bits == 8 ? body.narrow(0, book_bytes, n) : at::empty({n}, xf.options().dtype(at::kByte));
  if (n > 0) {
    const int64_t stride = n > o_.sample ? n / o_.sample : 1;
    at::Tensor sample = stride > 1 ? xf.slice(0, 0, stride * o_.sample, stride) : xf;
    at::Tensor probs = (at::arange(levels, xf.options()) + 0.5) / static_cast<double>(levels);
    at::Tensor words = at::quantile(sample, probs);  // (L) sorted
    at::Tensor mid = ((words.narrow(0, 1, levels - 1) + words.narrow(0, 0, levels - 1)) / 2).contiguous();  // (L-1)
    at::Tensor sums, counts;
    if (cpu) {
      sums = at::empty({levels}, xf.options().dtype(at::kDouble));
      counts = at::empty({levels}, xf.options().dtype(at::kLong));
      codec::nearest_codes_cpu(xf.data_ptr<float>(), n, mid.data_ptr<float>(), static_cast<int>(o_.bits),
                               codes.data_ptr<uint8_t>(), o_.mean_centers ? sums.data_ptr<double>() : nullptr,
                               o_.mean_centers ? counts.data_ptr<int64_t>() : nullptr);
    } else {
      at::Tensor c = at::bucketize(xf, mid, /*out_int32=*/true);
      codes = c.to(at::kByte);
      if (o_.mean_centers) {
        at::Tensor cl = c.to(at::kLong);
        sums = at::zeros({levels}, xf.options().dtype(at::kDouble)).index_add_(0, cl, xf.to(at::kDouble));
        counts = at::zeros({levels}, cl.options()).index_add_(0, cl, at::ones_like(cl));  // bincount would sync
      }
    }
    book = o_.mean_centers ? at::where(counts > 0, sums / counts.clamp_min(1), words.to(at::kDouble)).to(at::kFloat)
                           : words;
  }
  if (cpu) {
    const at::Tensor b = book.to(o_.codebook).contiguous();
    std::memcpy(body.data_ptr<uint8_t>(), b.data_ptr(), book_bytes);
    if (o_.bits < 8 && n > 0)
      codec::pack_codes_cpu(codes.data_ptr<uint8_t>(), n, static_cast<int>(o_.bits),
                            body.data_ptr<uint8_t>() + book_bytes);
  } else {
    BodyWriter w;
    w.put(book.to(o_.codebook));
    w.put(pack_bits(codes, o_.bits));
    body = w.finish();
  }
  Payload p;
  p.codec = codec_id(kName);
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  p.params = {o_.bits, o_.sample, o_.mean_centers ? 1 : 0, codec::wire_type_param(o_.codebook)};
  p.body = body;
  return p;
}

at::Tensor QuantileCodec::decode(const Payload& p, const CodecContext& ctx) {
  codec::check_payload(p, kName, 4);
  const int64_t bits = p.params[0];
  TORCH_CHECK(bits >= 1 && bits <= 8, kName, ": corrupt payload: bits=", bits);
  TORCH_CHECK(p.params[1] >= 1 && (p.params[2] == 0 || p.params[2] == 1), kName, ": corrupt payload: sample ",
              p.params[1], ", centers ", p.params[2]);
  const at::ScalarType book_type = codec::wire_type_from_param(p.params[3], kName);
  const int64_t n = p.numel(), levels = int64_t(1) << bits;
  BodyReader r(p, kName);
  at::Tensor book = r.take(book_type, levels).to(at::kFloat).contiguous();
  const at::Tensor packed = r.take(at::kByte, (n * bits + 7) / 8);
  r.finish();
  // 8-bit codes are read where they lie on the CPU (unpack_bits would copy them).
  at::Tensor codes = bits == 8 && codec::use_cpu_kernel(packed) ? packed.contiguous() : unpack_bits(packed, bits, n);
  at::Tensor out;
  if (codec::use_cpu_kernel(codes)) {
    out = at::empty({n}, book.options());
    const uint8_t* c = codes.data_ptr<uint8_t>();
    const float* b = book.data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) o[i] = b[c[i]];
    });
  } else {
    out = book.index_select(0, codes.to(at::kLong));
  }
  return out.to(p.dtype).view(p.shape);
}

}  // namespace tl
