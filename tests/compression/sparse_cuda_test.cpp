// The fused CUDA kernels of sparse packing (compression/cuda/sparse_*). On every machine: their
// logic (sparse_logic.h), run on the host by HostEmulationGuard, writes the payload bytes of the
// CPU fast path and of the portable ATen path, bit for bit, for TopK, RandK and threshold over
// shapes, k, scopes, wire types and index formats, and decodes to the same values. On a GPU
// (label gpu): the kernels themselves write those bytes.
#include "compression/cuda/sparse_cuda.h"

#include <cmath>
#include <limits>

#include "compression/codecs/common.h"
#include "compression/codecs/sparse_index.h"
#include "compression/cuda/sparse_logic.h"
#include "compression/cuda/topk_cuda.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using codec::gpu::SparseLayout;
using codec::gpu::WireType;
using testing::same_payload;

// The bits of a (n) 2-byte tensor, as int32 (the comparisons print the first difference).
at::Tensor bits16(const at::Tensor& t) { return t.contiguous().view(at::kShort).to(at::kInt).bitwise_and(0xffff); }

// Float32 values whose casts are interesting: random bit patterns over every exponent (no NaN
// payloads: ATen's own CPU casts disagree on those), and the edges of fp16 and bf16.
at::Tensor cast_probes() {
  at::Tensor raw = at::randint(0, std::numeric_limits<int32_t>::max(), {200000}, at::kInt);  // (n)
  raw = raw.bitwise_xor(at::randint(0, 2, {200000}, at::kInt) * std::numeric_limits<int32_t>::min());
  at::Tensor f = raw.view(at::kFloat);
  f = at::where(at::isnan(f), at::zeros_like(f), f);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> edges = {0.0f,
                              -0.0f,
                              1.0f,
                              -1.0f,
                              65504.0f,
                              65505.0f,
                              65519.996f,
                              65520.0f,
                              -65520.0f,
                              1e9f,
                              inf,
                              -inf,
                              std::ldexp(1.0f, -24),
                              std::ldexp(1.0f, -25),
                              std::ldexp(1.5f, -25),
                              std::ldexp(1.0f, -26),
                              std::ldexp(1.0f, -14),
                              std::ldexp(1023.5f, -24),
                              std::ldexp(2047.5f, -25),
                              1.00048828125f,
                              1.000244140625f,
                              std::numeric_limits<float>::min(),
                              std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::max(),
                              3.3895314e38f,
                              1.0039062f,
                              1.0019531f};
  for (int e = -30; e <= 17; ++e)
    for (float m : {1.0f, 1.0004883f, 1.0009766f, 1.5f, 1.9995117f, 1.9997559f}) edges.push_back(std::ldexp(m, e));
  return at::cat({f, at::tensor(edges), -at::tensor(edges)});
}

TEST(SparseKernelLogic, WireCastsAreAtensBitForBit) {
  at::manual_seed(31);
  at::Tensor f = cast_probes();  // (n) float32
  const float* fp = f.data_ptr<float>();
  at::Tensor h = at::empty({f.numel()}, at::kShort), b = at::empty({f.numel()}, at::kShort);
  for (int64_t i = 0; i < f.numel(); ++i) {
    h[i] = static_cast<int16_t>(codec::gpu::half_bits(fp[i]));
    b[i] = static_cast<int16_t>(codec::gpu::bf16_bits(fp[i]));
  }
  at::Tensor want_h = bits16(f.to(at::kHalf)), want_b = bits16(f.to(at::kBFloat16));
  at::Tensor got_h = h.to(at::kInt).bitwise_and(0xffff), got_b = b.to(at::kInt).bitwise_and(0xffff);
  at::Tensor bad_h = (got_h != want_h).nonzero(), bad_b = (got_b != want_b).nonzero();
  EXPECT_EQ(bad_h.numel(), 0) << "fp16: " << bad_h.numel() << " differ, first "
                              << fp[bad_h.numel() ? bad_h[0].item<int64_t>() : 0];
  EXPECT_EQ(bad_b.numel(), 0) << "bf16: " << bad_b.numel() << " differ, first "
                              << fp[bad_b.numel() ? bad_b[0].item<int64_t>() : 0];
  // NaN: c10's rules (0x7e00 with the sign for fp16, 0x7fc0 for bf16).
  EXPECT_EQ(codec::gpu::half_bits(std::nanf("")) & 0x7fff, 0x7e00);
  EXPECT_EQ(codec::gpu::bf16_bits(-std::nanf("")), 0x7fc0);

  // Every 16-bit pattern back to float (NaNs aside): the exact widening casts.
  at::Tensor all = at::arange(0, 65536, at::kInt).to(at::kShort);  // (65536)
  at::Tensor from_h = all.view(at::kHalf).to(at::kFloat), from_b = all.view(at::kBFloat16).to(at::kFloat);
  int64_t differ = 0;
  for (int64_t v = 0; v < 65536; ++v) {
    const float eh = from_h[v].item<float>(), eb = from_b[v].item<float>();
    const float gh = codec::gpu::half_to_float(static_cast<uint16_t>(v)),
                gb = codec::gpu::bf16_to_float(static_cast<uint16_t>(v));
    if (!std::isnan(eh))
      differ += codec::gpu::float_bits(gh) != codec::gpu::float_bits(eh);
    else
      differ += !std::isnan(gh);
    if (!std::isnan(eb))
      differ += codec::gpu::float_bits(gb) != codec::gpu::float_bits(eb);
    else
      differ += !std::isnan(gb);
  }
  EXPECT_EQ(differ, 0);
}

