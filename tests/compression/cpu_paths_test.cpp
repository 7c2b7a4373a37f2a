// The CPU fast paths of issue 36 against the portable ATen path, on inputs that reach them:
// quantisation by a reciprocal near half-integers (Note [quotient by a reciprocal]), tensors of
// many tiles and threads' shares, grid codes of quantile, value sections written by one loop, and
// delta indices decoded in chunks (Note [delta index in parallel]), with odd sizes and corrupt
// streams.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "compression/codecs/hadamard.h"
#include "compression/codecs/inline_parallel.h"
#include "compression/codecs/lowrank_kernels.h"
#include "compression/codecs/quant_kernels.h"
#include "compression/codecs/sparse_index.h"
#include "compression/codecs/sparse_kernels.h"
#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/quant_logic.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using codec::IndexFormat;
using testing::same_payload;

// at::get_num_threads() set for a scope.
struct Threads {
  explicit Threads(int n) : before(at::get_num_threads()) { at::set_num_threads(n); }
  ~Threads() { at::set_num_threads(before); }
  int before;
};

// codec::task_bytes() set for a scope.
struct TaskBytes {
  explicit TaskBytes(int64_t bytes) : before(codec::set_task_bytes(bytes)) {}
  ~TaskBytes() { codec::set_task_bytes(before); }
  int64_t before;
};

// Payload of `spec` on the CPU path equals the portable path's, and decodes to the same values
// (x: float32).
void expect_paths_agree(const std::string& spec, const at::Tensor& x, const std::string& where) {
  CodecContext ctx;
  auto c = parse_compressor(spec);
  Payload fast = c->encode(x, ctx);
  at::Tensor y_fast = c->decode(fast, ctx);
  Payload portable;
  at::Tensor y_portable;
  {
    codec::PortableKernelsGuard g;
    auto cp = parse_compressor(spec);
    portable = cp->encode(x, ctx);
    y_portable = cp->decode(fast, ctx);
  }
  EXPECT_TRUE(same_payload(fast, portable)) << spec << " on " << where;
  // Bit for bit (a NaN included): the float32 outputs as int32.
  EXPECT_TRUE(at::equal(y_fast.contiguous().view(at::kInt), y_portable.contiguous().view(at::kInt)))
      << spec << " decoded on " << where;
}

// Values whose quotient x / a * 2^(bits-1) lies on, or one float step either side of, a
// half-integer: the cases where the product by the reciprocal could round the other way.
at::Tensor near_half_integers(int64_t n, int64_t bits) {
  const float p = static_cast<float>(int64_t(1) << (bits - 1));
  const float a = 1.0f + 1e-6f;  // the divisor of a max-abs scale of 1 (exact in fp16)
  at::Tensor k = at::randint(-static_cast<int64_t>(p), static_cast<int64_t>(p) - 1, {n}).to(at::kFloat);
  at::Tensor x = (k + 0.5f) / p * a;  // (n)
  at::Tensor step = at::randint(-2, 3, {n}).to(at::kFloat);
  x = at::nextafter(x, x + step.sign() * 1e30f);  // one step up or down, or none
  x = x.clamp(-1.0f, 1.0f);
  x[0] = 1.0f;  // the scale: max |x| = 1
  return x;
}

TEST(Quant, ReciprocalPathKeepsTheDivisionsBytes) {
  at::manual_seed(36);
  for (int64_t bits : {1, 4, 8}) {
    const std::string b = std::to_string(bits);
    at::Tensor x = near_half_integers(3 * 8192 + 77, bits);  // several tiles and a tail
    for (const std::string& spec : {"quant(" + b + ")", "quant(" + b + ", scale=block, block=100)"})
      expect_paths_agree(spec, x, "near half-integers");
    // Channel scales along the last dim: a divisor per element of a row.
    at::Tensor rows = at::cat({near_half_integers(2000, bits), near_half_integers(2000, bits)}).view({4, 1000});
    expect_paths_agree("quant(" + b + ", scale=channel)", rows, "(4, 1000) near half-integers");
  }
  // Random data of an odd size.
  at::Tensor r = at::randn({3, 40001});
  for (const char* spec : {"quant(8)", "quant(4)", "quant(2, scale=channel)", "quant(4, scale=block, block=128)"})
    expect_paths_agree(spec, r, "(3, 40001) normal");
}

// 16 MiB and a tail: many tiles, each thread's share ending inside a byte group.
TEST(Quant, LargeTensorsMatchThePortablePath) {
  at::manual_seed(37);
  at::Tensor x = at::randn({(int64_t(4) << 20) + 5});  // 16 MiB + 20 bytes of float32
  for (const char* spec : {"quant(8)", "quant(3, mode=minmax)", "quant(4, scale=block, block=256)", "quant(2)"})
    expect_paths_agree(spec, x, "4M + 5 elements");
  // 2-bit codes (unpacked by a table) with a tail of 1..3 codes in the last byte, 1 and 2 threads.
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    for (int64_t n : {int64_t(1), int64_t(3), int64_t(8193), int64_t(3 * 8192 + 6)})
      expect_paths_agree("quant(2, scale=block, block=7)", at::randn({n}), std::to_string(n) + " elements");
  }
  at::set_num_threads(threads);
}

// Note [block scales in one pass]: scales and codes by tiles of whole blocks equal the three
// passes (group_minmax_cpu, quant_scales_cpu, quantise_pack_cpu) byte for byte: blocks whose
// elements are not a multiple of 8 or of a tile (7, 100, 3000, 10000, 20000), both modes,
// stochastic rounding, the three wire types, NaN (skipped by its block's scale), zeros of either
// sign, on one thread and in tasks of a few KiB.
TEST(Quant, BlockScalesInOnePassEqualThreePasses) {
  at::manual_seed(39);
  const int64_t n = 30035;
  at::Tensor x = at::randn({n});  // (n)
  x.narrow(0, 200, 100).zero_();
  x.narrow(0, 250, 20).fill_(-0.0f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  x[5003] = std::numeric_limits<float>::quiet_NaN();
  const float* xp = x.data_ptr<float>();
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    TaskBytes small(t == 2 ? 4096 : codec::task_bytes());
    for (int64_t run : {int64_t(7), int64_t(100), int64_t(128), int64_t(3000), int64_t(10000), int64_t(20000)})
      for (int bits : {1, 3, 4, 8})
        for (bool minmax : {false, true})
          for (bool stochastic : {false, true})
            for (auto wire : {codec::gpu::WireType::kF16, codec::gpu::WireType::kBF16, codec::gpu::WireType::kF32}) {
              const std::string where = "run " + std::to_string(run) + ", " + std::to_string(bits) + " bits, " +
                                        (minmax ? "min-max" : "max-abs") + (stochastic ? ", stochastic" : "") +
                                        ", wire " + std::to_string(static_cast<int>(wire)) + ", " + std::to_string(t) +
                                        " thread(s)";
              const int64_t groups = (n + run - 1) / run;
              const codec::QuantGeometry g{n, run, groups};
              const codec::gpu::ScaleParams sp{bits, minmax, wire, groups};
              const int64_t wire_bytes = (minmax ? 2 : 1) * groups * codec::gpu::wire_size(wire);
              const int64_t code_bytes = (n * bits + 7) / 8;
              // the three passes
              std::vector<float> mn(groups), mx(groups), a1(groups), b1(groups), step1(groups), lo1(groups);
              std::vector<uint8_t> wire1(wire_bytes), codes1(code_bytes);
              codec::group_minmax_cpu(xp, g, mn.data(), mx.data());
              const bool finite1 = codec::quant_scales_cpu(mn.data(), mx.data(), sp, wire1.data(), a1.data(),
                                                           minmax ? b1.data() : a1.data(), step1.data(),
                                                           minmax ? lo1.data() : step1.data());
              const codec::QuantParams q1{bits, minmax, stochastic, 77, a1.data(), minmax ? b1.data() : a1.data()};
              codec::quantise_pack_cpu(xp, g, q1, codes1.data());
              // one pass
              std::vector<float> a2(groups), b2(groups), step2(groups), lo2(groups);
              std::vector<uint8_t> wire2(wire_bytes), codes2(code_bytes);
              const codec::QuantParams q2{bits, minmax, stochastic, 77, nullptr, nullptr};
              const bool finite2 = codec::block_quantise_cpu(xp, g, sp, q2, wire2.data(), a2.data(),
                                                             minmax ? b2.data() : a2.data(), step2.data(),
                                                             minmax ? lo2.data() : step2.data(), codes2.data());
              EXPECT_EQ(finite1, finite2) << where;
              EXPECT_EQ(wire1, wire2) << where;
              EXPECT_EQ(codes1, codes2) << where;
              EXPECT_EQ(std::memcmp(step1.data(), step2.data(), groups * sizeof(float)), 0) << where;
              if (minmax) {
                EXPECT_EQ(std::memcmp(lo1.data(), lo2.data(), groups * sizeof(float)), 0) << where;
              }
            }
  }
  at::set_num_threads(threads);
  // Through the codec: blocks and channels of dim 0 against the portable path.
  at::Tensor y = at::randn({5, 6007});  // (5, 6007)
  for (const char* spec : {"quant(4, scale=block, block=7)", "quant(8, scale=block, block=100)",
                           "quant(3, mode=minmax, scale=block, block=3000, scales=bf16)",
                           "quant(2, scale=block, block=10000, scales=fp32)", "quant(4, scale=channel, dim=0)",
                           "quant(1, mode=minmax, scale=channel, dim=0)"})
    expect_paths_agree(spec, y, "(5, 6007)");
}

