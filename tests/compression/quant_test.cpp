// Uniform quantisation: the AQ-SGD formula exactly, error within half a step for every scale
// grouping and bit width, stochastic rounding unbiased, exact payload sizes, identical payloads on
// the CPU and portable paths, channel dims, and corrupt payloads rejected.
#include "compression/codecs/quant.h"

#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::header_formula;
using testing::round_trip;
using testing::same_payload;

// (G, rest) view of x whose rows are the scale groups, for reference computations.
at::Tensor groups_view(const at::Tensor& x, const std::string& scale, int64_t dim, int64_t block) {
  if (scale == "tensor") return x.reshape({1, -1});
  if (scale == "channel") return x.movedim(dim, 0).reshape({x.size(dim), -1});
  const int64_t n = x.numel(), g = (n + block - 1) / block;
  at::Tensor flat = x.reshape({-1});
  return at::cat({flat, flat.narrow(0, n - 1, 1).expand({g * block - n})}).view({g, block});
}

TEST(Quant, AqSgdFormulaExactly) {
  at::manual_seed(0);
  at::Tensor x = at::randn({4, 6, 16});  // (B, T, hidden): one scale per hidden channel
  for (int64_t bits : {2, 3, 4, 8}) {
    at::Tensor y = round_trip(parse_compressor("quant(" + std::to_string(bits) + ", scale=channel, scales=fp32)"), x);
    // Reference, written as in AQ-SGD's compress/fixpoint.py.
    const double p = std::pow(2.0, bits - 1);
    at::Tensor s = x.abs().amax({0, 1}, /*keepdim=*/true);
    at::Tensor q = at::round(x / (s + 1e-6) * p).clamp(-p, p - 1);
    at::Tensor ref = q / p * s;
    EXPECT_TRUE(all_close(y, ref, "AQ-SGD formula, bits=" + std::to_string(bits), 0, 0));
  }
}

TEST(Quant, ErrorWithinHalfAStep) {
  at::manual_seed(1);
  at::Tensor x = at::randn({3, 5, 7, 11}) * 3 + 0.5;  // 1155 elements: a partial last block
  CodecContext ctx;
  for (const char* scale : {"tensor", "channel", "block"}) {
    for (const char* mode : {"maxabs", "minmax"}) {
      for (const char* scales : {"fp32", "fp16", "bf16"}) {
        for (int64_t bits = 1; bits <= 8; ++bits) {
          const std::string spec = "quant(" + std::to_string(bits) + ", scale=" + scale + ", mode=" + mode +
                                   ", scales=" + scales + (std::string(scale) == "block" ? ", block=100)" : ")");
          auto c = parse_compressor(spec);
          Payload p = c->encode(x, ctx);
          at::Tensor y = c->decode(p, ctx);
          at::Tensor gx = groups_view(x, scale, 1, 100), gy = groups_view(y, scale, 1, 100);
          const int64_t groups = gx.size(0);
          // The scales as sent (the first section of the body).
          const at::ScalarType st = std::string(scales) == "fp32"   ? at::kFloat
                                    : std::string(scales) == "fp16" ? at::kHalf
                                                                    : at::kBFloat16;
          const bool minmax = std::string(mode) == "minmax";
          const int64_t count = minmax ? 2 * groups : groups;
          at::Tensor sent = p.body.narrow(0, 0, count * c10::elementSize(st)).view(st).to(at::kFloat).view({-1, 1});
          at::Tensor err = (gx - gy).abs();
          at::Tensor tol = 1e-6 * (gx.abs() + 1);  // float rounding of the formulas
          if (minmax) {
            at::Tensor lo = sent.narrow(0, 0, groups), hi = sent.narrow(0, groups, groups);
            EXPECT_TRUE((lo <= std::get<0>(gx.min(1, true))).all().item<bool>()) << spec << ": lo rounded down";
            EXPECT_TRUE((hi >= std::get<0>(gx.max(1, true))).all().item<bool>()) << spec << ": hi rounded up";
            at::Tensor step = (hi - lo) / ((1 << bits) - 1);
            EXPECT_TRUE((err <= step / 2 + tol).all().item<bool>())
                << spec << ": max err / step = " << (err / step).max().item<float>();
          } else {
            at::Tensor s = sent;
            EXPECT_TRUE((s >= std::get<0>(gx.abs().max(1, true))).all().item<bool>()) << spec << ": s rounded up";
            // x / s * 2^(b-1) is rounded and clipped to [-2^(b-1), 2^(b-1) - 1]: half a step
            // everywhere but just below +s, where the top code is one step short of s.
            at::Tensor step = s / std::pow(2.0, bits - 1);
            at::Tensor bound = at::where(gx > s - step, step, step / 2) + tol;
            EXPECT_TRUE((err <= bound).all().item<bool>())
                << spec << ": max err / step = " << (err / step).max().item<float>();
          }
        }
      }
    }
  }
}

