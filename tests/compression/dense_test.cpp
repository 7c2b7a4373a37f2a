// identity / fp16 / bf16: round trips, exact payload sizes, wrong-codec and corrupt payloads.
#include "compression/codecs/dense.h"

#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::header_formula;
using testing::round_trip;

TEST(Dense, RoundTripsAndSizes) {
  at::manual_seed(0);
  at::Tensor x = at::randn({4, 3, 5});
  CodecContext ctx;
  struct Case {
    const char* spec;
    int64_t elem;
    at::ScalarType wire;
  };
  for (Case c : {Case{"identity", 4, at::kFloat}, Case{"fp16", 2, at::kHalf}, Case{"bf16", 2, at::kBFloat16}}) {
    auto codec = parse_compressor(c.spec);
    Payload p = codec->encode(x, ctx);
    EXPECT_EQ(static_cast<int64_t>(p.nbytes()), header_formula(3, 0) + 60 * c.elem) << c.spec;
    at::Tensor y = codec->decode(p, ctx);
    EXPECT_EQ(y.scalar_type(), at::kFloat);
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_TRUE(all_close(y, x.to(c.wire).to(at::kFloat), c.spec, 0, 0));
    std::vector<uint8_t> bytes = p.serialize();
    EXPECT_TRUE(all_close(codec->decode(Payload::deserialize(bytes.data(), bytes.size()), ctx), y,
                          std::string(c.spec) + " after serialization", 0, 0));
  }
  // Other input dtypes keep their dtype.
  at::Tensor d = at::randn({3}, at::kDouble);
  EXPECT_TRUE(all_close(round_trip(parse_compressor("identity"), d), d, "identity float64", 0, 0));
  EXPECT_EQ(round_trip(parse_compressor("fp16"), d).scalar_type(), at::kDouble);
  at::Tensor s = at::randn({});
  EXPECT_TRUE(all_close(round_trip(parse_compressor("identity"), s), s, "scalar", 0, 0));
}

TEST(Dense, RejectsForeignAndCorruptPayloads) {
  CodecContext ctx;
  at::Tensor x = at::randn({8});
  auto fp16 = parse_compressor("fp16");
  auto bf16 = parse_compressor("bf16");
  Payload p = fp16->encode(x, ctx);
  EXPECT_ERROR_CONTAINS(bf16->decode(p, ctx), "bf16: cannot decode a payload packed by 'fp16'");
  Payload cut = p;
  cut.body = p.body.narrow(0, 0, p.body.numel() - 1);
  EXPECT_ERROR_CONTAINS(fp16->decode(cut, ctx), "payload body truncated");
  Payload extra = p;
  extra.body = at::cat({p.body, at::zeros({2}, at::kByte)});
  EXPECT_ERROR_CONTAINS(fp16->decode(extra, ctx), "bytes besides the value section");
  Payload params = p;
  params.params = {1};
  EXPECT_ERROR_CONTAINS(fp16->decode(params, ctx), "1 params, expected 0");
  EXPECT_ERROR_CONTAINS(fp16->encode(at::ones({2}, at::kInt), ctx), "cannot compress a tensor of type Int");
  EXPECT_FALSE(fp16->supports_shared());
  EXPECT_ERROR_CONTAINS(fp16->encode_shared(x, p, ctx), "does not support backward mode 'shared'");
}

}  // namespace
}  // namespace tl