// Note [channel min/max by columns]: per-column minima and maxima of rows, four rows a pass, in
// blocks of 2048 columns with a partial last one, NaN skipped, rows not a multiple of four.
TEST(Quant, ChannelMinMaxByColumnsSkipsNaN) {
  at::manual_seed(40);
  for (int64_t rows : {int64_t(1), int64_t(4), int64_t(7)}) {
    at::Tensor x = at::randn({rows, 2 * 2048 + 37});  // (rows, C)
    const int64_t C = x.size(1);
    x[rows - 1][5] = std::numeric_limits<float>::quiet_NaN();
    x[0][2048] = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    const at::Tensor want_mn = at::where(x.isnan(), at::full({}, inf), x).amin(0);    // (C)
    const at::Tensor want_mx = at::where(x.isnan(), at::full({}, -inf), x).amax(0);   // (C)
    at::Tensor mn = at::empty({C}), mx = at::empty({C});
    codec::group_minmax_cpu(x.data_ptr<float>(), codec::QuantGeometry{rows * C, 1, C}, mn.data_ptr<float>(),
                            mx.data_ptr<float>());
    EXPECT_TRUE(at::equal(mn, want_mn)) << rows << " rows";
    EXPECT_TRUE(at::equal(mx, want_mx)) << rows << " rows";
  }
}

TEST(TopK, LargeTensorsMatchThePortablePath) {
  at::manual_seed(38);
  at::Tensor x = at::randn({4, (int64_t(1) << 20) + 3});  // 16 MiB + 48 bytes
  for (const char* spec : {"topk(0.1)", "topk(0.01, scope=global)", "topk(0.05, index=int32)"})
    expect_paths_agree(spec, x, "(4, 2^20 + 3)");
}

// Codes of 5 to 8 bits: the grid lookup, 8 elements at a time with gathers where AVX2 is present,
// against at::bucketize (codes and decoded values; the mean codebook may differ in its last bit).
TEST(Quantile, GridCodesMatchBucketize) {
  at::manual_seed(41);
  at::Tensor x = at::cat({at::randn({100003}), at::rand({5000}) * 1e-3, at::full({3}, 0.0f)});
  x[7] = std::numeric_limits<float>::infinity();
  x[8] = -std::numeric_limits<float>::infinity();
  CodecContext ctx;
  for (const char* spec : {"quantile(8)", "quantile(6, centers=quantile)", "quantile(5)"}) {
    auto c = parse_compressor(spec);
    Payload fast = c->encode(x, ctx);
    Payload portable;
    {
      codec::PortableKernelsGuard g;
      portable = parse_compressor(spec)->encode(x, ctx);
    }
    const int64_t book = 4 * (int64_t(1) << fast.params[0]);
    ASSERT_EQ(fast.body.numel(), portable.body.numel()) << spec;
    EXPECT_TRUE(at::equal(fast.body.narrow(0, book, fast.body.numel() - book),
                          portable.body.narrow(0, book, portable.body.numel() - book)))
        << spec << ": codes";
  }
}

// Note [sums in fixed chunks]: a message of several chunks, a task a chunk on 2 threads, gets the
// payload of 1 thread, and the portable path's codes and (to rounding) mean codebook: every chunk's
// codes written and its sums counted once. (That the order of the sums does not depend on the
// threads is the chunks' construction: a last-bit difference of a double seldom reaches the
// float codebook, so a test would rarely see it.)
TEST(Quantile, SumsInFixedChunksMatchOneThreadAndThePortablePath) {
  at::manual_seed(45);
  const at::Tensor x = at::randn({3 * 64 * 8192 + 1001});  // three chunks and a tail
  CodecContext ctx;
  for (const char* spec : {"quantile(8)", "quantile(4)"}) {
    Payload one, two, portable;
    {
      const Threads t(1);
      one = parse_compressor(spec)->encode(x, ctx);
    }
    {
      const Threads t(2);
      const TaskBytes small(256);  // a task a chunk
      two = parse_compressor(spec)->encode(x, ctx);
    }
    {
      codec::PortableKernelsGuard g;
      portable = parse_compressor(spec)->encode(x, ctx);
    }
    EXPECT_TRUE(same_payload(one, two)) << spec;
    const int64_t book = 4 * (int64_t(1) << one.params[0]);
    ASSERT_EQ(one.body.numel(), portable.body.numel()) << spec;
    EXPECT_TRUE(at::equal(one.body.narrow(0, book, one.body.numel() - book),
                          portable.body.narrow(0, book, portable.body.numel() - book)))
        << spec << ": codes";
    EXPECT_TRUE(testing::all_close(one.body.narrow(0, 0, book).view(at::kFloat),
                                   portable.body.narrow(0, 0, book).view(at::kFloat), spec, 1e-6, 1e-7));
  }
}

// Codewords by the radix sort (Note [quantile codewords on the CPU]) equal at::quantile's bit for
// bit: 256 levels of a 65536-element sample (ranks that need more than float's 24 bits), odd sample
// sizes, ties, zeros of one sign, infinities; and where the answer would depend on at::sort's order
// of -0 and +0, or on a NaN, ATen's own. With 1 and 2 threads.
TEST(Quantile, RadixCodewordsEqualAtenQuantile) {
  at::manual_seed(42);
  const int threads = at::get_num_threads();
  auto words_of = [](const Payload& p) { return p.body.narrow(0, 0, 4 << p.params[0]).view(at::kFloat); };
  at::Tensor ties = at::randint(-3, 4, {70001}).to(at::kFloat);
  at::Tensor zeros = at::where(at::rand({50000}) < 0.4, at::zeros({50000}), at::randn({50000}));
  at::Tensor signed_zeros = zeros.clone();
  signed_zeros.narrow(0, 0, 25000).mul_(-1);  // -0 in the first half, +0 in the second
  at::Tensor infs = at::randn({4099}) * 1e30;
  infs[5] = std::numeric_limits<float>::infinity();
  infs[77] = -std::numeric_limits<float>::infinity();
  at::Tensor with_nan = at::randn({3001});
  with_nan[100] = std::numeric_limits<float>::quiet_NaN();
  // Few enough zeros for the buckets (Note [ranks by buckets]), some positions asked among them.
  at::Tensor few_zeros = at::randn({65536});
  few_zeros.narrow(0, 0, 300).zero_();
  few_zeros.narrow(0, 300, 300).zero_().mul_(-1);
  at::Tensor few_pos_zeros = few_zeros.abs();
  const std::vector<std::pair<std::string, at::Tensor>> inputs = {
      {"a few -0 and +0", few_zeros},
      {"a few +0", few_pos_zeros},
      {"uniform 2^20", at::rand({int64_t(1) << 20})},
      {"normal 2^18 + 13", at::randn({(int64_t(1) << 18) + 13})},
      {"cubed 65535", at::randn({65535}).pow(3)},
      {"ties", ties},
      {"zeros", zeros},
      {"-0 and +0", signed_zeros},
      {"infinities", infs},
      {"a NaN", with_nan},
      {"one element", at::full({1}, 2.5f)},
      {"two elements", at::tensor({3.0f, -1.0f})}};
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    for (const auto& [what, x] : inputs)
      for (int64_t bits : {1, 4, 8}) {
        const int64_t n = x.numel(), L = int64_t(1) << bits, stride = n > 65536 ? n / 65536 : 1;
        at::Tensor sample = stride > 1 ? x.slice(0, 0, 65536 * stride, stride) : x;
        at::Tensor probs = (at::arange(L, at::kFloat) + 0.5) / L;
        at::Tensor expect = at::quantile(sample, probs);
        CodecContext ctx;
        Payload p = parse_compressor("quantile(" + std::to_string(bits) + ", centers=quantile)")->encode(x, ctx);
        EXPECT_TRUE(at::equal(words_of(p).view(at::kInt), expect.view(at::kInt)))
            << what << ", bits " << bits << ", threads " << t;
        // The mean codebook and the codes: the portable path's (codes exactly, the means to the last
        // bit; with a NaN every codeword is NaN and the two paths code differently, as before).
        if (what == "a NaN") continue;
        {
          const std::string spec = "quantile(" + std::to_string(bits) + ")";
          auto c = parse_compressor(spec);
          Payload fast = c->encode(x, ctx);
          Payload portable;
          {
            codec::PortableKernelsGuard g;
            portable = parse_compressor(spec)->encode(x, ctx);
          }
          const int64_t book = 4 * L;
          ASSERT_EQ(fast.body.numel(), portable.body.numel());
          EXPECT_TRUE(at::equal(fast.body.narrow(0, book, fast.body.numel() - book),
                                portable.body.narrow(0, book, portable.body.numel() - book)))
              << spec << " on " << what << ": codes";
          EXPECT_TRUE(at::allclose(words_of(fast), words_of(portable), 1e-6, 1e-30))
              << spec << " on " << what << ": codebook";
        }
      }
  }
  at::set_num_threads(threads);
}

