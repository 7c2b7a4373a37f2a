// The fused CUDA quantisation kernels (compression/cuda/). On every machine: their per-group
// logic (quant_logic.h), run on the host by HostEmulationGuard, gives the same payload bytes as
// the CPU fast path and the portable ATen path, bit for bit, and decodes to the same values; the
// fused error-feedback residual equals x - decode(payload) and keeps ef(quant)'s state identical.
// On a GPU (label gpu): the kernels themselves give those bytes and residuals too, and
// TAPELINE_CUDA_KERNELS=0's ATen path agrees with them.
#include "compression/cuda/quant_cuda.h"

#include <limits>

#include "autograd/cuda_plugin.h"
#include "compression/codecs/common.h"
#include "compression/cuda/quant_logic.h"
#include "compression/stateful/error_feedback.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::same_payload;

// Specs covering every scale grouping, both modes, the wire types and bit widths 1..8.
std::vector<std::string> quant_specs(int64_t bits, bool multi_dim) {
  const std::string b = std::to_string(bits);
  std::vector<std::string> specs = {"quant(" + b + ")", "quant(" + b + ", mode=minmax, scales=bf16)",
                                    "quant(" + b + ", scale=block, block=64, scales=fp32)",
                                    "quant(" + b + ", scale=block, block=7, mode=minmax)"};
  if (multi_dim) {
    specs.push_back("quant(" + b + ", scale=channel)");
    specs.push_back("quant(" + b + ", scale=channel, dim=0, mode=minmax, scales=fp32)");
  }
  return specs;
}

// Shapes: n a multiple of 8 and not, one element, a channel run of 1 (last dim), more than one
// 8192-element tile of the CPU path.
std::vector<std::vector<int64_t>> quant_shapes() {
  return {{5, 3, 7, 9}, {2, 50, 33}, {1}, {1000}, {3, 7001}, {16, 8}};
}

TEST(QuantKernelLogic, PacksCodesLsbFirstInGroupsOfEight) {
  // max-abs with a = 1 and p = 4 (bits = 3): x = k / 4 - 1 has code k exactly.
  std::vector<float> x(11);
  for (int k = 0; k < 11; ++k) x[k] = static_cast<float>(k % 8) / 4.0f - 1.0f;
  const float a = 1.0f;
  codec::QuantGeometry g{11, 11, 1};
  codec::QuantParams q{3, false, false, 0, &a, &a};
  std::vector<uint8_t> out(5, 0xee);  // ceil(11 * 3 / 8) = 5 bytes
  for (int64_t grp = 0; grp < codec::gpu::pack_groups(g.n); ++grp)
    codec::gpu::quantise_pack_group(x.data(), grp, g, q, out.data());
  // Codes 0..7 then 0, 1, 2: bits j*3.. of the first 24-bit word hold j.
  uint32_t first = 0;
  for (uint32_t j = 0; j < 8; ++j) first |= j << (3 * j);
  EXPECT_EQ(out[0], first & 0xff);
  EXPECT_EQ(out[1], (first >> 8) & 0xff);
  EXPECT_EQ(out[2], (first >> 16) & 0xff);
  EXPECT_EQ(out[3], 0u | (1u << 3) | ((2u << 6) & 0xff));  // codes 0, 1 and the low 2 bits of 2
  EXPECT_EQ(out[4], 2u >> 2);                              // the high bit of code 2
  std::vector<float> back(11);
  const float step = 0.25f;
  codec::DequantParams d{3, false, &step, &step};
  for (int64_t grp = 0; grp < codec::gpu::pack_groups(g.n); ++grp)
    codec::gpu::unpack_dequantise_group(out.data(), grp, g, d, back.data());
  for (int k = 0; k < 11; ++k) EXPECT_EQ(back[k], x[k]) << "element " << k;
}