TEST(Quant, StochasticRoundingIsUnbiased) {
  at::manual_seed(2);
  at::Tensor x = at::rand({64}) * 2 - 1;
  x[0] = -1.0;  // pin the range so that every draw has the same grid
  x[1] = 1.0;
  for (bool portable : {false, true}) {
    std::optional<codec::PortableKernelsGuard> guard;
    if (portable) guard.emplace();
    auto c = parse_compressor("quant(2, mode=minmax, round=stochastic, scales=fp32, seed=4)");
    const int64_t T = 2000;
    at::Tensor sum = at::zeros_like(x);
    at::Tensor first = round_trip(c, x), differs = at::zeros({64}, at::kBool);
    for (int64_t t = 0; t < T; ++t) {
      at::Tensor y = round_trip(c, x);
      differs |= y != first;
      sum += y;
    }
    // Each draw is one of the two grid points around x (step 2/3), with the right odds: the
    // mean of T draws has standard deviation at most step / 2 / sqrt(T). Allow 5 sigma.
    const double step = 2.0 / 3.0, tol = 5 * step / 2 / std::sqrt(double(T));
    EXPECT_LT(((sum / T) - x).abs().max().item<double>(), tol) << (portable ? "portable" : "cpu");
    EXPECT_GT(differs.sum().item<int64_t>(), 50) << "fresh randomness every call";
    // Round to nearest, by contrast, is biased by up to half a step.
    at::Tensor nearest = round_trip(parse_compressor("quant(2, mode=minmax, scales=fp32)"), x);
    EXPECT_GT((nearest - x).abs().max().item<double>(), 4 * tol);
  }
}

TEST(Quant, PayloadSizeFormula) {
  CodecContext ctx;
  at::Tensor x = at::randn({2, 3, 4, 5});  // 120 elements
  struct Case {
    std::string spec;
    int64_t scale_values;  // per group count, times 2 for minmax
    int64_t scale_bytes;
  };
  for (int64_t bits : {1, 3, 4, 7, 8}) {
    const std::string b = std::to_string(bits);
    for (Case c : {Case{"quant(" + b + ")", 1, 2}, Case{"quant(" + b + ", mode=minmax)", 2, 2},
                   Case{"quant(" + b + ", scale=channel)", 3, 2}, Case{"quant(" + b + ", scale=channel, dim=3)", 5, 2},
                   Case{"quant(" + b + ", scale=block, block=50, mode=minmax, scales=fp32)", 2 * 3, 4},
                   Case{"quant(" + b + ", scale=channel, dim=-1, scales=bf16)", 5, 2}}) {
      Payload p = parse_compressor(c.spec)->encode(x, ctx);
      EXPECT_EQ(static_cast<int64_t>(p.nbytes()),
                header_formula(4, 7) + c.scale_values * c.scale_bytes + (120 * bits + 7) / 8)
          << c.spec;
    }
  }
}

TEST(Quant, ChannelDims) {
  auto q = std::dynamic_pointer_cast<Quantize>(parse_compressor("quant(4, scale=channel)"));
  EXPECT_EQ(q->channel_dim(4), 1) << "(B, C, H, W): C";
  EXPECT_EQ(q->channel_dim(5), 1);
  EXPECT_EQ(q->channel_dim(3), 2) << "(B, T, hidden): hidden";
  EXPECT_EQ(q->channel_dim(2), 1);
  EXPECT_ERROR_CONTAINS(q->channel_dim(1), "needs a tensor of at least 2 dims");
  auto d0 = std::dynamic_pointer_cast<Quantize>(parse_compressor("quant(4, scale=channel, dim=0)"));
  EXPECT_EQ(d0->channel_dim(3), 0);
  CodecContext ctx;
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4, scale=channel, dim=5)")->encode(at::randn({2, 3}), ctx),
                        "dim=5 is out of range");
  // Channels with very different ranges keep their own resolution.
  at::Tensor x = at::randn({8, 4, 3, 3}) * at::tensor({1e-3, 1.0, 10.0, 100.0}).view({1, 4, 1, 1});
  at::Tensor y = round_trip(parse_compressor("quant(8, scale=channel, scales=fp32)"), x);
  at::Tensor rel = (x - y).abs().amax({0, 2, 3}) / x.abs().amax({0, 2, 3});
  EXPECT_LT(rel.max().item<double>(), 1.0 / 127);
}