// Codes by the search in registers (Note [codes by a search in registers]; where AVX-512 is absent
// or off, AVX2's search up to 4 bits (Note [small codebooks by a search in registers]), the grid
// from 5; with neither, the counts) against at::bucketize (the portable path): values exactly on the
// midpoints and one float step either side, ties, a constant tensor, infinities, and lengths that
// end inside a vector, for 1 to 8 bits, on 1 and 2 threads; and the decoding lookup.
TEST(Quantile, CodesOnTheMidpointsMatchBucketize) {
  at::manual_seed(43);
  const float inf = std::numeric_limits<float>::infinity();
  auto codes_agree = [](const std::string& spec, const at::Tensor& x, const std::string& what) {
    CodecContext ctx;
    Payload fast = parse_compressor(spec)->encode(x, ctx);
    Payload portable;
    {
      codec::PortableKernelsGuard g;
      portable = parse_compressor(spec)->encode(x, ctx);
    }
    const int64_t book = 4 * (int64_t(1) << fast.params[0]);
    ASSERT_EQ(fast.body.numel(), portable.body.numel()) << spec << " on " << what;
    if (spec.find("centers=quantile") != std::string::npos) {  // the codebook too (mean centers: to the last bit)
      EXPECT_TRUE(at::equal(fast.body.narrow(0, 0, book), portable.body.narrow(0, 0, book))) << spec << " on " << what;
    }
    EXPECT_TRUE(at::equal(fast.body.narrow(0, book, fast.body.numel() - book),
                          portable.body.narrow(0, book, portable.body.numel() - book)))
        << spec << " on " << what << ": codes";
    // Decoding: the lookup in registers (or by gathers) against index_select, bit for bit.
    const at::Tensor y = parse_compressor(spec)->decode(fast, ctx);
    at::Tensor y_portable;
    {
      codec::PortableKernelsGuard g;
      y_portable = parse_compressor(spec)->decode(fast, ctx);
    }
    EXPECT_TRUE(at::equal(y.view(at::kInt), y_portable.view(at::kInt))) << spec << " decoded on " << what;
  };
  const int threads = at::get_num_threads();
  for (int t : {1, 2})
    for (int loops : {0, 1, 2}) {  // AVX-512's search in registers; AVX2's up to 4 bits; the grid and the counts
      const bool avx512 = loops == 0;
      at::set_num_threads(t);
      codec::set_quantile_avx512(avx512);
      codec::set_quantile_avx2(loops < 2);
      for (int64_t bits = 1; bits <= 8; ++bits) {
        const std::string spec = "quantile(" + std::to_string(bits) + ", centers=quantile)";
        const int64_t L = int64_t(1) << bits, n = int64_t(1) << 18;
        // The sample is every 4th element; the others are set to the midpoints and their neighbours,
        // so the codebook (and its midpoints) stays the one computed here.
        at::Tensor x = at::randn({n});
        const at::Tensor words = at::quantile(x.slice(0, 0, n, 4), (at::arange(L, at::kFloat) + 0.5) / L);
        const at::Tensor mid = (words.narrow(0, 1, L - 1) + words.narrow(0, 0, L - 1)) / 2;  // (L - 1)
        const at::Tensor on = at::cat({mid, at::nextafter(mid, at::full_like(mid, inf)),
                                       at::nextafter(mid, at::full_like(mid, -inf))});  // (3 (L - 1))
        const at::Tensor pos = at::randint(0, n / 4, {on.numel()}) * 4 + at::randint(1, 4, {on.numel()});
        x.index_put_({pos}, on);
        x[5] = inf;
        x[6] = -inf;
        const std::string where = std::to_string(t) + " thread(s)" +
                                  (loops == 0   ? ""
                                   : loops == 1 ? ", no AVX-512"
                                                : ", no AVX-512 or AVX2");
        codes_agree(spec, x, "midpoints, " + where);
        for (int64_t tail : {1, 5, 15, 17})  // the sample unchanged: n / 65536 is still 4
          codes_agree(spec, at::cat({x, x.narrow(0, 7, tail)}), "midpoints and a tail of " + std::to_string(tail));
        for (int64_t m : {1, 2, 15, 16, 17, 33, 8193})
          codes_agree(spec, at::randint(-3, 4, {m}).to(at::kFloat), std::to_string(m) + " ties, " + where);
        codes_agree(spec, at::full({1000}, 1.5f), "a constant, " + where);
        codes_agree("quantile(" + std::to_string(bits) + ")", x, "midpoints (mean centers), " + where);
      }
    }
  codec::set_quantile_avx512(true);
  codec::set_quantile_avx2(true);
  at::set_num_threads(threads);
}

// Books of up to 16 entries are looked up in registers (Note [small books in registers]); 4-bit
// codes straight from their packed bytes. Against book[code], for every size of book, odd counts
// (a half byte at the end), and tasks of a few bytes (pieces that start mid-stream).
TEST(Quantile, SmallBooksInRegistersMatchTheTable) {
  at::manual_seed(44);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t size : {2, 5, 8, 9, 16}) {
    at::Tensor book = at::randn({size});
    book[0] = -inf;
    book[size - 1] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 1000, 4097}) {
      const at::Tensor codes = at::randint(0, size, {n}, at::kByte);
      const at::Tensor expect = book.index_select(0, codes.to(at::kLong));
      for (int64_t task : {int64_t(4) << 20, int64_t(24)}) {
        TaskBytes tb(task);
        Threads th(2);
        at::Tensor y = at::empty({n});
        codec::codebook_lookup_cpu(codes.data_ptr<uint8_t>(), n, book.data_ptr<float>(), size, y.data_ptr<float>());
        EXPECT_TRUE(at::equal(y.view(at::kInt), expect.view(at::kInt))) << size << " entries, " << n << " codes";
        if (size != 16) continue;
        const at::Tensor packed = pack_bits(codes, 4);
        at::Tensor z = at::full({n}, 7.0f);
        if (codec::packed4_lookup_cpu(packed.data_ptr<uint8_t>(), n, book.data_ptr<float>(), z.data_ptr<float>())) {
          EXPECT_TRUE(at::equal(z.view(at::kInt), expect.view(at::kInt)))
              << "packed, " << n << " codes, tasks of " << task;
        }
      }
    }
  }
}

// Value sections are written into the body by one loop (Note [values into the body on the CPU]):
// saturated and rounded as the ATen cast, and a section holding a NaN is made by ATen.
TEST(Sparse, ValueSectionsMatchTheAtenCast) {
  at::manual_seed(40);
  at::Tensor x = at::randn({3, 5000}) * 1e3;
  x[1][20] = std::numeric_limits<float>::infinity();
  x[2][30] = -1e6;
  x[2][31] = 3e-8;  // an fp16 subnormal
  at::Tensor with_nan = x.clone();
  with_nan[0][10] = std::numeric_limits<float>::quiet_NaN();
  for (const char* spec : {"topk(0.1)", "topk(0.1, values=bf16)", "topk(0.1, values=fp32)", "fp16", "bf16",
                           "threshold(1000, values=bf16)"})
    expect_paths_agree(spec, x, "finite and inf");
  // (A NaN is only selected alike by the casts: the portable TopK and threshold paths differ there.)
  for (const char* spec : {"fp16", "bf16"}) expect_paths_agree(spec, with_nan, "with a NaN");
}

// fp16 and bf16 sections decoded by one loop (Note [casts back on the CPU]) equal ATen's cast:
// several threads' shares and a tail that is not a multiple of 8, with infinities, fp16
// subnormals, values beyond fp16's range, and a NaN (ATen's path then).
TEST(Dense, CastsBackMatchTheAtenCast) {
  at::manual_seed(43);
  const int threads = at::get_num_threads();
  at::Tensor x = at::randn({(int64_t(1) << 19) + 13}) * 1e3;  // (2^19 + 13)
  x[3] = std::numeric_limits<float>::infinity();
  x[(int64_t(1) << 18) + 1] = -std::numeric_limits<float>::infinity();
  x[500] = 3e-8;  // an fp16 subnormal
  x[501] = -1e6;  // saturates in fp16
  x[-1] = 1e-40;  // a float32 subnormal
  at::Tensor with_nan = x.clone();
  with_nan[(int64_t(1) << 18) + 7] = std::numeric_limits<float>::quiet_NaN();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    for (const char* spec : {"fp16", "bf16", "cast(bf16)"}) {
      expect_paths_agree(spec, x, "2^19 + 13 values, threads " + std::to_string(t));
      expect_paths_agree(spec, with_nan, "with a NaN, threads " + std::to_string(t));
    }
  }
  at::set_num_threads(threads);
}

// Indices whose delta stream spans many chunks of kDeltaChunk bytes, with varints of 1 to 4 bytes
// crossing the chunk boundaries.
TEST(SparseIndex, ChunkedDeltaEqualsThePortablePath) {
  at::manual_seed(39);
  const int64_t universe = int64_t(1) << 40;
  at::Tensor gaps = at::where(at::rand({300000}) < 0.9, at::randint(0, 200, {300000}),
                              at::randint(0, 1 << 22, {300000}));  // (n) int64
  at::Tensor idx = (gaps + 1).cumsum(0) - 1;
  const int64_t n = idx.numel();
  ASSERT_LT(idx[-1].item<int64_t>(), universe);
  at::Tensor fast = codec::encode_index(idx, universe, IndexFormat::kDelta).bytes;
  at::Tensor portable;
  {
    codec::PortableKernelsGuard g;
    portable = codec::encode_index(idx, universe, IndexFormat::kDelta).bytes;
  }
  ASSERT_GT(fast.numel(), 4 << 16) << "the stream should span several chunks";
  EXPECT_TRUE(at::equal(fast, portable));
  EXPECT_TRUE(at::equal(codec::decode_index(IndexFormat::kDelta, fast, n, universe, "t"), idx));
  // Corruptions far into the stream: a terminator removed (one varint fewer, and a varint may grow
  // past 9 bytes), a continuation bit added, an index past the universe, bytes left over.
  auto next_terminator = [&](int64_t from) {
    return from + at::nonzero(fast.narrow(0, from, 1000).bitwise_and(0x80) == 0).view(-1)[0].item<int64_t>();
  };
  for (int64_t at_byte : {next_terminator(70000), next_terminator((3 << 16) - 1), fast.numel() - 1}) {
    at::Tensor merged = fast.clone();
    merged[at_byte] = merged[at_byte].bitwise_or(0x80);
    EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, merged, n, universe, "t"), "t: corrupt delta index");
  }
  at::Tensor split = fast.clone();
  const int64_t cont = at::nonzero(fast.narrow(0, 200000, 1000).bitwise_and(0x80)).view(-1)[0].item<int64_t>();
  split[200000 + cont] = split[200000 + cont].bitwise_and(0x7f);
  EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, split, n, universe, "t"), "t: corrupt delta index");
  const int64_t last = idx[-1].item<int64_t>();
  EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, fast, n, last, "t"), "t: corrupt delta index");
  at::Tensor extra = at::cat({fast, at::zeros({1}, at::kByte)});
  EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, extra, n, universe, "t"), "t: corrupt delta index");
  at::Tensor longer = at::cat(
      {fast.narrow(0, 0, 100000), at::full({12}, 0x81, at::kByte), fast.narrow(0, 100000, fast.numel() - 100000)});
  EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, longer, n, universe, "t"), "t: corrupt delta index");
}

