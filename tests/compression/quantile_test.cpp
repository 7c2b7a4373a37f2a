// Quantile codebook quantisation: every value decodes to its nearest codeword, codewords are the
// tensor's quantiles (or bucket means), exact payload sizes, both paths agree, corrupt payloads.
#include "compression/codecs/quantile.h"

#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::header_formula;
using testing::round_trip;

at::Tensor codebook_of(const Payload& p, int64_t bits) {
  return p.body.narrow(0, 0, 4 << bits).view(at::kFloat).clone();
}

TEST(Quantile, DecodesToTheNearestQuantileCodeword) {
  at::manual_seed(0);
  at::Tensor x = at::randn({50, 40}).pow(3);  // heavy tails: a uniform grid would waste levels
  CodecContext ctx;
  for (int64_t bits : {1, 3, 8}) {
    auto c = parse_compressor("quantile(" + std::to_string(bits) + ", centers=quantile)");
    Payload p = c->encode(x, ctx);
    at::Tensor book = codebook_of(p, bits);
    const int64_t L = int64_t(1) << bits;
    at::Tensor probs = (at::arange(L, at::kFloat) + 0.5) / L;
    EXPECT_TRUE(all_close(book, at::quantile(x.reshape(-1), probs), "codewords are quantiles", 0, 0));
    at::Tensor y = c->decode(p, ctx);
    at::Tensor dist = (x.reshape({-1, 1}) - book.view({1, -1})).abs();  // (n, L)
    at::Tensor nearest = std::get<0>(dist.min(1));
    EXPECT_TRUE(
        all_close((y.reshape(-1) - x.reshape(-1)).abs(), nearest, "distance to the nearest codeword", 1e-5, 1e-6))
        << "bits=" << bits;
  }
}

TEST(Quantile, MeanCentersReduceTheError) {
  at::manual_seed(1);
  at::Tensor x = at::randn({4000}).exp();
  CodecContext ctx;
  auto q = parse_compressor("quantile(4, centers=quantile)");
  auto m = parse_compressor("quantile(4)");
  const double eq = (round_trip(q, x) - x).pow(2).sum().item<double>();
  Payload pm = m->encode(x, ctx);
  at::Tensor y = m->decode(pm, ctx);
  const double em = (y - x).pow(2).sum().item<double>();
  EXPECT_LT(em, eq) << "bucket means minimise the squared error for the assignment";
  // Each codeword is the mean of the values decoded to it.
  at::Tensor book = codebook_of(pm, 4);
  for (int64_t l = 0; l < 16; ++l) {
    at::Tensor mine = y == book[l];
    if (mine.any().item<bool>()) {
      EXPECT_NEAR(x.masked_select(mine).mean().item<double>(), book[l].item<double>(),
                  1e-5 * (1 + book[l].abs().item<double>()));
    }
  }
  // Quantile buckets hold equal shares of the values (continuous data: within +-50% of n / L).
  at::Tensor codes_count =
      std::get<2>(at::_unique2(y, /*sorted=*/true, /*return_inverse=*/false, /*return_counts=*/true));
  EXPECT_EQ(codes_count.numel(), 16);
  EXPECT_GT(codes_count.min().item<int64_t>(), 4000 / 16 / 2);
  EXPECT_LT(codes_count.max().item<int64_t>(), 4000 / 16 * 3 / 2);
  // On skewed data that spends the levels where the values are, unlike a uniform grid: the
  // typical (median) error is far smaller.
  const double uniform =
      (round_trip(parse_compressor("quant(4, mode=minmax, scales=fp32)"), x) - x).abs().median().item<double>();
  const double quantile = (y - x).abs().median().item<double>();
  EXPECT_LT(quantile, uniform / 4) << "median |error|: quantile(4) vs quant(4, mode=minmax)";
}

TEST(Quantile, SampledCodebookAndSizes) {
  at::manual_seed(2);
  at::Tensor x = at::randn({3, 1000});
  CodecContext ctx;
  for (int64_t bits : {2, 5, 8}) {
    for (const char* book : {"fp32", "fp16"}) {
      auto c = parse_compressor("quantile(" + std::to_string(bits) + ", sample=500, codebook=" + book + ")");
      Payload p = c->encode(x, ctx);
      const int64_t esize = std::string(book) == "fp32" ? 4 : 2;
      EXPECT_EQ(static_cast<int64_t>(p.nbytes()), header_formula(2, 4) + (esize << bits) + (3000 * bits + 7) / 8);
      // Quantiles from an evenly strided sample of 500 (stride 6).
      if (std::string(book) == "fp32") {
        auto cq = parse_compressor("quantile(" + std::to_string(bits) + ", sample=500, centers=quantile)");
        const int64_t L = int64_t(1) << bits;
        at::Tensor probs = (at::arange(L, at::kFloat) + 0.5) / L;
        at::Tensor expect = at::quantile(x.reshape(-1).slice(0, 0, 3000, 6), probs);
        EXPECT_TRUE(all_close(codebook_of(cq->encode(x, ctx), bits), expect, "sampled quantiles", 0, 0));
      }
    }
  }
}

TEST(Quantile, CpuAndPortablePathsAgree) {
  at::manual_seed(3);
  at::Tensor x = at::randn({7, 333});
  CodecContext ctx;
  for (const char* spec : {"quantile(8)", "quantile(3, centers=quantile)", "quantile(1)"}) {
    auto c = parse_compressor(spec);
    Payload fast = c->encode(x, ctx);
    codec::PortableKernelsGuard g;
    Payload portable = c->encode(x, ctx);
    ASSERT_EQ(fast.body_bytes(), portable.body_bytes());
    const int64_t book = 4 * (int64_t(1) << fast.params[0]);
    EXPECT_TRUE(at::equal(fast.body.narrow(0, book, fast.body.numel() - book),
                          portable.body.narrow(0, book, portable.body.numel() - book)))
        << spec << ": codes";
    // Codebooks: bucket means summed in a different order may differ in the last bit.
    EXPECT_TRUE(all_close(codebook_of(fast, fast.params[0]), codebook_of(portable, fast.params[0]), spec, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(c->decode(fast, ctx), round_trip(c, x), std::string(spec) + " decode", 1e-6, 1e-6));
  }
}

TEST(Quantile, CorruptPayloadsAreRejected) {
  CodecContext ctx;
  auto c = parse_compressor("quantile(4)");
  Payload p = c->encode(at::randn({100}), ctx);
  Payload cut = p;
  cut.body = p.body.narrow(0, 0, p.body.numel() - 1);
  EXPECT_ERROR_CONTAINS(c->decode(cut, ctx), "quantile: payload body truncated");
  Payload bits = p;
  bits.params[0] = 0;
  EXPECT_ERROR_CONTAINS(c->decode(bits, ctx), "corrupt payload: bits=0");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4)")->decode(p, ctx), "packed by 'quantile'");
  EXPECT_EQ(round_trip(c, at::zeros({0})).numel(), 0);
}

}  // namespace
}  // namespace tl