TEST(Quant, CpuAndPortablePathsGiveIdenticalPayloads) {
  at::manual_seed(3);
  CodecContext ctx;
  for (auto shape : {std::vector<int64_t>{5, 3, 7, 9}, std::vector<int64_t>{2, 50, 33}, std::vector<int64_t>{1000}}) {
    at::Tensor x = at::randn(shape);
    for (int64_t bits : {1, 2, 3, 5, 8}) {
      const std::string b = std::to_string(bits);
      std::vector<std::string> specs = {"quant(" + b + ")", "quant(" + b + ", mode=minmax, scales=bf16)",
                                        "quant(" + b + ", scale=block, block=64)",
                                        "quant(" + b + ", scale=block, block=7, mode=minmax)"};
      if (shape.size() > 1) {
        specs.push_back("quant(" + b + ", scale=channel)");
        specs.push_back("quant(" + b + ", scale=channel, dim=0, mode=minmax, scales=fp32)");
      }
      for (const auto& spec : specs) {
        auto c = parse_compressor(spec);
        Payload fast = c->encode(x, ctx);
        codec::PortableKernelsGuard g;
        Payload portable = c->encode(x, ctx);
        EXPECT_TRUE(same_payload(fast, portable)) << spec << " shape " << c10::IntArrayRef(shape);
        EXPECT_TRUE(all_close(c->decode(fast, ctx), round_trip(c, x), spec + " portable decode", 0, 0));
      }
    }
  }
}

TEST(Quant, OtherDtypesAndEdgeCases) {
  CodecContext ctx;
  at::Tensor h = at::randn({4, 8}).to(at::kHalf);
  at::Tensor y = round_trip(parse_compressor("quant(8)"), h);
  EXPECT_EQ(y.scalar_type(), at::kHalf);
  EXPECT_LT((y.to(at::kFloat) - h.to(at::kFloat)).abs().max().item<float>(), 0.05);
  at::Tensor c = at::full({3, 4}, 2.5);
  EXPECT_TRUE(all_close(round_trip(parse_compressor("quant(3, mode=minmax)"), c), c, "constant minmax", 0, 0));
  at::Tensor z = at::zeros({5});
  EXPECT_TRUE(all_close(round_trip(parse_compressor("quant(4)"), z), z, "zeros", 0, 0));
  at::Tensor e = at::zeros({0, 3});
  EXPECT_EQ(round_trip(parse_compressor("quant(4, scale=channel)"), e).sizes(), e.sizes());
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(8)")->encode(at::full({3}, 1e6), ctx), "use scales=fp32");
  EXPECT_TRUE(all_close(round_trip(parse_compressor("quant(8, scales=fp32)"), at::full({3}, 1e6)), at::full({3}, 1e6),
                        "large values with fp32 scales", 0, 1e-2));
}

TEST(Quant, CorruptPayloadsAreRejected) {
  CodecContext ctx;
  auto c = parse_compressor("quant(4, scale=channel)");
  Payload p = c->encode(at::randn({4, 6}), ctx);
  Payload cut = p;
  cut.body = p.body.narrow(0, 0, p.body.numel() - 1);
  EXPECT_ERROR_CONTAINS(c->decode(cut, ctx), "quant: payload body truncated");
  Payload extra = p;
  extra.body = at::cat({p.body, at::zeros({1}, at::kByte)});
  EXPECT_ERROR_CONTAINS(c->decode(extra, ctx), "quant: payload body length mismatch");
  Payload bits = p;
  bits.params[0] = 9;
  EXPECT_ERROR_CONTAINS(c->decode(bits, ctx), "corrupt payload: bits=9");
  Payload dim = p;
  dim.params[4] = 2;
  EXPECT_ERROR_CONTAINS(c->decode(dim, ctx), "channel dim 2 for 2 dims");
  Payload type = p;
  type.params[6] = 3;
  EXPECT_ERROR_CONTAINS(c->decode(type, ctx), "value type code 3");
  EXPECT_ERROR_CONTAINS(c->decode(parse_compressor("fp16")->encode(at::randn({4, 6}), ctx), ctx), "packed by 'fp16'");
}

}  // namespace
}  // namespace tl