// Delta streams of one-byte gaps (Note [one-byte gaps]): chunks of kDeltaChunk indices whose gaps
// all lie below 128 next to chunks with one gap of 128 (two bytes) or of 127 (the largest of one
// byte), a first gap of 127 and of 128, short streams; encoded and decoded on 1 and 2 threads
// against the portable path, and an index past the universe in a one-byte chunk refused.
TEST(SparseIndex, OneByteGapsEqualThePortablePath) {
  at::manual_seed(45);
  const int64_t chunk = int64_t(1) << 16;
  at::Tensor gaps = at::randint(0, 128, {5 * chunk + 77});  // (n) int64
  gaps[2 * chunk + 5] = 128;                                // chunk 2: one two-byte varint
  gaps[3 * chunk + 9] = 127;                                // chunk 3: still one byte each
  gaps[4 * chunk] = 300;                                    // the first gap of chunk 4, from chunk 3's last index
  std::vector<at::Tensor> cases = {gaps, gaps.narrow(0, 0, 1), gaps.narrow(0, 0, 2), at::full({3}, 127, at::kLong),
                                   at::tensor({int64_t(128), int64_t(0), int64_t(5)})};
  for (int t : {1, 2}) {
    Threads threads(t);
    for (const at::Tensor& g : cases) {
      at::Tensor idx = (g + 1).cumsum(0) - 1;
      const int64_t n = idx.numel(), universe = idx[-1].item<int64_t>() + 3;
      const std::string where = std::to_string(n) + " indices, " + std::to_string(t) + " threads";
      at::Tensor fast = codec::encode_index(idx, universe, IndexFormat::kDelta).bytes;
      at::Tensor portable;
      {
        codec::PortableKernelsGuard guard;
        portable = codec::encode_index(idx, universe, IndexFormat::kDelta).bytes;
      }
      EXPECT_TRUE(at::equal(fast, portable)) << where;
      EXPECT_TRUE(at::equal(codec::decode_index(IndexFormat::kDelta, fast, n, universe, "t"), idx)) << where;
      if (n > 100) {
        at::Tensor past = fast.clone();
        past[-1] = 127;  // the last gap, one byte: the last index lands past the universe
        EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, past, n, universe, "t"),
                              "t: corrupt delta index");
      }
    }
  }
}

// PowerSGD's tiled products (Note [thin products in tiles]) against at::mm, on shapes with partial
// tiles, several row chunks and column blocks, ranks that are not multiples of 4; bit for bit the
// same with 1 and 2 threads.
TEST(PowerSgd, ThinProductsMatchMatmulOnAnyThreadCount) {
  at::manual_seed(42);
  struct Shape {
    int64_t rows, cols, r;
  };
  for (const Shape& s : {Shape{64, 4096, 4}, Shape{3, 5000, 1}, Shape{1100, 1031, 5}, Shape{7, 2049, 16},
                         Shape{600, 3, 3}, Shape{1, 1, 1}}) {
    const std::string where = std::to_string(s.rows) + " x " + std::to_string(s.cols) + ", r=" + std::to_string(s.r);
    at::Tensor m = at::randn({s.rows, s.cols}), q = at::randn({s.cols, s.r}), p = at::randn({s.rows, s.r});
    at::Tensor got[2][3];
    for (int t : {1, 2}) {
      Threads threads(t);
      at::Tensor& mq = got[t - 1][0] = at::empty({s.rows, s.r});
      at::Tensor& mtp = got[t - 1][1] = at::empty({s.cols, s.r});
      at::Tensor& pqt = got[t - 1][2] = at::empty({s.rows, s.cols});
      codec::thin_mq_cpu(m.data_ptr<float>(), s.rows, s.cols, q.data_ptr<float>(), s.r, mq.data_ptr<float>());
      codec::thin_mtp_cpu(m.data_ptr<float>(), s.rows, s.cols, p.data_ptr<float>(), s.r, mtp.data_ptr<float>());
      codec::thin_pqt_cpu(p.data_ptr<float>(), s.rows, q.data_ptr<float>(), s.cols, s.r, pqt.data_ptr<float>());
    }
    const at::Tensor want[3] = {m.to(at::kDouble).mm(q.to(at::kDouble)), m.to(at::kDouble).t().mm(p.to(at::kDouble)),
                                p.to(at::kDouble).mm(q.to(at::kDouble).t())};
    const double sums[3] = {std::sqrt(double(s.cols)), std::sqrt(double(s.rows)), std::sqrt(double(s.r))};
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(at::equal(got[0][k], got[1][k])) << "product " << k << " on " << where << ": 1 and 2 threads";
      const double err = (got[0][k].to(at::kDouble) - want[k]).abs().max().item<double>();
      EXPECT_LT(err, 1e-5 * sums[k] * 8) << "product " << k << " on " << where;
    }
  }
}

// The AVX2 forms of the thin products (Note [thin products in registers], lowrank_kernels.cpp)
// against the plain loops (what the products run with the fast paths off), bit for bit: ranks
// with and without a multiple of 4, row counts not a multiple of 4, column tails, two threads.
TEST(PowerSgd, ThinProductsInRegistersMatchTheLoops) {
  at::manual_seed(43);
  struct Shape {
    int64_t rows, cols, r;
  };
  for (const Shape& s : {Shape{64, 4096, 4}, Shape{3, 5003, 1}, Shape{1100, 1031, 5}, Shape{7, 2049, 16},
                         Shape{613, 77, 8}, Shape{600, 3, 3}, Shape{1, 1, 1}}) {
    const std::string where = std::to_string(s.rows) + " x " + std::to_string(s.cols) + ", r=" + std::to_string(s.r);
    at::Tensor m = at::randn({s.rows, s.cols}), q = at::randn({s.cols, s.r}), p = at::randn({s.rows, s.r});
    m[0].zero_();  // signed zeros: -0 products into zero sums
    if (s.rows > 1) m[1].fill_(-0.0f);
    at::Tensor got[2][3];
    for (int fast : {1, 0}) {
      std::optional<codec::PortableKernelsGuard> loops;
      if (!fast) loops.emplace();
      Threads threads(2);
      at::Tensor& mq = got[fast][0] = at::empty({s.rows, s.r});
      at::Tensor& mtp = got[fast][1] = at::empty({s.cols, s.r});
      at::Tensor& pqt = got[fast][2] = at::empty({s.rows, s.cols});
      codec::thin_mq_cpu(m.data_ptr<float>(), s.rows, s.cols, q.data_ptr<float>(), s.r, mq.data_ptr<float>());
      codec::thin_mtp_cpu(m.data_ptr<float>(), s.rows, s.cols, p.data_ptr<float>(), s.r, mtp.data_ptr<float>());
      codec::thin_pqt_cpu(p.data_ptr<float>(), s.rows, q.data_ptr<float>(), s.cols, s.r, pqt.data_ptr<float>());
    }
    for (int k = 0; k < 3; ++k)
      EXPECT_TRUE(at::equal(got[1][k].view(at::kInt), got[0][k].view(at::kInt))) << "product " << k << " on " << where;
  }
}

// Note [QR of the thin factor]: LAPACK's Q (signs included) within float rounding, for tall,
// square, one-column and rank-deficient factors.
TEST(PowerSgd, ThinQrIsLapacksQ) {
  at::manual_seed(47);
  at::Tensor deficient = at::randn({50, 4});
  deficient.select(1, 2).copy_(deficient.select(1, 0) * 2);  // column 2 = 2 x column 0
  deficient.select(1, 3).zero_();
  for (const at::Tensor& a : {at::randn({64, 4}), at::randn({1000, 5}), at::randn({7, 7}), at::randn({9, 1}),
                              at::randn({3000, 16}), deficient}) {
    const std::string where = std::to_string(a.size(0)) + " x " + std::to_string(a.size(1));
    at::Tensor got = a.contiguous().clone();
    codec::thin_qr_cpu(got.data_ptr<float>(), a.size(0), a.size(1));
    const at::Tensor want = std::get<0>(at::linalg_qr(a.to(at::kDouble))).to(at::kFloat);
    if (a.data_ptr() == deficient.data_ptr()) {  // only the first two columns are determined
      EXPECT_TRUE(testing::all_close(got.narrow(1, 0, 2), want.narrow(1, 0, 2), where, 1e-5, 1e-4));
      continue;
    }
    EXPECT_TRUE(testing::all_close(got, want, where, 1e-5, 1e-4));
  }
}