TEST(QuantKernelLogic, SamePayloadBytesAsCpuAndAtenPaths) {
  at::manual_seed(17);
  CodecContext ctx;
  int64_t checked = 0;
  for (const auto& shape : quant_shapes()) {
    at::Tensor x = at::randn(shape) * 2 + 0.25;
    for (int64_t bits = 1; bits <= 8; ++bits) {
      for (const auto& spec : quant_specs(bits, shape.size() > 1)) {
        auto c = parse_compressor(spec);
        const std::string where = spec + " shape " + c10::str(c10::IntArrayRef(shape));
        Payload fast = c->encode(x, ctx);
        Payload emulated, portable;
        at::Tensor y_emulated;
        {
          codec::gpu::HostEmulationGuard guard;
          emulated = c->encode(x, ctx);
          y_emulated = c->decode(fast, ctx);
        }
        {
          codec::PortableKernelsGuard guard;
          portable = c->encode(x, ctx);
        }
        EXPECT_TRUE(same_payload(emulated, fast)) << where << ": kernel logic vs CPU fast path";
        EXPECT_TRUE(same_payload(emulated, portable)) << where << ": kernel logic vs ATen path";
        at::Tensor y_fast = c->decode(fast, ctx);
        EXPECT_TRUE(at::equal(y_emulated, y_fast))
            << where << ": decoded values differ, max diff " << (y_emulated - y_fast).abs().max().item<float>();
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 8 * (4 * 6 + 2 * 4));
}

TEST(QuantKernelLogic, ScalesFromTheKernelsReductionsAreAminmaxs) {
  // Per-tensor scales come from partial minima and maxima over chunks, channel and block scales
  // from one reduction each (Note [scales in the kernels]): the same bytes as the CPU fast path for
  // zeros of either sign, a lone extreme in any chunk, lengths around the chunks' edges, and the
  // same refusal of a NaN on the host.
  at::manual_seed(23);
  CodecContext ctx;
  std::vector<at::Tensor> inputs = {at::full({40}, -0.0), at::zeros({3, 5}), at::randn({1001}), at::randn({2, 1500}),
                                    at::randn({2999}).relu(), -at::rand({64, 33}), at::randn({2, 3, 4, 5})};
  inputs.push_back(at::cat({at::zeros({7}), at::full({9}, -0.0)}));
  at::Tensor spike = at::randn({3000}) * 0.01;
  spike[2998] = -40;  // the extreme in the last chunk
  inputs.push_back(spike);
  for (const at::Tensor& x : inputs) {
    for (const char* spec : {"quant(4)", "quant(3, mode=minmax)", "quant(8, scales=bf16)",
                             "quant(2, mode=minmax, scales=fp32)", "quant(4, scale=block, block=128)",
                             "quant(5, scale=block, block=33, mode=minmax)", "quant(4, scale=channel)",
                             "quant(3, scale=channel, dim=0, mode=minmax, scales=fp32)"}) {
      if (x.dim() < 2 && std::string(spec).find("channel") != std::string::npos) continue;
      auto c = parse_compressor(spec);
      const std::string where = std::string(spec) + " shape " + c10::str(x.sizes());
      Payload fast = c->encode(x, ctx), emulated;
      at::Tensor y;
      {
        codec::gpu::HostEmulationGuard guard;
        emulated = c->encode(x, ctx);
        y = c->decode(emulated, ctx);
      }
      EXPECT_TRUE(same_payload(emulated, fast)) << where;
      EXPECT_TRUE(at::equal(y, c->decode(fast, ctx))) << where;
    }
  }
  at::Tensor nan = at::randn({100});
  nan[57] = std::numeric_limits<float>::quiet_NaN();
  auto c = parse_compressor("quant(4)");
  EXPECT_ERROR_CONTAINS(c->encode(nan, ctx), "a scale is not finite");
  codec::gpu::HostEmulationGuard guard;
  EXPECT_ERROR_CONTAINS(c->encode(nan, ctx), "a scale is not finite");
}

TEST(QuantKernelLogic, StochasticRoundingSameBytesAsCpuFastPath) {
  // The kernels draw from the CPU fast path's counter hash (the ATen path uses at::rand).
  at::manual_seed(18);
  CodecContext ctx;
  at::Tensor x = at::randn({4, 3001});
  for (int64_t bits : {2, 3, 4, 8}) {
    for (const char* rest : {"", ", mode=minmax", ", scale=channel, dim=0"}) {
      const std::string spec = "quant(" + std::to_string(bits) + ", round=stochastic, seed=9" + rest + ")";
      auto a = parse_compressor(spec), b = parse_compressor(spec);  // the same per-call seeds
      for (int call = 0; call < 2; ++call) {
        Payload fast = a->encode(x, ctx);
        codec::gpu::HostEmulationGuard guard;
        Payload emulated = b->encode(x, ctx);
        EXPECT_TRUE(same_payload(emulated, fast)) << spec << ", call " << call;
      }
    }
  }
}

TEST(QuantKernelLogic, FusedResidualIsXMinusDecodedPayload) {
  at::manual_seed(20);
  CodecContext ctx;
  at::Tensor x = at::randn({6, 333}) * 3;  // (B, D)
  for (const char* spec : {"quant(2)", "quant(4, scale=channel, mode=minmax, scales=fp32)",
                           "quant(3, scale=block, block=100, round=stochastic, seed=3)"}) {
    auto fused = parse_compressor(spec), plain = parse_compressor(spec);
    at::Tensor r;
    Payload p;
    {
      codec::gpu::HostEmulationGuard guard;
      p = fused->encode_with_residual(x, ctx, &r);
    }
    ASSERT_TRUE(r.defined()) << spec << ": the fused path did not run";
    EXPECT_TRUE(same_payload(p, plain->encode(x, ctx))) << spec;
    at::Tensor want = x - plain->decode(p, ctx);
    EXPECT_TRUE(at::equal(r, want)) << spec << ": max diff " << (r - want).abs().max().item<float>();
    at::Tensor none;
    plain->encode_with_residual(x, ctx, &none);  // no fused kernels on the CPU fast path
    EXPECT_FALSE(none.defined()) << spec;
  }
}

TEST(QuantKernelLogic, ErrorFeedbackStateSameAsDecodePath) {
  // ef(quant) keeps the same residual, step after step, whether the residual comes from the fused
  // kernels' logic or from decoding the payload (CPU fast path; ATen path for nearest rounding).
  at::manual_seed(21);
  CodecContext ctx;
  for (const char* spec : {"ef(quant(2))", "ef(quant(4, scale=channel, mode=minmax))",
                           "ef(quant(3, scale=block, block=100, round=stochastic, seed=3))"}) {
    const bool stochastic = std::string(spec).find("stochastic") != std::string::npos;
    auto fast = std::dynamic_pointer_cast<ErrorFeedback>(parse_compressor(spec));
    auto fused = std::dynamic_pointer_cast<ErrorFeedback>(parse_compressor(spec));
    auto portable = std::dynamic_pointer_cast<ErrorFeedback>(parse_compressor(spec));
    ASSERT_TRUE(fast && fused && portable) << spec;
    for (int step = 0; step < 4; ++step) {
      at::Tensor x = at::randn({6, 333});
      const std::string where = std::string(spec) + ", step " + std::to_string(step);
      Payload pf = fast->encode(x, ctx);
      Payload pe;
      {
        codec::gpu::HostEmulationGuard guard;
        pe = fused->encode(x, ctx);
      }
      EXPECT_TRUE(same_payload(pe, pf)) << where;
      at::Tensor e = fast->residual(x, ctx);
      EXPECT_TRUE(at::equal(fused->residual(x, ctx), e)) << where;
      EXPECT_GT(e.abs().max().item<float>(), 0.0f) << where << ": no residual at all";
      if (!stochastic) {
        codec::PortableKernelsGuard guard;
        EXPECT_TRUE(same_payload(portable->encode(x, ctx), pf)) << where << " (ATen path)";
        EXPECT_TRUE(at::equal(portable->residual(x, ctx), e)) << where << " (ATen path)";
      }
    }
  }
}

TEST(QuantKernelLogic, KernelsFollowTheBuildAndTheEnvironment) {
  const char* env = std::getenv("TAPELINE_CUDA_KERNELS");
  const bool env_on = env == nullptr || std::string(env) != "0";
  // The kernels are in libtl_cuda.so, loaded where there is a GPU (Note [CUDA as a plugin]).
  EXPECT_EQ(codec::gpu::kernels_enabled(), codec::gpu::kernels_built() && env_on && cuda_plugin_loaded());
  EXPECT_FALSE(codec::use_cuda_kernel(at::zeros({8})));  // a CPU tensor never takes them
  if (!codec::gpu::kernels_built()) {
    at::Tensor x = at::zeros({8});
    codec::QuantGeometry g{8, 8, 1};
    codec::QuantParams q{4, false, false, 0, nullptr, nullptr};
    EXPECT_ERROR_CONTAINS(codec::gpu::quantise_pack_cuda(0, x.data_ptr<float>(), g, q, nullptr),
                          "this build of tapeline has no CUDA kernels");
  }
}

TEST(QuantGpu, KernelPayloadsEqualCpuBytes) {
  std::string why;
  if (testing::skip_without_cuda_kernels(&why)) GTEST_SKIP() << why;
  at::manual_seed(19);
  for (const auto& shape : quant_shapes()) {
    at::Tensor x = at::randn(shape);
    for (int64_t bits = 1; bits <= 8; ++bits) {
      for (const auto& spec : quant_specs(bits, shape.size() > 1)) {
        auto c = parse_compressor(spec);
        testing::expect_cuda_payload_is_cpus(c, c, c, x, spec + " shape " + c10::str(c10::IntArrayRef(shape)));
      }
    }
  }
}

TEST(QuantGpu, LargeTensorsEqualCpuBytes) {
  // Enough elements that the per-tensor scale is reduced from a full grid of partials, and every
  // CUDA block of the packing kernel strides over several groups (Note [scales in the kernels]).
  std::string why;
  if (testing::skip_without_cuda_kernels(&why)) GTEST_SKIP() << why;
  at::manual_seed(24);
  at::Tensor x = at::randn({64, 65537});
  x[31][4097] = 57;  // the extreme, in one partial only
  for (const char* spec : {"quant(4)", "quant(8, scales=bf16)", "quant(3, mode=minmax)",
                           "quant(4, scale=block, block=128)", "quant(4, scale=channel)",
                           "quant(4, scale=channel, dim=0, mode=minmax)"}) {
    auto c = parse_compressor(spec);
    testing::expect_cuda_payload_is_cpus(c, c, c, x, spec);
  }
  // Stochastic rounding: the kernels draw the CPU fast path's stream (two codecs, the same seeds).
  CodecContext ctx;
  auto a = parse_compressor("quant(2, round=stochastic, seed=5)"), b = parse_compressor("quant(2, round=stochastic, seed=5)");
  EXPECT_TRUE(same_payload(b->encode(x.cuda(), ctx), a->encode(x, ctx)));
}

TEST(QuantGpu, ErrorFeedbackOnTheDeviceEqualsCpu) {
  std::string why;
  if (testing::skip_without_cuda_kernels(&why)) GTEST_SKIP() << why;
  CodecContext ctx;
  auto cpu = std::dynamic_pointer_cast<ErrorFeedback>(parse_compressor("ef(quant(4, scale=channel))"));
  auto gpu = std::dynamic_pointer_cast<ErrorFeedback>(parse_compressor("ef(quant(4, scale=channel))"));
  for (int step = 0; step < 4; ++step) {
    at::Tensor x = at::randn({6, 333});
    EXPECT_TRUE(same_payload(gpu->encode(x.cuda(), ctx), cpu->encode(x, ctx))) << "step " << step;
    EXPECT_TRUE(at::equal(gpu->residual(x.cuda(), ctx).cpu(), cpu->residual(x, ctx))) << "step " << step;
  }
}

TEST(QuantGpu, StochasticKernelEqualsCpuFastPath) {
  std::string why;
  if (testing::skip_without_cuda_kernels(&why)) GTEST_SKIP() << why;
  CodecContext ctx;
  at::Tensor x = at::randn({4, 3001});
  auto a = parse_compressor("quant(3, round=stochastic, seed=9)"),
       b = parse_compressor("quant(3, round=stochastic, seed=9)");
  EXPECT_TRUE(same_payload(b->encode(x.cuda(), ctx), a->encode(x, ctx)));
}

}  // namespace
}  // namespace tl
