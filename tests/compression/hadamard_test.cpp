// Hadamard-rotated tile quantisation (hadquant): the rotation is the Sylvester Hadamard matrix
// times random signs (checked against the explicit matrix) and orthogonal; on activations with
// outlier channels and on heavy-tailed data it beats plain per-tile quantisation at the same bits;
// exact payload sizes (padding of a hidden size that is not a multiple of the tile included);
// the seed alone fixes the rotation; the gradient through a Boundary; bad specs and corrupt
// payloads rejected.
#include "compression/codecs/hadamard.h"

#include "compression/boundary.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::header_formula;
using testing::round_trip;
using testing::same_payload;

using testing::rel_error;

// The Sylvester Hadamard matrix of order t (a power of two), built by H_2n = [[H, H], [H, -H]].
at::Tensor sylvester(int64_t t) {
  at::Tensor h = at::ones({1, 1}, at::kDouble);
  while (h.size(0) < t) h = at::cat({at::cat({h, h}, 1), at::cat({h, -h}, 1)}, 0);
  return h;
}

TEST(HadQuant, RotationIsTheRandomisedHadamardTransformAndOrthogonal) {
  at::manual_seed(0);
  for (int64_t t : {2, 8, 128, 1024}) {
    const std::string label = "t=" + std::to_string(t);
    at::Tensor s = codec::hadamard_signs(t, 7, at::kDouble);  // (t)
    EXPECT_TRUE(at::equal(s.abs(), at::ones_like(s))) << label;
    at::Tensor x = at::randn({5, t}, at::kDouble);  // (M, t)
    at::Tensor y = codec::hadamard_rotate(x, s);
    // R = H diag(s) / sqrt(t), applied to each row: y = x R^T.
    at::Tensor r = sylvester(t) * s.unsqueeze(0) / std::sqrt(static_cast<double>(t));
    EXPECT_TRUE(all_close(y, x.matmul(r.t()), "rotation = H diag(s) / sqrt(t), " + label, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(r.matmul(r.t()), at::eye(t, at::kDouble), "R R^T = I, " + label, 1e-12, 0));
    EXPECT_TRUE(all_close(codec::hadamard_unrotate(y, s), x, "inverse, float64, " + label, 1e-12, 0));
    EXPECT_NEAR(y.norm().item<double>(), x.norm().item<double>(), 1e-10 * x.norm().item<double>()) << label;
    // float32: exact to float rounding.
    at::Tensor xf = x.to(at::kFloat), sf = s.to(at::kFloat);
    EXPECT_TRUE(all_close(codec::hadamard_unrotate(codec::hadamard_rotate(xf, sf), sf), xf,
                          "inverse, float32, " + label, 1e-6, 1e-6));
  }
  EXPECT_ERROR_CONTAINS(codec::hadamard_rotate(at::randn({2, 6}), at::ones({6})), "power of two");
}

// The CPU fast path transforms each tile in place (h = t/2 down to 1); its float32 results equal
// the portable path's Stockham stages bit for bit, both ways.
TEST(HadQuant, InPlaceTransformEqualsTheStagesBitForBit) {
  at::manual_seed(4);
  for (int64_t t : {2, 4, 8, 64, 128, 4096}) {
    at::Tensor x = at::randn({37, t}) * at::exp(at::randn({37, 1}) * 3);  // (M, t), scales over 1e-4..1e4
    at::Tensor s = codec::hadamard_signs(t, 11, x.options());
    at::Tensor fast_y = codec::hadamard_rotate(x, s), fast_x = codec::hadamard_unrotate(fast_y, s);
    codec::PortableKernelsGuard g;
    EXPECT_TRUE(at::equal(fast_y, codec::hadamard_rotate(x, s))) << "rotate, t=" << t;
    EXPECT_TRUE(at::equal(fast_x, codec::hadamard_unrotate(fast_y, s))) << "unrotate, t=" << t;
  }
}

// Activations with a few outlier channels (as in LLM residual streams) and heavy-tailed data: the
// rotation spreads an outlier over its tile, so the tile's scale stops being set by one element.
TEST(HadQuant, BeatsPlainTileQuantisationOnOutliers) {
  at::manual_seed(1);
  at::Tensor outliers = at::randn({16, 32, 512});  // (B, T, hidden)
  for (int64_t c : {5, 130, 300, 470}) outliers.select(2, c).mul_(40);
  at::Tensor heavy = at::randn({16, 32, 512}) * at::exp(at::randn({16, 32, 512}) * 1.2);  // log-normal scale mixture
  for (const auto& [name, x] : {std::pair<std::string, at::Tensor>{"outlier channels", outliers},
                                std::pair<std::string, at::Tensor>{"heavy-tailed", heavy}}) {
    for (int64_t bits : {2, 3, 4, 8}) {
      const std::string b = std::to_string(bits);
      const double had = rel_error(x, round_trip(parse_compressor("hadquant(" + b + ", tile=128)"), x));
      const double plain = rel_error(x, round_trip(parse_compressor("quant(" + b + ", scale=block, block=128)"), x));
      std::printf("[measured] %s, %s bits: hadquant(tile=128) rel. error %.4f, quant(block=128) %.4f\n", name.c_str(),
                  b.c_str(), had, plain);
      EXPECT_LT(had, 0.8 * plain) << name << ", bits=" << bits;
    }
  }
}

TEST(HadQuant, PayloadSizeFormula) {
  at::manual_seed(2);
  CodecContext ctx;
  struct Case {
    std::vector<int64_t> shape;
    int64_t tile, t, padded_row;  // the tile used and D' (Note [hadamard tiles])
  };
  const std::vector<Case> cases = {
      {{4, 6, 256}, 128, 128, 256},  // a multiple of the tile
      {{3, 100}, 64, 64, 128},       // padded to 2 tiles per row
      {{5, 20}, 128, 32, 32},        // narrower than the tile: t = 32, padded to 32
      {{1000}, 256, 256, 1024},      // 1-D: one row
      {{2, 3, 1}, 8, 1, 1},          // hidden 1
  };
  for (const Case& c : cases) {
    at::Tensor x = at::randn(c.shape);
    const int64_t rows = x.numel() / c.shape.back();
    const int64_t padded = rows * c.padded_row, groups = std::max<int64_t>(padded / c.t, 1);
    for (int64_t bits : {2, 3, 4, 8}) {
      for (const char* scales : {"fp16", "fp32"}) {
        const std::string spec =
            "hadquant(" + std::to_string(bits) + ", tile=" + std::to_string(c.tile) + ", scales=" + scales + ")";
        Payload p = parse_compressor(spec)->encode(x, ctx);
        const int64_t scale_bytes = groups * (std::string(scales) == "fp16" ? 2 : 4);
        const int64_t expected =
            header_formula(static_cast<int64_t>(c.shape.size()), 4) + scale_bytes + (padded * bits + 7) / 8;
        EXPECT_EQ(static_cast<int64_t>(p.nbytes()), expected) << spec << " on " << x.sizes();
        Payload back = Payload::deserialize(p.serialize().data(), p.nbytes());
        at::Tensor y = parse_compressor(spec)->decode(back, ctx);
        EXPECT_EQ(y.sizes(), x.sizes()) << spec;
        if (bits == 8) {
          EXPECT_LT(rel_error(x, y), 0.02) << spec << " on " << x.sizes();
        }
      }
    }
  }
  // The plain quantiser at the same bits on the same tiles has the same body size: the rotation
  // costs no bytes.
  at::Tensor x = at::randn({4, 6, 256});
  EXPECT_EQ(parse_compressor("hadquant(4, tile=128)")->encode(x, ctx).body_bytes(),
            parse_compressor("quant(4, scale=block, block=128)")->encode(x, ctx).body_bytes());
}

TEST(HadQuant, TheSeedFixesTheRotation) {
  at::manual_seed(3);
  at::Tensor x = at::randn({8, 256});
  CodecContext ctx;
  Payload a = parse_compressor("hadquant(4, seed=5)")->encode(x, ctx);
  Payload b = parse_compressor("hadquant(4, seed=5)")->encode(x, ctx);
  Payload c = parse_compressor("hadquant(4, seed=6)")->encode(x, ctx);
  EXPECT_TRUE(same_payload(a, b)) << "same seed, two codec objects";
  EXPECT_EQ(a.nbytes(), c.nbytes()) << "the signs are not sent";
  EXPECT_FALSE(at::equal(a.body, c.body)) << "another seed rotates otherwise";
  EXPECT_FALSE(at::equal(codec::hadamard_signs(128, 5, at::kFloat), codec::hadamard_signs(128, 6, at::kFloat)));
  EXPECT_TRUE(at::equal(codec::hadamard_signs(128, 5, at::kFloat), codec::hadamard_signs(128, 5, at::kFloat)));
  // Balanced whatever the position: the mean sign of all 4096, of the first half and of the even
  // and odd positions is below 0.1 in magnitude (4.5 standard deviations for 2048 fair signs).
  at::Tensor s = codec::hadamard_signs(4096, 11, at::kDouble);
  for (const at::Tensor& part : {s, s.narrow(0, 0, 2048), s.slice(0, 0, 4096, 2), s.slice(0, 1, 4096, 2)})
    EXPECT_LT(std::abs(part.mean().item<double>()), 0.1) << "sign balance";
  // Consecutive seeds give unrelated signs (agreement about one half; 160 is 5 standard deviations).
  const int64_t agree =
      (codec::hadamard_signs(4096, 11, at::kLong) == codec::hadamard_signs(4096, 12, at::kLong)).sum().item<int64_t>();
  EXPECT_NEAR(agree, 2048, 160);
  // The receiver's replica (same spec) decodes what the sender packed, after the wire.
  auto receiver = parse_compressor("hadquant(4, seed=5)");
  at::Tensor y = receiver->decode(Payload::deserialize(a.serialize().data(), a.nbytes()), ctx);
  EXPECT_TRUE(all_close(y, round_trip(parse_compressor("hadquant(4, seed=5)"), x), "receiver replica", 0, 0));
  // Decoding with the wrong signs is not a round trip: the seed matters.
  at::Tensor s5 = codec::hadamard_signs(128, 5, at::kFloat), s6 = codec::hadamard_signs(128, 6, at::kFloat);
  at::Tensor tiles = x.view({-1, 128});
  EXPECT_GT(rel_error(tiles, codec::hadamard_unrotate(codec::hadamard_rotate(tiles, s5), s6)), 0.5);
  // spec() is canonical.
  auto d = parse_compressor("hadquant(bits=3, tile=64, seed=9, scales=bf16)");
  EXPECT_EQ(d->spec(), "hadquant(3, tile=64, seed=9, scales=bf16)");
  EXPECT_TRUE(same_payload(d->encode(x, ctx), parse_compressor(d->spec())->encode(x, ctx)));
}

// Note [two paths] (common.h): the quantiser's CPU loop and its portable ATen path (CUDA's) pack
// the rotated tiles into the same bytes; the rotation itself is ATen ops on every device.
TEST(HadQuant, CpuAndPortablePathsGiveIdenticalPayloads) {
  at::manual_seed(6);
  at::Tensor x = at::randn({3, 7, 200});  // hidden 200: padded to 256 with tile=128
  CodecContext ctx;
  for (const char* spec : {"hadquant(4)", "hadquant(3, tile=64, seed=2)", "hadquant(8, tile=16, scales=bf16)"}) {
    auto c = parse_compressor(spec);
    Payload cpu = c->encode(x, ctx);
    at::Tensor y_cpu = c->decode(cpu, ctx);
    codec::PortableKernelsGuard guard(/*device_semantics=*/true);
    Payload portable = c->encode(x, ctx);
    EXPECT_TRUE(same_payload(cpu, portable)) << spec;
    EXPECT_TRUE(all_close(c->decode(portable, ctx), y_cpu, std::string("decode, ") + spec, 0, 0));
  }
}

TEST(HadQuant, DtypesAndCompositions) {
  at::manual_seed(4);
  at::Tensor x = at::randn({6, 96});  // 96 = 64 + 32: the second tile is half padding
  for (at::ScalarType t : {at::kHalf, at::kBFloat16, at::kDouble}) {
    at::Tensor y = round_trip(parse_compressor("hadquant(8, tile=64)"), x.to(t));
    EXPECT_EQ(y.scalar_type(), t);
    EXPECT_LT(rel_error(x, y), 0.02) << t;
  }
  // Edge shapes: 0-D, empty, zero-width rows; what comes back has the shape that went in, and the
  // byte count follows the formula (one scale when there is no tile).
  for (const at::Tensor& e : {at::tensor(3.0f), at::empty({0, 16}), at::empty({4, 0}), at::randn({1})}) {
    CodecContext ectx;
    auto c = parse_compressor("hadquant(8, tile=16)");
    Payload p = c->encode(e, ectx);
    at::Tensor y = c->decode(Payload::deserialize(p.serialize().data(), p.nbytes()), ectx);
    EXPECT_EQ(y.sizes(), e.sizes());
    if (e.numel() > 0) {
      EXPECT_LT(rel_error(e, y), 0.01) << e.sizes();
    }
  }
  // As the inner stage of a composition: TopK's kept values rotated and quantised.
  CodecContext ctx;
  auto comp = parse_compressor("topk(0.25, values=fp32) | hadquant(8, tile=16)");
  at::Tensor y = round_trip(comp, x);
  at::Tensor ref = round_trip(parse_compressor("topk(0.25, values=fp32)"), x);
  EXPECT_EQ(((y != 0) & (ref == 0)).sum().item<int64_t>(), 0) << "only TopK's support is sent";
  EXPECT_LT(rel_error(ref, y), 0.02);
}

TEST(HadQuant, GradientOfTheLayer) {
  at::manual_seed(5);
  at::Tensor x = at::randn({4, 8, 64}), g = at::randn({4, 8, 64});
  auto run = [&](const BoundaryPtr& b) {
    Variable v(x.clone(), true);
    Variable out = b->forward(v);
    out.backward(g);
    return std::make_pair(out.data(), v.grad());
  };
  // As quant: straight-through passes dL/dx = g, independent compresses g with the backward codec.
  auto ste = std::make_shared<Boundary>("cut", "hadquant(4)", "", BackwardMode::StraightThrough);
  auto [out, grad] = run(ste);
  EXPECT_TRUE(all_close(out, round_trip(parse_compressor("hadquant(4)"), x), "forward = decode(encode(x))", 0, 0));
  EXPECT_TRUE(all_close(grad, g, "straight-through", 0, 0));
  auto ind = std::make_shared<Boundary>("cut", "hadquant(4)", "hadquant(8, seed=3)", BackwardMode::Independent);
  auto [out2, grad2] = run(ind);
  EXPECT_TRUE(all_close(grad2, round_trip(parse_compressor("hadquant(8, seed=3)"), g), "independent", 0, 0));
  EXPECT_LT(rel_error(g, grad2), 0.02);
  // Byte statistics count the real payloads.
  CodecContext ctx;
  EXPECT_EQ(ind->stats().forward.bytes, static_cast<int64_t>(parse_compressor("hadquant(4)")->encode(x, ctx).nbytes()));
  // No shared mode, as for quant: there is no support to reuse.
  EXPECT_ERROR_CONTAINS(Boundary("cut", "hadquant(4)", "", BackwardMode::Shared), "shared");
}

TEST(HadQuant, BadSpecsAreRejected) {
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4, tile=100)"), "tile");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4, tile=100)"), "power of two");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4, tile=1)"), "power of two");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4, tile=131072)"), "2..65536");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(0)"), "1..8");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(bits=16)"), "1..8");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4, seed=-1)"), ">= 0");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4, scales=fp8)"), "fp16");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4, block=64)"), "block");
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4) | quant(4)"), "no value sections");
  EXPECT_ERROR_CONTAINS(HadamardQuant(HadamardQuantOptions{4, 96, 0, at::kHalf}), "tile=96");
  CodecContext ctx;
  EXPECT_ERROR_CONTAINS(parse_compressor("hadquant(4)")->encode(at::ones({4}, at::kInt), ctx), "hadquant");
}

TEST(HadQuant, CorruptPayloadsAreRejected) {
  at::Tensor x = at::randn({4, 128});
  CodecContext ctx;
  auto c = parse_compressor("hadquant(4, tile=64)");
  const Payload good = c->encode(x, ctx);
  Payload p = good;
  p.params.pop_back();
  EXPECT_ERROR_CONTAINS(c->decode(p, ctx), "params");
  p = good;
  p.params[1] = 48;
  EXPECT_ERROR_CONTAINS(c->decode(p, ctx), "tile=48");
  p = good;
  p.params[0] = 9;
  EXPECT_ERROR_CONTAINS(c->decode(p, ctx), "bits=9");
  p = good;
  p.body = good.body.narrow(0, 0, good.body.numel() - 1);
  EXPECT_NE(testing::error_of([&] { c->decode(p, ctx); }), "");
  p = good;
  p.codec = codec_id("quant");
  EXPECT_ERROR_CONTAINS(c->decode(p, ctx), "cannot decode a payload packed by 'quant'");
}

}  // namespace
}  // namespace tl