// The codec on the CPU path against the ATen products: the same reconstruction within float
// rounding, and the same payload for 1 and 2 threads.
TEST(PowerSgd, CpuPathMatchesTheAtenProducts) {
  at::manual_seed(43);
  at::Tensor x = at::randn({64, 3 * 1024 + 17});
  CodecContext ctx;
  Payload one, two;
  {
    Threads t(1);
    one = parse_compressor("powersgd(4)")->encode(x, ctx);
  }
  {
    Threads t(2);
    two = parse_compressor("powersgd(4)")->encode(x, ctx);
  }
  EXPECT_TRUE(same_payload(one, two));
  auto fast = parse_compressor("powersgd(4)");
  at::Tensor y_fast = fast->decode(fast->encode(x, ctx), ctx);
  at::Tensor y_portable;
  {
    codec::PortableKernelsGuard g;
    auto c = parse_compressor("powersgd(4)");
    y_portable = c->decode(c->encode(x, ctx), ctx);
  }
  EXPECT_TRUE(testing::all_close(y_fast, y_portable, "powersgd(4) fast against ATen", 1e-4, 1e-4));
}

// TopK row by row (Note [top-k row by row]): rows of every length against the portable path, on 1
// and 2 threads: sampled rows, rows too short to sample, odd lengths, many ties at the cut (a
// few distinct magnitudes), k of 1 and of all but one.
TEST(TopK, RowByRowMatchesThePortablePath) {
  at::manual_seed(44);
  const at::Tensor inputs[] = {at::randn({64, 4096}), at::randn({33, 777}), at::randn({8, 300}),
                               at::randint(-3, 4, {16, 5000}).to(at::kFloat), at::randn({6, 70001})};
  for (int t : {1, 2}) {
    Threads threads(t);
    for (const at::Tensor& x : inputs) {
      const std::string where =
          std::to_string(x.size(0)) + " x " + std::to_string(x.size(1)) + ", " + std::to_string(t) + " threads";
      for (const std::string& spec :
           {std::string("topk(0.1)"), std::string("topk(0.01)"), std::string("topk(1)"),
            std::string("topk(0.1, index=int32)"), "topk(" + std::to_string(x.size(1) - 1) + ")"})
        expect_paths_agree(spec, x, where);
    }
  }
}

// Note [the previous row's floor]: rows whose magnitudes differ from the row before (100 times
// larger: more candidates than the floor allows, sampled again; 100 times smaller: fewer than k,
// sampled again), rows of zeros, rows of few distinct values (ties at the cut) between normal
// ones, against the portable path on 1 and 2 threads (two tasks, each starting from a sample); the
// same tensor as one row (scope=global: pieces, whose cut may fall on ties).
TEST(TopK, RowsUnlikeTheRowBeforeMatchThePortablePath) {
  at::manual_seed(46);
  at::Tensor x = at::randn({48, 11001});  // (48, 11001): two tasks of rows on 2 threads
  x[3].mul_(100);
  x[4].mul_(0.01);
  x[5].zero_();
  x[9].copy_(at::randint(-2, 3, {11001}).to(at::kFloat));
  x[10].mul_(1e-30);
  x[20].fill_(1.5f);
  x[21].mul_(1e4);
  x[22].mul_(1e-4);
  for (int t : {1, 2}) {
    Threads threads(t);
    // Over the whole tensor, cuts on row 20's 11001 ties at 1.5: some kept, and all.
    const int64_t above = (x.abs() > 1.5f).sum().item<int64_t>();
    for (const std::string& spec :
         {std::string("topk(0.1)"), std::string("topk(0.01)"), std::string("topk(0.5)"), std::string("topk(3)"),
          std::string("topk(0.1, scope=global)"), "topk(" + std::to_string(above + 100) + ", scope=global)",
          "topk(" + std::to_string(above + 11001) + ", scope=global)"})
      expect_paths_agree(spec, x, std::string("rows of other scales, ") + std::to_string(t) + " threads");
  }
}

// The AVX-512 loops of the sparse codecs (Note [compaction by compression], Note [the cut with
// AVX-512], the one-byte delta loops), each against the portable path with them on and off (the
// AVX2 and plain loops): TopK rows of odd lengths (tails of 1 to 15 after the last 16), rows of few
// distinct values (ties at the cut), infinities and -0, threshold and RandK, on 1 and 2 threads;
// and delta streams of every length from 1 to 40, of one-byte gaps and with one gap of 128 (two
// bytes), against the portable encoder, decoded back, and refused past the universe.
TEST(TopK, CompactionByCompressionMatchesThePortablePath) {
  at::manual_seed(48);
  at::Tensor special = at::randn({5, 1037});  // (5, 1037)
  special[0][3] = std::numeric_limits<float>::infinity();
  special[1][1036] = -std::numeric_limits<float>::infinity();
  special[2][15] = -0.0f;
  const at::Tensor inputs[] = {at::randn({64, 4096}), at::randn({33, 777}), at::randn({4, 31}),
                               at::randint(-3, 4, {16, 5003}).to(at::kFloat), special};
  const bool before = codec::set_sparse_avx512(true);
  for (bool avx512 : {true, false}) {
    codec::set_sparse_avx512(avx512);
    for (int t : {1, 2}) {
      Threads threads(t);
      const std::string how = std::string(avx512 ? "AVX-512, " : "AVX2, ") + std::to_string(t) + " threads";
      for (const at::Tensor& x : inputs) {
        const std::string where = std::to_string(x.size(0)) + " x " + std::to_string(x.size(1)) + ", " + how;
        for (const char* spec : {"topk(0.1)", "topk(0.3)", "topk(0.1, scope=global)", "topk(0.1, index=int32)",
                                 "threshold(1.0)", "randk(0.1, seed=3)"})
          expect_paths_agree(spec, x, where);
      }
      for (int64_t n = 1; n <= 40; ++n)
        for (bool wide : {false, true}) {  // wide: one gap of 128 (two bytes) among gaps of one
          at::Tensor gaps = at::randint(0, 128, {n});
          if (wide) gaps[n / 2] = 128;
          at::Tensor idx = (gaps + 1).cumsum(0) - 1;  // (n)
          const int64_t universe = idx[-1].item<int64_t>() + 1;
          const std::string what = std::to_string(n) + (wide ? " indices, a gap of 128, " : " indices, ") + how;
          at::Tensor bytes = codec::encode_index(idx, universe, IndexFormat::kDelta).bytes, portable;
          {
            codec::PortableKernelsGuard guard;
            portable = codec::encode_index(idx, universe, IndexFormat::kDelta).bytes;
          }
          EXPECT_TRUE(at::equal(bytes, portable)) << what;
          EXPECT_TRUE(at::equal(codec::decode_index(IndexFormat::kDelta, bytes, n, universe, "t"), idx)) << what;
          EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, bytes, n, universe - 1, "t"),
                                "t: corrupt delta index");
        }
    }
  }
  codec::set_sparse_avx512(before);
}

// TopK's fp16 and bf16 values are scattered after the vectorised cast back to float32: infinities,
// -0, fp16 subnormals and a NaN (which keeps the value-by-value conversion) decode as on the
// portable path, bit for bit, on 1 and 2 threads.
TEST(TopK, HalfValuesScatterAsThePortablePath) {
  at::manual_seed(47);
  at::Tensor x = at::randn({8, 1001});  // (8, 1001)
  x[0][5] = std::numeric_limits<float>::infinity();
  x[1][7] = -std::numeric_limits<float>::infinity();
  x[2][3] = 1e-6f;  // an fp16 subnormal
  x[2][4] = -0.0f;
  x[4][8] = 1e5f;  // saturates at fp16's largest
  for (bool nan : {false, true}) {
    if (nan) x[3][9] = std::numeric_limits<float>::quiet_NaN();
    for (int t : {1, 2}) {
      Threads threads(t);
      for (const char* spec : {"topk(1.0)", "topk(0.3)", "topk(1.0, values=bf16)", "topk(0.3, values=bf16)"}) {
        CodecContext ctx;
        auto c = parse_compressor(spec);
        const Payload p = c->encode(x, ctx);
        const at::Tensor y_fast = c->decode(p, ctx);
        at::Tensor y_portable;
        {
          codec::PortableKernelsGuard g;
          y_portable = parse_compressor(spec)->decode(p, ctx);
        }
        EXPECT_TRUE(at::equal(y_fast.contiguous().view(at::kInt), y_portable.contiguous().view(at::kInt)))
            << spec << (nan ? " with a NaN, " : ", ") << t << " threads";
      }
    }
  }
}

// ColumnSparse's CPU path (selection, block-wise gather and scatter) against the portable
// path: padded last blocks, a block longer than the message, 3-D inputs, zero channels tied at the
// cut (at::topk's choice), a NaN; on 1 and 2 threads.
TEST(ColumnSparse, CpuPathMatchesThePortablePath) {
  at::manual_seed(46);
  at::Tensor zeros = at::randn({40, 50});
  zeros.narrow(1, 5, 45).zero_();  // 5 live channels, k = 10: the cut ties at 0
  at::Tensor nan = at::randn({20, 64});
  nan[3][7] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor inputs[] = {
      at::randn({64, 4096}), at::randn({70, 1000}), at::randn({5, 300}), at::randn({3, 4, 50}), zeros, nan};
  for (int t : {1, 2}) {
    Threads threads(t);
    for (const at::Tensor& x : inputs) {
      const std::string where = "shape " + std::to_string(x.numel()) + ", " + std::to_string(t) + " threads";
      for (const char* spec : {"colsparse(0.1)", "colsparse(0.2, block=8)", "colsparse(3, block=1, index=int32)"})
        expect_paths_agree(spec, x, where);
      if (!x.isnan().any().item<bool>())  // (quant refuses a NaN)
        expect_paths_agree("colsparse(0.1, block=8) | quant(4)", x, where);
    }
  }
}

