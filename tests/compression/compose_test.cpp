// Composition `a | b`: a's value sections go through b. Round trips equal the stages applied by
// hand, payload sizes follow the nested-header formula, shared mode reuses the outer support or
// basis, and corrupt or mismatched payloads are rejected.
#include "compression/codecs/compose.h"

#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::header_formula;
using testing::round_trip;

TEST(Compose, TopKThenQuantiseTheKeptValues) {
  at::manual_seed(0);
  at::Tensor x = at::randn({4, 50});
  CodecContext ctx;
  auto c = parse_compressor("topk(0.2, values=fp32, index=int32) | quant(4, scales=fp32)");
  Payload p = c->encode(x, ctx);
  at::Tensor y = c->decode(p, ctx);
  // By hand: the kept values, shaped (rows, k) as TopK's section, through quant(4).
  at::Tensor kept = round_trip(parse_compressor("topk(0.2, values=fp32)"), x);
  at::Tensor mask = kept != 0;
  at::Tensor vals = x.masked_select(mask).view({4, 10});
  at::Tensor qvals = round_trip(parse_compressor("quant(4, scales=fp32)"), vals);
  at::Tensor expect = at::zeros_like(x).masked_scatter(mask, qvals);
  EXPECT_TRUE(all_close(y, expect, "topk | quant", 0, 0));
  // Size: composition header + nested topk rest (header + int32 indices) + nested quant payload.
  const int64_t n = 40;
  const int64_t expect_bytes =
      header_formula(2, 3) + header_formula(2, 7) + 4 * n + header_formula(2, 7) + 4 + (n * 4 + 7) / 8;
  EXPECT_EQ(static_cast<int64_t>(p.nbytes()), expect_bytes);
  // Serialized and read back.
  std::vector<uint8_t> bytes = p.serialize();
  EXPECT_TRUE(
      all_close(c->decode(Payload::deserialize(bytes.data(), bytes.size()), ctx), y, "after serialization", 0, 0));
}

TEST(Compose, PowerSgdFactorsQuantisedAndChains) {
  at::manual_seed(1);
  at::Tensor x = at::randn({30, 4}).mm(at::randn({4, 20}));
  CodecContext ctx;
  auto c = parse_compressor("powersgd(4) | quant(8, scale=channel, dim=0, scales=fp32)");
  Payload p = c->encode(x, ctx);
  // Two sections, P (30, 4) and Q (20, 4), each quantised per row.
  const int64_t expect =
      header_formula(2, 3) + header_formula(2, 6) + 2 * header_formula(2, 7) + (30 + 20) * 4 + 30 * 4 + 20 * 4;
  EXPECT_EQ(static_cast<int64_t>(p.nbytes()), expect);
  at::Tensor y = c->decode(p, ctx);
  EXPECT_LT(((y - x).norm() / x.norm()).item<double>(), 0.03);
  // Three stages: a | (b | c).
  auto three = parse_compressor("topk(0.5, values=fp32) | topk(0.5, scope=global, values=fp32) | fp16");
  at::Tensor z = round_trip(three, x);
  EXPECT_EQ((z != 0).sum().item<int64_t>(), 30 * 10 / 2);
  at::Tensor kept = z != 0;
  EXPECT_TRUE(
      all_close(z.masked_select(kept), x.masked_select(kept).to(at::kHalf).to(at::kFloat), "chain values", 0, 0));
  EXPECT_EQ(three->spec(),
            "topk(0.5, scope=sample, values=fp32, index=auto) | topk(0.5, scope=global, values=fp32, "
            "index=auto) | fp16");
}

TEST(Compose, SharedModeUsesTheOuterSupport) {
  at::manual_seed(2);
  at::Tensor x = at::randn({3, 40}), g = at::randn({3, 40});
  CodecContext ctx;
  auto c = parse_compressor("topk(0.25, values=fp32) | quant(8, scales=fp32)");
  ASSERT_TRUE(c->supports_shared());
  Payload fwd = c->encode(x, ctx);
  at::Tensor mask = c->decode(fwd, ctx) != 0;
  at::Tensor back = c->decode_shared(c->encode_shared(g, fwd, ctx), fwd, ctx);
  EXPECT_TRUE(at::equal(back != 0, mask & (back != 0)));
  at::Tensor gq = round_trip(parse_compressor("quant(8, scales=fp32)"), g.masked_select(mask).view({3, 10}));
  EXPECT_TRUE(all_close(back, at::zeros_like(g).masked_scatter(mask, gq), "shared topk | quant", 0, 0));
  EXPECT_ERROR_CONTAINS(c->decode(c->encode_shared(g, fwd, ctx), ctx), "expected a plain payload");

  auto lr = parse_compressor("powersgd(3) | fp16");
  at::Tensor m = at::randn({12, 3}).mm(at::randn({3, 9}));
  Payload pf = lr->encode(m, ctx);
  at::Tensor gs = lr->decode_shared(lr->encode_shared(m * 2, pf, ctx), pf, ctx);
  EXPECT_TRUE(all_close(gs, m * 2, "powersgd | fp16 shared, gradient in span", 2e-2, 2e-2));

  auto q = parse_compressor("fp16 | quant(4)");
  EXPECT_FALSE(q->supports_shared());
  EXPECT_ERROR_CONTAINS(q->encode_shared(g, q->encode(g, ctx), ctx), "does not support backward mode 'shared'");
}

TEST(Compose, MismatchedAndCorruptPayloadsAreRejected) {
  at::manual_seed(3);
  at::Tensor x = at::randn({4, 20});
  CodecContext ctx;
  auto a = parse_compressor("topk(0.2) | quant(4)");
  auto b = parse_compressor("randk(0.2) | quant(4)");
  Payload p = a->encode(x, ctx);
  EXPECT_ERROR_CONTAINS(b->decode(p, ctx), "this composition is 'randk");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(0.2) | fp16")->decode(p, ctx),
                        "fp16: cannot decode a payload packed by 'quant'");
  Payload cut = p;
  cut.body = p.body.narrow(0, 0, p.body.numel() - 2);
  EXPECT_ERROR_CONTAINS(a->decode(cut, ctx), "nested payload truncated");
  Payload extra = p;
  extra.body = at::cat({p.body, at::zeros({3}, at::kByte)});
  EXPECT_ERROR_CONTAINS(a->decode(extra, ctx), "compose: payload body length mismatch");
  Payload sections = p;
  sections.params[2] = 2;
  EXPECT_ERROR_CONTAINS(a->decode(sections, ctx), "announces 2 sections");
  EXPECT_ERROR_CONTAINS(a->decode(parse_compressor("topk(0.2)")->encode(x, ctx), ctx),
                        "compose: cannot decode a payload packed by 'topk'");
}

}  // namespace
}  // namespace tl