TEST(SparseKernelLogic, PacksIndicesAndValuesByHand) {
  // x = 0, 1.5, 3, ..., 13.5; kept: 1, 4, 9 (values 1.5, 6, 13.5).
  std::vector<float> x(10);
  for (int i = 0; i < 10; ++i) x[i] = 1.5f * i;
  const std::vector<int64_t> idx = {1, 4, 9};
  const SparseLayout as_int{3, 10, false, 4, 12, WireType::kF32};
  std::vector<uint8_t> body(12 + 12, 0xee);
  codec::gpu::sparse_pack_host(x.data(), idx.data(), as_int, body.data());
  const std::vector<uint8_t> want_int = {1, 0, 0, 0, 4, 0, 0, 0, 9, 0, 0, 0};
  EXPECT_EQ(std::vector<uint8_t>(body.begin(), body.begin() + 12), want_int);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(codec::gpu::load_wire(body.data() + 12 + 4 * i, WireType::kF32), x[idx[i]]);

  // Bitmap of 10 elements (2 bytes, LSB first: bits 1, 4 | bit 9 - 8), bf16 values right after
  // it, unaligned for a 4-byte type.
  const SparseLayout as_bitmap{3, 10, true, 4, 2, WireType::kBF16};
  std::vector<uint8_t> bm(2 + 6, 0xee);
  codec::gpu::sparse_pack_host(x.data(), idx.data(), as_bitmap, bm.data());
  EXPECT_EQ(bm[0], 0x12);
  EXPECT_EQ(bm[1], 0x02);
  EXPECT_EQ(bm[2] | bm[3] << 8, codec::gpu::bf16_bits(1.5f));
  std::vector<int64_t> ranks(1);  // one chunk of 2 bytes: 3 bits set (inclusive prefix sum: itself)
  codec::gpu::bitmap_counts_host(bm.data(), 2, ranks.data());
  EXPECT_EQ(ranks, (std::vector<int64_t>{3}));
  std::vector<float> back(10, -1.0f);
  codec::gpu::sparse_unpack_host(bm.data(), ranks.data(), as_bitmap, back.data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(back[i], (i == 1 || i == 4 || i == 9) ? x[i] : 0.0f) << "element " << i;
  std::vector<float> back_int(10, 0.0f);
  codec::gpu::sparse_unpack_host(body.data(), nullptr, as_int, back_int.data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(back_int[i], (i == 1 || i == 4 || i == 9) ? x[i] : 0.0f) << "element " << i;
}

// Inputs: shapes with a partial last bitmap byte, one element, rows of one element; ties
// (small integers), a non-contiguous view, and an empty tensor.
std::vector<std::pair<std::string, at::Tensor>> sparse_inputs() {
  at::manual_seed(33);
  return {{"randn (6, 333)", at::randn({6, 333})},
          {"randn (1000)", at::randn({1000}) * 100},
          {"randn (3, 5, 7)", at::randn({3, 5, 7})},
          {"one element", at::randn({1})},
          {"rows of one (9, 1)", at::randn({9, 1})},
          {"ties (4, 257)", at::randint(-3, 4, {4, 257}).to(at::kFloat)},
          {"all equal (2, 64)", at::ones({2, 64})},
          {"transposed (40, 17)", at::randn({17, 40}).t()},
          {"strided (5, 99)", at::randn({5, 198}).slice(1, 0, 198, 2)},
          {"huge values (3, 100)", at::randn({3, 100}) * 1e6},
          {"empty (0, 4)", at::zeros({0, 4})}};
}

std::vector<std::string> sparse_specs() {
  std::vector<std::string> specs;
  for (const char* k : {"topk(0.1", "topk(1.0", "topk(1", "topk(0.5, scope=global", "randk(0.3, seed=4"})
    for (const char* values : {"fp32", "fp16", "bf16"})
      for (const char* index : {"int32", "bitmap", "auto"})
        specs.push_back(std::string(k) + ", values=" + values + ", index=" + index + ")");
  specs.push_back("topk(0.2, index=delta)");  // the ATen/CPU path (Note [fused sparse packing])
  specs.push_back("threshold(0.5, index=int32)");
  specs.push_back("threshold(0.5, values=bf16, index=bitmap)");
  specs.push_back("threshold(1000, values=fp16)");  // nothing kept on most inputs
  return specs;
}

TEST(SparseKernelLogic, SamePayloadBytesAsCpuAndAtenPaths) {
  CodecContext ctx;
  int64_t checked = 0, fused = 0;
  for (const auto& [name, x] : sparse_inputs()) {
    for (const auto& spec : sparse_specs()) {
      const std::string where = spec + " on " + name;
      if (x.numel() == 0 && spec.rfind("topk(1,", 0) == 0) continue;
      // Three codecs: RandK draws from each one's own generator, in step.
      auto fast_c = parse_compressor(spec), emu_c = parse_compressor(spec), port_c = parse_compressor(spec);
      Payload fast = fast_c->encode(x, ctx);
      Payload emulated, portable;
      at::Tensor y_emulated;
      const int64_t runs = codec::gpu::sparse_host_runs();
      {
        codec::gpu::HostEmulationGuard guard;
        emulated = emu_c->encode(x, ctx);
        y_emulated = emu_c->decode(fast, ctx);
      }
      // Delta indices (forced, or auto's pick on the host) stay on the CPU path; the rest is fused.
      const bool delta = emulated.params.size() == 7 && emulated.params[5] == int64_t(codec::IndexFormat::kDelta);
      EXPECT_EQ(codec::gpu::sparse_host_runs() - runs, delta ? 0 : 2)
          << where << ": encode + decode on the kernels' logic";
      fused += !delta;
      {
        codec::PortableKernelsGuard guard;
        portable = port_c->encode(x, ctx);
      }
      EXPECT_TRUE(same_payload(emulated, fast)) << where << ": kernel logic vs CPU fast path";
      EXPECT_TRUE(same_payload(emulated, portable)) << where << ": kernel logic vs ATen path";
      at::Tensor y_fast = fast_c->decode(fast, ctx);
      EXPECT_TRUE(y_emulated.sizes().equals(x.sizes())) << where;
      EXPECT_TRUE(at::equal(y_emulated, y_fast)) << where << ": decoded values differ";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 11 * 49 - 9);  // the 9 topk(1, ...) specs skip the empty tensor
  EXPECT_GT(fused, 400);
}

TEST(SparseKernelLogic, RoundTripKeepsTheSelectedValues) {
  // fp32 values: decode(encode(x)) is x on the kept entries and 0 elsewhere, k per row.
  at::manual_seed(34);
  CodecContext ctx;
  at::Tensor x = at::randn({5, 301});  // (B, D)
  for (const char* spec : {"topk(0.1, values=fp32, index=int32)", "topk(0.1, values=fp32, index=bitmap)"}) {
    auto c = parse_compressor(spec);
    codec::gpu::HostEmulationGuard guard;
    at::Tensor y = c->decode(c->encode(x, ctx), ctx);
    at::Tensor kept = y != 0;
    EXPECT_TRUE(at::equal(kept.sum(1), at::full({5}, 30, at::kLong))) << spec;
    EXPECT_TRUE(at::equal(y.masked_select(kept), x.masked_select(kept))) << spec;
    // Every kept |x| is at least every dropped one in its row.
    at::Tensor a = x.abs();
    at::Tensor min_kept = at::where(kept, a, at::full_like(a, INFINITY)).amin(1);
    at::Tensor max_dropped = at::where(kept, at::zeros_like(a), a).amax(1);
    EXPECT_TRUE((min_kept >= max_dropped).all().item<bool>()) << spec;
  }
}

TEST(SparseKernelLogic, CorruptIndexIsNamedBeforeTheKernelsRun) {
  at::manual_seed(35);
  CodecContext ctx;
  auto c = parse_compressor("topk(0.1, index=bitmap)");
  Payload p = c->encode(at::randn({4, 100}), ctx);
  p.body = p.body.clone();
  p.body[0] = static_cast<uint8_t>(p.body[0].item<uint8_t>() ^ 1);  // one bit more or less
  codec::gpu::HostEmulationGuard guard;
  EXPECT_ERROR_CONTAINS(c->decode(p, ctx), "corrupt bitmap index");
  auto ci = parse_compressor("topk(0.1, index=int32)");
  Payload q = ci->encode(at::randn({4, 100}), ctx);
  q.body = q.body.clone();
  q.body[0] = 200;  // index 200 of a 400-element tensor would be fine; 200 + 256 * 255 is not
  q.body[1] = 255;
  EXPECT_ERROR_CONTAINS(ci->decode(q, ctx), "corrupt int index");
}

TEST(SparseKernelLogic, WithoutKernelsTheDeviceEntryPointsSayWhy) {
  if (codec::gpu::kernels_built()) GTEST_SKIP() << "this build has the CUDA kernels";
  const SparseLayout s{0, 8, false, 4, 0, WireType::kF32};
  EXPECT_ERROR_CONTAINS(codec::gpu::sparse_pack_cuda(0, nullptr, nullptr, s, nullptr),
                        "this build of tapeline has no CUDA kernels");
}

// Inputs of TopK's radix selection (Note [radix top-k on a device]): rows of several tiles with a
// partial last one, ties across tile edges, rows whose candidates are the whole row (all equal),
// NaN, infinities and zeros of both signs, rows of one element, and enough elements for many
// blocks. The values' magnitudes decide; their signs must not. Values go on the wire as fp32 (a
// NaN's cast to 16 bits is not ATen's on the CPU: cast_probes).
std::vector<std::pair<std::string, at::Tensor>> radix_inputs(int64_t scale) {
  at::manual_seed(36);
  at::Tensor specials = at::randn({3, 3 * codec::gpu::kTopkTile + 17});  // (B, D)
  specials.index_put_({0, at::indexing::Slice(0, 40)}, INFINITY);
  specials.index_put_({1, at::indexing::Slice(4090, 4100)}, -INFINITY);
  specials.index_put_({1, at::indexing::Slice(100, 105)}, NAN);
  specials.index_put_({2, at::indexing::Slice(0, 2000)}, 0.0f);
  specials.index_put_({2, at::indexing::Slice(2000, 9000)}, -0.0f);
  return {{"randn (3, 10000)", at::randn({3, 10000})},
          {"randn (" + std::to_string(scale) + ")", at::randn({scale})},
          {"ties (2, 9000)", at::randint(-3, 4, {2, 9000}).to(at::kFloat)},
          {"all equal (2, 5000)", at::full({2, 5000}, -2.5f)},
          {"one value apart (1, 8193)", at::cat({at::full({4096}, 1.0f), at::full({4097}, 1.0000001f)}).view({1, -1})},
          {"specials (3, 12305)", specials},
          {"rows of one (9, 1)", at::randn({9, 1})},
          {"many rows (" + std::to_string(scale / 4096) + ", 4096)", at::randn({scale / 4096, 4096})}};
}

std::vector<std::string> radix_specs() {
  return {"topk(0.1, values=fp32, index=int32)", "topk(1, values=fp32, index=int32)",
          "topk(1.0, values=fp32, index=bitmap)", "topk(0.5, scope=global, values=fp32, index=int32)",
          "topk(4097, values=fp32, index=int32)", "topk(0.01, scope=global, values=fp32, index=bitmap)"};
}

TEST(TopkKernelLogic, RadixSelectionKeepsTheCpuLoopsIndices) {
  CodecContext ctx;
  int64_t radix = 0;
  for (const auto& [name, x] : radix_inputs(60000)) {
    for (const auto& spec : radix_specs()) {
      const std::string where = spec + " on " + name;
      if (spec.rfind("topk(4097", 0) == 0 && x.size(-1) < 4097) continue;
      Payload fast = parse_compressor(spec)->encode(x, ctx), emulated;
      const int64_t runs = codec::gpu::topk_host_runs();
      {
        codec::gpu::HostEmulationGuard guard;
        emulated = parse_compressor(spec)->encode(x, ctx);
      }
      radix += codec::gpu::topk_host_runs() - runs;
      EXPECT_TRUE(same_payload(emulated, fast)) << where << ": radix selection vs CPU fast path";
    }
  }
  EXPECT_GE(radix, 40);  // of 46 cases: rows of one element with k = 0 do not select
}

TEST(TopkKernelLogic, FindsTheKthKeyDigitByDigit) {
  // Row of keys 1..10 (as floats 1.0..10.0), k = 3: t = key(8.0), two above it, need 1.
  std::vector<float> x(10);
  for (int i = 0; i < 10; ++i) x[i] = static_cast<float>(i + 1) * (i % 2 ? -1.0f : 1.0f);
  const codec::gpu::TopkShape s{1, 10, 3};
  ASSERT_TRUE(codec::gpu::topk_fits_radix(s));
  std::vector<uint8_t> zeroed(codec::gpu::topk_zeroed_bytes(s), 0), rest(codec::gpu::topk_rest_bytes(s));
  std::vector<int64_t> idx(3, -1);
  codec::gpu::topk_select_host(x.data(), s, zeroed.data(), rest.data(), idx.data());
  EXPECT_EQ(idx, (std::vector<int64_t>{7, 8, 9}));
  const codec::gpu::TopkBuffers b = codec::gpu::topk_buffers(s, zeroed.data(), rest.data());
  EXPECT_EQ(b.row[0].prefix, codec::gpu::topk_key(8.0f));
  EXPECT_EQ(b.row[0].mask, 0x7fffffffu);
  EXPECT_EQ(b.row[0].remaining, 1);
  // Ties: keys 5 5 5 5 with k = 2 keep the first two; with 7 in front, 7 and the first 5.
  std::vector<float> ties = {5, -5, 5, 5, 7};
  const codec::gpu::TopkShape st{1, 5, 2};
  std::vector<uint8_t> z2(codec::gpu::topk_zeroed_bytes(st), 0), r2(codec::gpu::topk_rest_bytes(st));
  std::vector<int64_t> i2(2, -1);
  codec::gpu::topk_select_host(ties.data(), st, z2.data(), r2.data(), i2.data());
  EXPECT_EQ(i2, (std::vector<int64_t>{0, 4}));
  EXPECT_FALSE(codec::gpu::topk_fits_radix({1, 10, 0}));             // nothing to select
  EXPECT_FALSE(codec::gpu::topk_fits_radix({1000000, 4, 1}));        // histograms 512x the data
  EXPECT_TRUE(codec::gpu::topk_fits_radix({100, 4, 1}));             // under the 1 MiB floor
}

TEST(SparseGpu, RadixSelectionOfLargeTensorsEqualsCpuBytes) {
  std::string why;
  if (testing::skip_without_cuda_kernels(&why)) GTEST_SKIP() << why;
  CodecContext ctx;
  for (const auto& [name, x] : radix_inputs(4 << 20)) {
    for (const auto& spec : radix_specs()) {
      if (spec.rfind("topk(4097", 0) == 0 && x.size(-1) < 4097) continue;
      // NaN: the ATen path's mask is not the CPU loop's there; the kernels' must be.
      EXPECT_TRUE(same_payload(parse_compressor(spec)->encode(x.cuda(), ctx), parse_compressor(spec)->encode(x, ctx)))
          << spec << " on " << name;
    }
  }
}

TEST(SparseGpu, KernelPayloadsEqualCpuBytes) {
  std::string why;
  if (testing::skip_without_cuda_kernels(&why)) GTEST_SKIP() << why;
  for (const auto& [name, x] : sparse_inputs()) {
    for (const auto& spec : sparse_specs()) {
      if (x.numel() == 0 && spec.rfind("topk(1,", 0) == 0) continue;
      const std::string where = spec + " on " + name;
      // On a device, index=auto picks the smaller of int32 and bitmap and never delta, whose size
      // depends on the data (Note [host synchronisation], payload.cpp); the CPU may pick delta. The
      // reference is then the CPU payload of the form the device picked.
      std::string cpu_spec = spec;
      if (const size_t at = spec.find("index=auto"); at != std::string::npos) {
        CodecContext ctx;
        const Payload probe = parse_compressor(spec)->encode(x.cuda(), ctx);
        ASSERT_EQ(probe.params.size(), 7u) << where;
        const codec::IndexFormat f = codec::index_format_from_param(probe.params[5], "test");
        EXPECT_NE(f, codec::IndexFormat::kDelta) << where;
        cpu_spec.replace(at, std::string("index=auto").size(), "index=" + codec::index_format_word(f));
      }
      testing::expect_cuda_payload_is_cpus(parse_compressor(cpu_spec), parse_compressor(spec), parse_compressor(spec), x,
                                           where);
    }
  }
}

}  // namespace
}  // namespace tl