// The rotation's AVX2 butterflies (Note [butterflies in registers], hadamard.cpp) against the
// portable path's Stockham stages, bit for bit: every tile width from 8 (butterflies only) to 1024,
// rows split between threads, signed zeros, infinities and NaNs (the rotation itself passes them
// on; quant refuses them later), both directions; and hadquant's payloads on odd shapes, a single
// tile, and zero tiles (Note [min and max while rotating], hadamard.cpp).
// With the AVX-512 rotation (Note [butterflies in AVX-512 registers]: fused multiply-adds on tiles
// without a NaN) and without it (the AVX2 form); row 5 holds +inf and -inf that meet (inf - inf:
// a NaN made inside the tile). Tiles where two NaNs of other bits meet: NaN where the AVX2 form
// gives NaN, the other tiles bit for bit. Which of two NaNs' bits survives an addition depends on
// the operand order the compiler picks for a commutative add (the CPU loops and ATen's stages
// already differ there), so those bits are not compared.
TEST(HadQuant, RotationMatchesThePortableStages) {
  at::manual_seed(47);
  const bool before = codec::set_hadamard_avx512(true);
  for (bool avx512 : {true, false})
    for (int t : {1, 2}) {
      codec::set_hadamard_avx512(avx512);
      Threads threads(t);
      for (int64_t tile : {2, 4, 8, 16, 32, 64, 128, 1024}) {
        at::Tensor x = at::randn({515, tile});  // (M, t)
        x[0].zero_();
        x[1].fill_(-0.0f);
        x[2][0] = std::numeric_limits<float>::infinity();
        x[3][tile - 1] = std::numeric_limits<float>::quiet_NaN();
        x[4][tile / 2] = -std::numeric_limits<float>::infinity();
        x[5][0] = std::numeric_limits<float>::infinity();
        x[5][tile - 1] = std::numeric_limits<float>::infinity();
        x[5][tile / 2] = -std::numeric_limits<float>::infinity();
        const at::Tensor signs = codec::hadamard_signs(tile, 5, x.options());
        const at::Tensor fast_r = codec::hadamard_rotate(x, signs), fast_u = codec::hadamard_unrotate(x, signs);
        codec::PortableKernelsGuard g;
        const at::Tensor slow_r = codec::hadamard_rotate(x, signs), slow_u = codec::hadamard_unrotate(x, signs);
        const std::string where =
            "tile " + std::to_string(tile) + ", " + std::to_string(t) + " threads" + (avx512 ? ", AVX-512" : ", AVX2");
        EXPECT_TRUE(at::equal(fast_r.view(at::kInt), slow_r.view(at::kInt))) << "rotate, " << where;
        EXPECT_TRUE(at::equal(fast_u.view(at::kInt), slow_u.view(at::kInt))) << "unrotate, " << where;
      }
      for (const at::Tensor& x :
           {at::randn({64, 4096}), at::randn({3, 7, 200}), at::randn({9, 1000}), at::randn({1, 128})})
        for (const char* spec : {"hadquant(4)", "hadquant(2, tile=64)", "hadquant(8, tile=8, seed=3)"})
          expect_paths_agree(spec, x, std::to_string(x.numel()) + " elements, " + std::to_string(t) + " threads");
      // Tiles of +0 and of -0 (a scale of zero, Note [zero scales] in quant_logic.h): against the
      // portable path, and against the rotation then the tile quantiser, the CPU path before the min
      // and max moved into the rotation.
      at::Tensor zeros = at::randn({9, 1000});
      zeros[2].zero_();
      zeros[3].fill_(-0.0f);
      for (int64_t tile : {8, 64, 128}) {
        const std::string b = std::to_string(tile);
        expect_paths_agree("hadquant(4, tile=" + b + ", seed=1)", zeros,
                           "zero tiles, " + std::to_string(t) + " threads");
        CodecContext ctx;
        const Payload p = parse_compressor("hadquant(4, tile=" + b + ", seed=1)")->encode(zeros, ctx);
        const at::Tensor tiles =
            at::constant_pad_nd(zeros, {0, (1000 + tile - 1) / tile * tile - 1000}, 0).reshape({-1, tile});
        const at::Tensor rotated = codec::hadamard_rotate(tiles, codec::hadamard_signs(tile, 1, tiles.options()));
        const Payload q =
            parse_compressor("quant(4, scale=block, block=" + b + ", scales=fp16)")->encode(rotated.reshape({-1}), ctx);
        EXPECT_TRUE(at::equal(p.body, q.body)) << "zero tiles, tile " << b << ", " << t << " threads";
      }
    }
  for (int64_t tile : {16, 32, 64, 128}) {
    at::Tensor x = at::randn({7, tile});  // (M, t)
    x[2][1] = at::tensor({int32_t(0x7fc00123)}).view(at::kFloat).item<float>();
    x[2][tile - 1] = at::tensor({int32_t(0xffc00456)}).view(at::kFloat).item<float>();
    x[4][0] = at::tensor({int32_t(0xff800001)}).view(at::kFloat).item<float>();  // a signalling NaN
    x[4][tile / 2] = std::numeric_limits<float>::quiet_NaN();
    const at::Tensor signs = codec::hadamard_signs(tile, 9, x.options());
    at::Tensor got[2][2];
    for (int avx512 : {0, 1}) {
      codec::set_hadamard_avx512(avx512 == 1);
      got[avx512][0] = codec::hadamard_rotate(x, signs);
      got[avx512][1] = codec::hadamard_unrotate(x, signs);
    }
    for (int d : {0, 1}) {
      const at::Tensor nan = got[0][d].isnan();
      EXPECT_TRUE(at::equal(nan, got[1][d].isnan())) << (d ? "unrotate" : "rotate") << ", tile " << tile;
      EXPECT_TRUE(at::equal(got[0][d].masked_fill(nan, 0).view(at::kInt), got[1][d].masked_fill(nan, 0).view(at::kInt)))
          << (d ? "unrotate" : "rotate") << " with NaNs of other bits, tile " << tile;
    }
  }
  codec::set_hadamard_avx512(before);
}

// Scale groups of +0 and of -0 (Note [zero scales], quant_logic.h): whole zero blocks, channels
// and tensors, and blocks where -0 meets +0, among normal groups. The CPU path, the GPU kernels'
// logic on the host and the ATen path write the same bytes on 1 and 2 threads, and every group of
// zeros decodes to +0 (bit pattern 0) whichever path decodes it.
TEST(Quant, ZeroGroupsAgreeOnEveryPath) {
  at::manual_seed(48);
  at::Tensor x = at::randn({9, 1000});  // (9, 1000)
  x[2].zero_();
  x[3].fill_(-0.0f);  // rows 2 and 3: elements [2000, 4000)
  x.select(1, 7).zero_();
  x.select(1, 8).fill_(-0.0f);  // columns 7 and 8
  at::Tensor row = at::arange(9).view({9, 1}).expand({9, 1000}), col = at::arange(1000).expand({9, 1000});
  at::Tensor flat = at::arange(9000).view({9, 1000});
  struct Input {
    std::string name;
    at::Tensor x;
    bool all_zero;
  };
  const std::vector<Input> inputs = {{"zero rows and columns", x, false},
                                     {"+0", at::zeros({9, 1000}), true},
                                     {"-0", at::full({9, 1000}, -0.0f), true}};
  // scale= arguments, and which elements of the first input lie in a group of zeros.
  struct Grouping {
    std::string args;
    at::Tensor zero;  // (9, 1000) bool
  };
  auto whole_blocks = [&](int64_t block) {  // blocks inside [2000, 4000)
    const at::Tensor b = at::div(flat, block, "floor");
    return (b * block >= 2000) & ((b + 1) * block <= 4000);
  };
  const std::vector<Grouping> groupings = {
      {"scale=block, block=128", whole_blocks(128)}, {"scale=block, block=100", whole_blocks(100)},
      {"scale=block, block=7", whole_blocks(7)},     {"scale=channel, dim=0", (row == 2) | (row == 3)},
      {"scale=channel", (col == 7) | (col == 8)},    {"scale=tensor", at::zeros({9, 1000}, at::kBool)}};
  for (int t : {1, 2}) {
    Threads threads(t);
    for (const Grouping& g : groupings)
      for (const char* mode : {"maxabs", "minmax"})
        for (const char* scales : {"fp16", "bf16", "fp32"})
          for (int64_t bits : {4, 8}) {
            const std::string spec =
                "quant(" + std::to_string(bits) + ", " + g.args + ", mode=" + mode + ", scales=" + scales + ")";
            for (const Input& in : inputs) {
              const std::string where = in.name + ", " + std::to_string(t) + " threads";
              expect_paths_agree(spec, in.x, where);
              CodecContext ctx;
              auto c = parse_compressor(spec);
              const Payload fast = c->encode(in.x, ctx);
              const at::Tensor y = c->decode(fast, ctx).view(at::kInt);  // (9, 1000) float bits
              {
                codec::gpu::HostEmulationGuard guard;
                auto e = parse_compressor(spec);
                EXPECT_TRUE(same_payload(e->encode(in.x, ctx), fast)) << spec << " on " << where << ": GPU logic";
                EXPECT_TRUE(at::equal(e->decode(fast, ctx).view(at::kInt), y))
                    << spec << " decoded on " << where << ": GPU logic";
              }
              const at::Tensor zero = in.all_zero ? at::ones({9, 1000}, at::kBool) : g.zero;
              EXPECT_EQ(y.masked_select(zero).ne(0).sum().item<int64_t>(), 0)
                  << spec << " on " << where << ": a group of zeros decodes to other than +0";
            }
          }
    // A ReLU's output with -0 among its zeros: one scale group whose minimum is a zero of either
    // sign, found by the four chains (Note [four chains]) in whatever order.
    at::Tensor relu = at::relu(at::randn({64, 4096}));  // (64, 4096)
    at::Tensor top = relu.narrow(0, 0, 32);
    top.masked_fill_(top == 0, -0.0f);  // rows 0..31: their zeros -0, the others' +0
    for (const char* spec : {"quant(8)", "quant(4, mode=minmax)", "quant(2, scales=fp32)"})
      expect_paths_agree(spec, relu, "relu with -0, " + std::to_string(t) + " threads");
  }
}

// 8-bit codes written into the payload and read from it by the tile loops (Note [8-bit codes in
// place], quant_kernels.cpp): tiles of 8192 elements, partial last tiles, each scale kind and mode
// against the portable path, stochastic rounding against the GPU kernels' logic (the same hash
// stream), on 1 and 2 threads.
TEST(Quant, EightBitCodesInPlaceMatchTheOtherPaths) {
  at::manual_seed(49);
  for (int t : {1, 2}) {
    Threads threads(t);
    for (int64_t rows : {int64_t(1), int64_t(8), int64_t(9), int64_t(25)}) {
      at::Tensor x = at::randn({rows, 1000});  // (rows, 1000): 1000 to 25000 elements, tails in the last tile
      const std::string where = std::to_string(rows) + " x 1000, " + std::to_string(t) + " threads";
      for (const char* spec : {"quant(8)", "quant(8, mode=minmax)", "quant(8, scale=block, block=100)",
                               "quant(8, scale=channel)", "quant(8, scale=channel, dim=0, mode=minmax)"})
        expect_paths_agree(spec, x, where);
      CodecContext ctx;
      auto c = parse_compressor("quant(8, round=stochastic, seed=5)");
      const Payload fast = c->encode(x, ctx);
      codec::gpu::HostEmulationGuard guard;
      EXPECT_TRUE(same_payload(parse_compressor("quant(8, round=stochastic, seed=5)")->encode(x, ctx), fast))
          << "stochastic on " << where;
    }
  }
}

TEST(Quant, Fp16ScalesInLanesAreTheScalarOnes) {
  // quant_scales_cpu and quant_derive_cpu (vector lanes where the CPU has them: Notes [fp16 scales
  // by AVX-512] and [fp16 scales by F16C]) against quant_logic.h's scalar scales_group and
  // derive_group, group by group, over values that round outward in fp16: subnormal halves,
  // values just above and below representable ones, zeros of both signs, negative minima, the
  // largest finite half; 1003 groups, so that a scalar tail runs too.
  at::manual_seed(37);
  const int64_t groups = 1003;
  at::Tensor mag = at::cat({at::rand({400}) * 65000, at::rand({300}) * 1e-4, at::rand({200}) * 2,
                            at::tensor({0.0f, -0.0f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1.0009766f, 0.99951172f}),
                            at::rand({96}) * 1000});  // (groups)
  ASSERT_EQ(mag.numel(), groups);
  at::Tensor mn = -mag.roll(7) * (at::rand({groups}) > 0.3).to(at::kFloat), mx = mag;  // (groups) each
  for (bool minmax : {false, true}) {
    for (int bits : {1, 4, 8}) {
      const codec::gpu::ScaleParams p{bits, minmax, codec::gpu::WireType::kF16, groups};
      const int64_t wire_bytes = (minmax ? 4 : 2) * groups;
      std::vector<uint8_t> wire(wire_bytes), want_wire(wire_bytes);
      std::vector<float> a(groups), b(groups), step(groups), lo(groups), wa(groups), wb(groups), ws(groups), wl(groups);
      std::vector<float> v(groups);
      for (int64_t s = 0; s < groups; ++s) v[s] = codec::gpu::scale_value(mn[s].item<float>(), mx[s].item<float>(), minmax);
      ASSERT_TRUE(codec::quant_scales_cpu(mn.data_ptr<float>(), mx.data_ptr<float>(), p, wire.data(), a.data(),
                                          minmax ? b.data() : a.data(), step.data(), minmax ? lo.data() : step.data()));
      for (int64_t s = 0; s < groups; ++s)
        codec::gpu::scales_group(s, minmax ? mn.data_ptr<float>() : v.data(), mx.data_ptr<float>(), p, want_wire.data(),
                                 wa.data(), minmax ? wb.data() : wa.data(), ws.data(), minmax ? wl.data() : ws.data());
      const std::string where = std::string(minmax ? "min-max" : "max-abs") + ", bits " + std::to_string(bits);
      EXPECT_EQ(wire, want_wire) << where;
      EXPECT_EQ(a, wa) << where;
      EXPECT_EQ(step, ws) << where;
      if (minmax) {
        EXPECT_EQ(b, wb) << where;
        EXPECT_EQ(lo, wl) << where;
      }
      std::vector<float> step2(groups), lo2(groups, -1.0f);
      codec::quant_derive_cpu(wire.data(), p, step2.data(), minmax ? lo2.data() : step2.data());
      EXPECT_EQ(step2, ws) << where << ": derived from the wire";
      if (minmax) {
        EXPECT_EQ(lo2, wl) << where << ": derived from the wire";
      }
    }
  }
}

// The AVX-512 and AVX2 loops (Notes [quant by AVX-512] and [quant by AVX2], quant_kernels.cpp)
// against the plain loops and the portable path: bits 1 to 8 (every packing width), each scale
// kind and mode, sizes around the 8- and 16-lane vectors, the 32- and 64-code steps and the tiles,
// values near half-integers (the reciprocal's check), constant tensors, stochastic rounding
// (against the plain loops: the same hash stream), and NaN in a tensor of several scale groups
// (the CPU loops skip it in the min/max and code it 0; the ATen path's amin would propagate it, so
// there the CPU loops are compared), on 1 and 2 threads. On a CPU without AVX-512 its setting runs
// the AVX2 loops; without AVX2 and FMA every setting runs the plain loops.
TEST(Quant, VectorLoopsMatchThePlainLoops) {
  at::manual_seed(50);
  // Encode and decode with the AVX-512 loops (and AVX2's where the CPU has no AVX-512), the AVX2
  // loops alone, and neither; the payload and the decoded bits.
  enum class Loops { kAvx512, kAvx2, kPlain };
  auto run = [](const std::string& spec, const at::Tensor& x, Loops loops) {
    const bool before512 = codec::set_quant_avx512(loops == Loops::kAvx512);
    const bool before2 = codec::set_quant_avx2(loops != Loops::kPlain);
    CodecContext ctx;
    auto c = parse_compressor(spec);
    Payload p = c->encode(x, ctx);
    at::Tensor y = c->decode(p, ctx).contiguous().view(at::kInt);
    codec::set_quant_avx512(before512);
    codec::set_quant_avx2(before2);
    return std::make_pair(p, y);
  };
  auto expect_loops_agree = [&](const std::string& spec, const at::Tensor& x, const std::string& where) {
    const auto plain = run(spec, x, Loops::kPlain);
    for (Loops loops : {Loops::kAvx512, Loops::kAvx2}) {
      const auto fast = run(spec, x, loops);
      const char* name = loops == Loops::kAvx512 ? " (AVX-512 loops)" : " (AVX2 loops)";
      EXPECT_TRUE(same_payload(fast.first, plain.first)) << spec << " on " << where << name;
      EXPECT_TRUE(at::equal(fast.second, plain.second)) << spec << " decoded on " << where << name;
    }
  };
  for (int t : {1, 2}) {
    Threads threads(t);
    for (int64_t bits : {1, 2, 3, 4, 5, 6, 7, 8}) {
      const std::string b = std::to_string(bits);
      const std::vector<std::string> specs = {
          "quant(" + b + ")", "quant(" + b + ", mode=minmax)", "quant(" + b + ", scale=block, block=100)",
          "quant(" + b + ", scale=block, block=7, mode=minmax)", "quant(" + b + ", scale=channel)",
          "quant(" + b + ", scale=channel, mode=minmax)", "quant(" + b + ", scale=channel, dim=0)",
          "quant(" + b + ", round=stochastic, seed=3)",
          "quant(" + b + ", round=stochastic, mode=minmax, scale=channel, seed=4)",
          // runs of a multiple of 32: a tile per call (Note [runs in one call])
          "quant(" + b + ", scale=block, block=64)", "quant(" + b + ", scale=block, block=96, mode=minmax)"};
      for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(63), int64_t(65), int64_t(129), int64_t(1030),
                        int64_t(8191), int64_t(8193), int64_t(3 * 8192 + 77)}) {
        const std::string where = std::to_string(n) + " elements, " + std::to_string(t) + " threads";
        const at::Tensor x = at::randn({n, 2});  // (n, 2): channel scales along either dim
        for (const std::string& spec : specs) {
          if (spec.find("stochastic") == std::string::npos) expect_paths_agree(spec, x, where);  // ATen: at::rand
          expect_loops_agree(spec, x, where);
        }
      }
      // Near half-integers: the reciprocal's spans coded again by the division.
      const at::Tensor h = near_half_integers(2 * 8192 + 333, bits);
      for (const std::string& spec : {specs[0], specs[2], specs[9]}) {
        expect_paths_agree(spec, h, "near half-integers");
        expect_loops_agree(spec, h, "near half-integers");
      }
      const at::Tensor rows = at::cat({near_half_integers(3000, bits), near_half_integers(3000, bits)}).view({6, 1000});
      expect_paths_agree(specs[4], rows, "(6, 1000) near half-integers");
      // Constant tensors (one value: every code the top or the middle one; zeros: Note [zero scales]).
      for (float v : {0.0f, 1.5f, -3.0f}) {
        const at::Tensor c = at::full({5, 999}, v);
        for (const std::string& spec : specs) expect_loops_agree(spec, c, "constant " + std::to_string(v));
        for (size_t k = 0; k < 7; ++k) expect_paths_agree(specs[k], c, "constant " + std::to_string(v));
      }
      // Channel scales along rows of many columns: the min/max in blocks of 2048 columns (Note
      // [channel min/max by columns]) with a partial last block, NaN skipped as before.
      at::Tensor wide = at::randn({5, 2 * 2048 + 21});  // (5, 4117)
      for (const std::string& spec : {specs[4], specs[5]}) {
        expect_paths_agree(spec, wide, "(5, 4117)");
        expect_loops_agree(spec, wide, "(5, 4117)");
      }
      wide[2][7] = std::numeric_limits<float>::quiet_NaN();
      wide[4][4100] = std::numeric_limits<float>::quiet_NaN();
      for (const std::string& spec : {specs[4], specs[5]}) expect_loops_agree(spec, wide, "(5, 4117) with NaN");
      // fp16 wire scales at the type's edges (Note [fp16 scales by AVX-512]): subnormal and
      // near-overflow scales, one per channel; beyond 65504 a scale rounds out to inf: refused.
      for (float m : {1e-7f, 3e-5f, 6.5e4f}) {
        const at::Tensor e = at::randn({8, 300}) * m / 4;  // (8, 300)
        for (const std::string& spec : {specs[4], specs[5], specs[6]}) {
          expect_paths_agree(spec, e, "scales near " + std::to_string(m));
          expect_loops_agree(spec, e, "scales near " + std::to_string(m));
        }
      }
      for (bool vector : {true, false}) {
        const bool before512 = codec::set_quant_avx512(vector), before2 = codec::set_quant_avx2(vector);
        CodecContext ctx;
        EXPECT_THROW(parse_compressor(specs[4])->encode(at::full({2, 3}, 65520.0f), ctx), c10::Error);
        codec::set_quant_avx512(before512);
        codec::set_quant_avx2(before2);
      }
      // NaN among finite values, several scale groups.
      at::Tensor nan = at::randn({4, 1000});
      nan.view({-1}).index_put_({at::tensor({0, 5, 64, 100, 1999, 3999})}, std::numeric_limits<float>::quiet_NaN());
      for (const std::string& spec : {specs[2], specs[3], specs[6], specs[8], specs[9], specs[10]})
        expect_loops_agree(spec, nan, "NaN among normals, " + std::to_string(t) + " threads");
    }
  }
}

// Lemire's remainder (Note [remainder by multiplication], sparse_kernels.h) against %: divisors
// from 1 to beyond 2^32 (powers of two and their neighbours included), numerators at the ends of
// the range, multiples of d and their neighbours, and random ones.
TEST(RandK, RemainderByMultiplication) {
  std::vector<uint64_t> divisors;
  for (uint64_t d = 1; d <= 5000; ++d) divisors.push_back(d);
  for (int b = 13; b < 64; ++b)
    for (int64_t o : {-1, 0, 1}) divisors.push_back((uint64_t(1) << b) + static_cast<uint64_t>(o));
  divisors.push_back(~uint64_t(0));
  at::CPUGeneratorImpl gen(7);
  for (uint64_t d : divisors) {
    const codec::Remainder rem(d);
    std::vector<uint64_t> us = {0,
                                1,
                                d - 1,
                                d,
                                d + 1,
                                ~uint64_t(0),
                                ~uint64_t(0) - 1,
                                ~uint64_t(0) / d * d,
                                ~uint64_t(0) / d * d - 1,
                                (~uint64_t(0) / d - 1) * d};
    for (int i = 0; i < 64; ++i) us.push_back(gen.random64());
    for (uint64_t u : us) ASSERT_EQ(rem.of(u), u % d) << u << " % " << d;
  }
}

// mt19937_draws against the engine's own draws: from a fresh seed (its first draw twists), from
// the middle of a block, counts that end on, before and after a twist, and none.
TEST(RandK, BlockDrawsEqualTheEnginesDraws) {
  at::mt19937 fast(12345), ref(12345);
  for (int64_t count : {0, 1, 622, 1, 1, 624, 3000, 7, 624 * 3}) {
    std::vector<uint32_t> d(count);
    codec::mt19937_draws(fast, d.data(), count);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(d[i], ref()) << "draw " << i << " of " << count;
  }
  EXPECT_EQ(fast(), ref());
}

// RandK's mask drawn from a copy of the generator's engine (Note [draws from a copy of the
// engine], sparse_kernels.cpp) against Floyd's algorithm on CPUGeneratorImpl::random64(): the same
// positions, and the generator left in the same state (the next draws agree).
TEST(RandK, MaskFromTheEngineMatchesRandom64) {
  for (auto [rows, D, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 4096, 410},
                            {3, 1000, 1000},
                            {5, 77, 1},
                            {2, 10, 0},
                            {1, 1, 1},
                            {2, 3000000, 2000}}) {
    at::CPUGeneratorImpl fast_gen(99 + D), ref_gen(99 + D);
    std::vector<uint8_t> fast(rows * D), ref(rows * D, 0);
    codec::randk_mask_cpu(&fast_gen, rows, D, k, fast.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = D - k; j < D; ++j) {
        const int64_t pos = static_cast<int64_t>(ref_gen.random64() % static_cast<uint64_t>(j + 1));
        ref[r * D + (ref[r * D + pos] ? j : pos)] = 1;
      }
    const std::string where = std::to_string(rows) + " x " + std::to_string(D) + ", k " + std::to_string(k);
    EXPECT_EQ(fast, ref) << where;
    EXPECT_EQ(std::count(fast.begin(), fast.end(), 1), rows * k) << where;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(fast_gen.random64(), ref_gen.random64()) << where;
  }
}

// Note [ATen's ops on the calling thread]: a SerialScope gives ATen's ops one thread on the
// calling thread only, for its lifetime; nested, the inner one changes nothing.
TEST(Threads, SerialScopeChangesOnlyThisThreadForItsLifetime) {
  const Threads two(2);
  {
    const codec::SerialScope off(false);
    EXPECT_FALSE(off.active());
    EXPECT_EQ(at::get_num_threads(), 2);
  }
  {
    const codec::SerialScope serial(true);
    if (!serial.active()) GTEST_SKIP() << "the codec kernels were built without OpenMP: a SerialScope does nothing";
    EXPECT_EQ(at::get_num_threads(), 1);
    int other = 0;
    std::thread([&] { other = at::get_num_threads(); }).join();
    EXPECT_EQ(other, 2) << "another thread's count changed";
    {
      const codec::SerialScope inner(true);
      EXPECT_FALSE(inner.active());
      EXPECT_EQ(at::get_num_threads(), 1);
    }
    EXPECT_EQ(at::get_num_threads(), 1) << "the inner scope restored the count";
  }
  EXPECT_EQ(at::get_num_threads(), 2);
  // A thread whose first ATen call is inside the scope (ATen sets a thread's count on first use).
  int fresh = 0;
  std::thread([&] {
    const codec::SerialScope serial(true);
    fresh = at::get_num_threads();
  }).join();
  EXPECT_EQ(fresh, 1);
}

// Note [codec threads]: every codec loop split into tasks of a few hundred bytes, so that tensors
// of tens of KiB run each loop's parallel form (where the build has OpenMP, Note [codecs with
// OpenMP] in compression/CMakeLists.txt), gives the payload and the decoded values of one thread,
// and of the portable path.
TEST(Threads, SmallTasksMatchOneThread) {
  const TaskBytes small(256);
  const std::vector<std::string> specs = {"fp16",
                                          "bf16",
                                          "quant(8)",
                                          "quant(3, mode=minmax)",
                                          "quant(4, scale=channel)",
                                          "quant(4, scale=channel, dim=0)",
                                          "quant(4, scale=block, block=100)",
                                          "quant(4, round=stochastic)",
                                          "quant(2)",
                                          "quantile(4)",
                                          "topk(0.1)",
                                          "topk(0.1, scope=global)",
                                          "topk(0.2, index=delta)",
                                          "topk(0.3, index=bitmap)",
                                          "topk(0.1, values=fp16)",
                                          "topk(1.0)",
                                          "randk(0.1)",
                                          "threshold(1.645)",
                                          "powersgd(4)",
                                          "hadquant(4)",
                                          "colsparse(0.1)",
                                          "colsparse(0.1, block=8) | quant(4)"};
  at::manual_seed(39);
  // Rows of an odd length (a tail in every row) and one long row.
  const std::vector<at::Tensor> inputs = {at::randn({24, 4099}), at::randn({3 * 8192 + 77})};
  for (const at::Tensor& x : inputs) {
    const std::string where = "(" + std::to_string(x.size(0)) + (x.dim() > 1 ? ", 4099)" : ")");
    for (const std::string& spec : specs) {
      if (x.dim() == 1 && spec.find("channel") != std::string::npos) continue;  // needs rows
      CodecContext ctx;
      Payload one, two;
      at::Tensor y_one, y_two;
      {
        const Threads t(1);
        at::manual_seed(1);  // randk's draws
        auto c = parse_compressor(spec);
        one = c->encode(x, ctx);
        y_one = c->decode(one, ctx);
      }
      {
        const Threads t(2);
        at::manual_seed(1);
        auto c = parse_compressor(spec);
        two = c->encode(x, ctx);
        y_two = c->decode(two, ctx);
        // Not the codecs whose portable path draws or sums otherwise.
        if (spec.find("randk") == std::string::npos && spec.find("stochastic") == std::string::npos &&
            spec.find("powersgd") == std::string::npos)
          expect_paths_agree(spec, x, where + " in small tasks");
      }
      EXPECT_TRUE(same_payload(one, two)) << spec << " on " << where;
      EXPECT_TRUE(at::equal(y_one.contiguous().view(at::kInt), y_two.contiguous().view(at::kInt)))
          << spec << " decoded on " << where;
    }
  }
}

}  // namespace
}  // namespace tl
