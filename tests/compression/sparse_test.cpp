// TopK / RandK / threshold: exactly k kept and they are the largest (per sample and global, with
// ties), rescaled RandK unbiased, generator state in checkpoints, exact payload sizes, the
// cheapest index form, identical payloads on the CPU and portable paths, shared mode, and
// corrupt payloads rejected.
#include "compression/codecs/sparse.h"

#include "compression/codecs/sparse_index.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using codec::IndexFormat;
using testing::all_close;
using testing::header_formula;
using testing::round_trip;
using testing::same_payload;

// Per row of y (rows, D): exactly k nonzeros, and min |kept| >= max |dropped| of x.
void expect_topk_rows(const at::Tensor& x, const at::Tensor& y, int64_t k, const std::string& label) {
  const int64_t rows = x.size(0);
  at::Tensor xr = x.reshape({rows, -1}), yr = y.reshape({rows, -1});
  for (int64_t r = 0; r < rows; ++r) {
    at::Tensor kept = yr[r] != 0;
    EXPECT_EQ(kept.sum().item<int64_t>(), k) << label << " row " << r;
    EXPECT_TRUE(at::equal(yr[r].masked_select(kept), xr[r].masked_select(kept))) << label << ": kept values exact";
    if (k > 0 && k < xr.size(1)) {
      const float min_kept = xr[r].abs().masked_select(kept).min().item<float>();
      const float max_dropped = xr[r].abs().masked_select(~kept).max().item<float>();
      EXPECT_GE(min_kept, max_dropped) << label << " row " << r;
    }
  }
}

TEST(TopK, PerSampleKeepsTheKLargest) {
  at::manual_seed(1);
  at::Tensor x = at::randn({6, 3, 50});  // D = 150 per sample
  for (const char* spec : {"topk(0.1, values=fp32)", "topk(15, values=fp32, index=int32)",
                           "topk(0.1, values=fp32, index=bitmap)", "topk(0.1, values=fp32, index=delta)"}) {
    at::Tensor y = round_trip(parse_compressor(spec), x);
    EXPECT_EQ(y.sizes(), x.sizes());
    expect_topk_rows(x, y, 15, spec);
  }
  at::Tensor all = round_trip(parse_compressor("topk(1.0, values=fp32)"), x);
  EXPECT_TRUE(all_close(all, x, "topk(1.0) keeps everything", 0, 0));
  expect_topk_rows(x, round_trip(parse_compressor("topk(0.001, values=fp32)"), x), 1, "at least one per row");
}

TEST(TopK, GlobalKeepsTheKLargestOverTheBatch) {
  at::manual_seed(2);
  at::Tensor x = at::randn({8, 40}) * at::linspace(0.1, 3, 8).unsqueeze(1);  // rows of different scale
  at::Tensor y = round_trip(parse_compressor("topk(0.05, scope=global, values=fp32)"), x);
  expect_topk_rows(x.reshape({1, -1}), y.reshape({1, -1}), 16, "global");
  // Per-row counts differ: the large rows take most of the budget.
  at::Tensor counts = (y != 0).sum(1);
  EXPECT_GT(counts[7].item<int64_t>(), counts[0].item<int64_t>());
}

TEST(TopK, TiesAreCutExactlyAtK) {
  // Many equal magnitudes: 40 entries of 1 (signs mixed), the rest smaller.
  at::Tensor x = at::full({2, 100}, 0.5);
  x.narrow(1, 10, 40).fill_(1.0);
  x.narrow(1, 30, 10).fill_(-1.0);
  x[0][99] = 2.0;
  for (bool portable : {false, true}) {
    std::optional<codec::PortableKernelsGuard> guard;
    if (portable) guard.emplace();
    at::Tensor y = round_trip(parse_compressor("topk(25, values=fp32)"), x);
    expect_topk_rows(x, y, 25, portable ? "ties, portable" : "ties, cpu");
    // Ties are taken in index order: row 1 keeps the first 25 ones (indices 10..34).
    EXPECT_TRUE(at::equal((y[1] != 0).nonzero().view(-1), at::arange(10, 35))) << portable;
  }
}

// fp16 values saturate at +-65504 instead of overflowing to inf (which the receiver would turn
// into NaN); fp32 and bf16 carry the value as it is.
TEST(TopK, Fp16ValuesSaturateInsteadOfOverflowing) {
  const at::Tensor x = at::tensor({1e6f, -3e5f, 2.0f, 0.5f}).view({1, 4});
  CodecContext ctx;
  const at::Tensor y = round_trip(parse_compressor("topk(3)"), x);
  EXPECT_TRUE(at::isfinite(y).all().item<bool>()) << y;
  EXPECT_EQ(y[0][0].item<float>(), 65504.0f);
  EXPECT_EQ(y[0][1].item<float>(), -65504.0f);
  EXPECT_EQ(y[0][2].item<float>(), 2.0f);
  EXPECT_EQ(y[0][3].item<float>(), 0.0f);
  EXPECT_EQ(round_trip(parse_compressor("topk(3, values=fp32)"), x)[0][0].item<float>(), 1e6f);
}

TEST(TopK, PayloadSizeFormula) {
  at::manual_seed(3);
  at::Tensor x = at::randn({4, 256});
  CodecContext ctx;
  for (const char* fmt : {"int32", "bitmap", "delta"}) {
    for (const char* vt : {"fp16", "fp32"}) {
      auto c = parse_compressor(std::string("topk(0.25, values=") + vt + ", index=" + fmt + ")");
      Payload p = c->encode(x, ctx);
      const int64_t n = 4 * 64;
      int64_t index = 0;
      if (std::string(fmt) == "int32") index = 4 * n;
      if (std::string(fmt) == "bitmap") index = 1024 / 8;
      if (std::string(fmt) == "delta") {
        // Varint lengths of the gaps, counted here from the decoded support.
        at::Tensor idx =
            (round_trip(parse_compressor("topk(0.25, values=fp32)"), x).reshape(-1) != 0).nonzero().view(-1);
        int64_t prev = -1;
        for (int64_t i = 0; i < idx.numel(); ++i) {
          uint64_t g = idx[i].item<int64_t>() - prev - 1;
          prev = idx[i].item<int64_t>();
          index += g < 128 ? 1 : g < 16384 ? 2 : 3;
        }
      }
      const int64_t values = n * (std::string(vt) == "fp16" ? 2 : 4);
      EXPECT_EQ(static_cast<int64_t>(p.nbytes()), header_formula(2, 7) + index + values) << fmt << " " << vt;
    }
  }
}

TEST(SparseIndex, CheapestFormIsChosen) {
  at::manual_seed(4);
  const int64_t universe = 4096;
  for (int64_t n : {1, 5, 60, 300, 600, 1500, 4096}) {
    at::Tensor idx = std::get<0>(at::sort(at::randperm(universe).narrow(0, 0, n)));
    const int64_t plain = 4 * n, bitmap = universe / 8;
    int64_t delta = 0, prev = -1;
    auto acc = idx.accessor<int64_t, 1>();
    for (int64_t i = 0; i < n; ++i) {
      uint64_t g = acc[i] - prev - 1;
      prev = acc[i];
      for (delta += 1; g >= 128; g >>= 7) delta += 1;
    }
    const int64_t best = std::min({plain, bitmap, delta});
    auto enc = codec::encode_index(idx, universe, std::nullopt);
    EXPECT_EQ(enc.bytes.numel(), best) << "n=" << n << " int=" << plain << " bitmap=" << bitmap << " delta=" << delta;
    const IndexFormat expect = plain == best    ? IndexFormat::kInt
                               : bitmap == best ? IndexFormat::kBitmap
                                                : IndexFormat::kDelta;
    EXPECT_EQ(enc.format, expect) << "n=" << n;
    for (IndexFormat f : {IndexFormat::kInt, IndexFormat::kDelta, IndexFormat::kBitmap}) {
      auto forced = codec::encode_index(idx, universe, f);
      EXPECT_EQ(forced.bytes.numel(), f == IndexFormat::kInt ? plain : f == IndexFormat::kDelta ? delta : bitmap);
      EXPECT_TRUE(at::equal(codec::decode_index(f, forced.bytes, n, universe, "test"), idx));
      codec::PortableKernelsGuard g;
      auto portable = codec::encode_index(idx, universe, f);
      EXPECT_TRUE(at::equal(portable.bytes, forced.bytes))
          << "portable encoding differs, form " << int(f) << " n=" << n;
      EXPECT_TRUE(at::equal(codec::decode_index(f, forced.bytes, n, universe, "test"), idx));
    }
  }
  // Large gaps take several varint bytes.
  at::Tensor far = at::tensor({0, 200, 20000, 3000000}, at::kLong);
  // Gaps 0, 199, 19799, 2979999: 1, 2, 3 and 4 bytes of 7 bits.
  EXPECT_EQ(codec::encode_index(far, 4000000, IndexFormat::kDelta).bytes.numel(), 1 + 2 + 3 + 4);
}

TEST(SparseIndex, CorruptIndicesAreRejected) {
  at::Tensor idx = at::tensor({3, 7, 9}, at::kLong);
  for (bool portable : {false, true}) {
    std::optional<codec::PortableKernelsGuard> guard;
    if (portable) guard.emplace();
    auto plain = codec::encode_index(idx, 16, IndexFormat::kInt).bytes.clone();
    plain.view(at::kInt)[1] = 16;
    EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kInt, plain, 3, 16, "t"), "indices outside [0, 16)");
    auto bitmap = codec::encode_index(idx, 16, IndexFormat::kBitmap).bytes.clone();
    bitmap[0] = bitmap[0].item<uint8_t>() | 1;
    EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kBitmap, bitmap, 3, 16, "t"), "4 bits set");
    auto past = codec::encode_index(idx, 12, IndexFormat::kBitmap).bytes.clone();
    past[1] = past[1].item<uint8_t>() | 0x80;  // bit 15 of a 12-element tensor
    EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kBitmap, past, 4, 12, "t"), "past the 12 elements");
    auto delta = codec::encode_index(idx, 16, IndexFormat::kDelta).bytes;
    EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, delta, 4, 16, "t"), "t: corrupt delta index");
    EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, delta, 3, 9, "t"), "corrupt delta index");
    at::Tensor unterminated = at::tensor({0x83, 0x84}, at::kByte);
    EXPECT_ERROR_CONTAINS(codec::decode_index(IndexFormat::kDelta, unterminated, 1, 1000, "t"), "corrupt delta index");
  }
}

TEST(Sparse, CpuAndPortablePathsGiveIdenticalPayloads) {
  at::manual_seed(5);
  at::Tensor x = at::randn({5, 2, 300});
  CodecContext ctx;
  for (const char* spec :
       {"topk(0.1)", "topk(0.3, scope=global, index=int32)", "topk(7, index=delta)", "randk(0.1, seed=3)",
        "randk(0.02, scope=global, rescale=true)", "threshold(1.5)", "threshold(0.2, index=delta, values=bf16)"}) {
    Payload fast = parse_compressor(spec)->encode(x, ctx);
    Payload portable;
    {
      codec::PortableKernelsGuard g;
      auto c = parse_compressor(spec);
      portable = c->encode(x, ctx);
      at::Tensor y = c->decode(fast, ctx);
      EXPECT_TRUE(all_close(y, round_trip(parse_compressor(spec), x), std::string(spec) + " portable decode", 0, 0))
          << "(randk: both codecs start from the same seed)";
    }
    EXPECT_TRUE(same_payload(fast, portable)) << spec;
  }
}

// The CPU selection estimates its threshold from a sample of each row (Note [top-k by a sampled
// threshold] in sparse_kernels.cpp); whatever the sample shows, the payload is the exact one.
// Rows here: Gaussian; sorted magnitudes; all ties (+-1); zeros; huge values exactly on the sampled
// cache lines (the estimate overshoots and the row is gathered again); huge values everywhere
// but there (the estimate undershoots); and a long single row (scope=global: gathered in pieces).
TEST(TopK, SampledThresholdGivesTheExactSelection) {
  at::manual_seed(8);
  constexpr int64_t D = 8192, kLines = 32, kLine = 16;  // the sample's geometry in sparse_kernels.cpp
  at::Tensor x = at::randn({6, D});
  x[1] = at::linspace(-3, 5, D);
  x[2] = at::where(at::rand({D}) < 0.5, 1.0f, -1.0f);
  x[3].zero_();
  at::Tensor on_sample = at::zeros({D}, at::kBool);
  for (int64_t l = 0; l < kLines; ++l) on_sample.narrow(0, l * (D / kLines) / kLine * kLine, kLine).fill_(true);
  x[4] = at::where(on_sample, 100 + at::rand({D}), at::randn({D}));
  x[5] = at::where(on_sample, at::randn({D}), 100 + at::rand({D}));
  at::Tensor wide = at::randn({1, 1 << 18});
  CodecContext ctx;
  for (const at::Tensor& t : {x, wide}) {
    for (const char* spec :
         {"topk(0.1)", "topk(0.01)", "topk(0.1, scope=global)", "topk(7)", "topk(0.5, index=int32)", "topk(1.0)"}) {
      const std::string where = std::string(spec) + " on " + c10::str(t.sizes());
      auto c = parse_compressor(spec);
      Payload fast = c->encode(t, ctx);
      Payload portable;
      {
        codec::PortableKernelsGuard g;
        portable = parse_compressor(spec)->encode(t, ctx);
      }
      EXPECT_TRUE(same_payload(fast, portable)) << where;
      EXPECT_TRUE(at::equal(c->decode(fast, ctx), round_trip(parse_compressor(spec), t))) << where;
    }
  }
}

TEST(Sparse, HalfInputs) {
  at::manual_seed(6);
  at::Tensor x = at::randn({4, 64}).to(at::kHalf);
  at::Tensor y = round_trip(parse_compressor("topk(8)"), x);
  EXPECT_EQ(y.scalar_type(), at::kHalf);
  expect_topk_rows(x.to(at::kFloat), y.to(at::kFloat), 8, "half");
}

TEST(RandK, ExactlyKDistinctPerRowAndUnbiasedWhenRescaled) {
  at::manual_seed(7);
  const int64_t rows = 2, D = 50, k = 10, T = 3000;
  at::Tensor x = at::randn({rows, D});
  auto c = parse_compressor("randk(0.2, rescale=true, values=fp32, seed=11)");
  at::Tensor sum = at::zeros_like(x);
  at::Tensor hits = at::zeros_like(x);
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor y = round_trip(c, x);
    ASSERT_TRUE(at::equal((y != 0).sum(1), at::full({rows}, k, at::kLong))) << "draw " << t;
    sum += y;
    hits += (y != 0).to(at::kFloat);
  }
  // Each draw of element j is x_j * D / k with probability k / D, else 0: the mean of T draws has
  // standard deviation |x_j| * sqrt((D / k - 1) / T). Allow 5 sigma.
  at::Tensor mean = sum / T;
  at::Tensor sigma = x.abs() * std::sqrt((double(D) / k - 1) / T);
  EXPECT_TRUE(((mean - x).abs() <= 5 * sigma + 1e-6).all().item<bool>())
      << "max |mean - x| / sigma = " << ((mean - x).abs() / sigma).max().item<float>();
  // Selection frequency k / D for every position (binomial, 5 sigma).
  const double p = double(k) / D, sd = std::sqrt(p * (1 - p) / T);
  EXPECT_LT(((hits / T) - p).abs().max().item<double>(), 5 * sd);
  // Without rescale the kept values are x itself.
  at::Tensor plain = round_trip(parse_compressor("randk(10, values=fp32)"), x);
  EXPECT_TRUE(at::equal(plain.masked_select(plain != 0), x.masked_select(plain != 0)));
}

TEST(RandK, GeneratorStateIsCheckpointed) {
  at::manual_seed(8);
  at::Tensor x = at::randn({3, 40});
  CodecContext ctx;
  auto a = parse_compressor("randk(0.25, seed=5)");
  a->encode(x, ctx);  // advance the generator
  TensorMap state = a->state_dict();
  ASSERT_TRUE(state.count("generator"));
  for (auto& [name, t] : state) t = t.clone();  // a snapshot, as a checkpoint writer takes
  Payload next_a = a->encode(x, ctx);
  auto b = parse_compressor("randk(0.25, seed=5)");
  Payload first_b = b->encode(x, ctx);
  EXPECT_FALSE(same_payload(next_a, first_b)) << "fresh draws each call";
  b->load_state_dict(state);
  EXPECT_TRUE(same_payload(b->encode(x, ctx), next_a)) << "restored generator repeats the draw";
  auto other_seed = parse_compressor("randk(0.25, seed=6)");
  EXPECT_FALSE(same_payload(other_seed->encode(x, ctx), first_b));
}

TEST(Threshold, KeepsEntriesAboveT) {
  at::manual_seed(9);
  at::Tensor x = at::randn({7, 13});
  CodecContext ctx;
  auto c = parse_compressor("threshold(0.8, values=fp32)");
  Payload p = c->encode(x, ctx);
  at::Tensor y = c->decode(p, ctx);
  EXPECT_TRUE(at::equal(y, x * (x.abs() > 0.8)));
  const int64_t n = (x.abs() > 0.8).sum().item<int64_t>();
  ASSERT_GT(n, 12) << "then the 12-byte bitmap is the cheapest index (int32: 4n, delta: >= n bytes)";
  EXPECT_EQ(static_cast<int64_t>(p.nbytes()), header_formula(2, 7) + 12 + 4 * n);
  EXPECT_EQ(p.params[3], n);
  at::Tensor none = round_trip(parse_compressor("threshold(100)"), x);
  EXPECT_EQ(none.count_nonzero().item<int64_t>(), 0);
}

TEST(Sparse, SharedModeSendsTheGradientOnTheForwardSupport) {
  at::manual_seed(10);
  at::Tensor x = at::randn({4, 30}), g = at::randn({4, 30});
  CodecContext ctx;
  for (const char* spec : {"topk(0.2, values=fp32)", "topk(0.1, scope=global, values=fp32, index=bitmap)",
                           "threshold(1.0, values=fp32)"}) {
    auto c = parse_compressor(spec);
    ASSERT_TRUE(c->supports_shared());
    Payload fwd = c->encode(x, ctx);
    at::Tensor mask = c->decode(fwd, ctx) != 0;
    Payload bwd = c->encode_shared(g, fwd, ctx);
    const int64_t n = mask.sum().item<int64_t>();
    EXPECT_EQ(static_cast<int64_t>(bwd.nbytes()), header_formula(2, 2) + 4 * n) << spec << ": values only";
    EXPECT_TRUE(at::equal(c->decode_shared(bwd, fwd, ctx), g * mask)) << spec;
    EXPECT_ERROR_CONTAINS(c->decode(bwd, ctx), "shared-mode");
    EXPECT_ERROR_CONTAINS(c->decode_shared(fwd, fwd, ctx), "7 params, expected 2");
    EXPECT_ERROR_CONTAINS(c->encode_shared(at::randn({4, 31}), fwd, ctx), "gradient of shape");
  }
  // RandK with rescale scales the gradient as the chain rule of x * D / k requires.
  auto r = parse_compressor("randk(0.2, rescale=true, values=fp32)");
  Payload fwd = r->encode(x, ctx);
  at::Tensor mask = r->decode(fwd, ctx) != 0;
  EXPECT_TRUE(
      all_close(r->decode_shared(r->encode_shared(g, fwd, ctx), fwd, ctx), g * mask * 5.0, "randk shared", 1e-6, 1e-6));
}

TEST(Sparse, CorruptPayloadsAreRejected) {
  at::manual_seed(11);
  at::Tensor x = at::randn({4, 30});
  CodecContext ctx;
  auto c = parse_compressor("topk(0.2, index=int32)");
  Payload p = c->encode(x, ctx);
  EXPECT_ERROR_CONTAINS(parse_compressor("randk(0.2)")->decode(p, ctx), "cannot decode a payload packed by 'topk'");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4)")->decode(p, ctx),
                        "quant: cannot decode a payload packed by 'topk'");
  Payload cut = p;
  cut.body = p.body.narrow(0, 0, p.body.numel() - 3);
  EXPECT_ERROR_CONTAINS(c->decode(cut, ctx), "topk: corrupt payload: the index takes");
  Payload tiny = p;
  tiny.body = p.body.narrow(0, 0, 5);
  EXPECT_ERROR_CONTAINS(c->decode(tiny, ctx), "topk: payload body truncated");
  Payload bad_k = p;
  bad_k.params[3] = 31;
  EXPECT_ERROR_CONTAINS(c->decode(bad_k, ctx), "corrupt payload: k=31");
  Payload bad_fmt = p;
  bad_fmt.params[5] = 7;
  EXPECT_ERROR_CONTAINS(c->decode(bad_fmt, ctx), "index format 7");
  Payload bad_index = p;
  bad_index.body = p.body.clone();
  bad_index.body.narrow(0, 0, 4).view(at::kInt).fill_(1000);
  EXPECT_ERROR_CONTAINS(c->decode(bad_index, ctx), "indices outside [0, 120)");
  // A serialized payload with a flipped byte in the header's body length.
  std::vector<uint8_t> bytes = p.serialize();
  bytes[p.header_bytes() - 8] ^= 1;
  EXPECT_ERROR_CONTAINS(Payload::deserialize(bytes.data(), bytes.size()), "body length mismatch");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(31)")->encode(x, ctx), "k=31 exceeds the 30 elements per row");
}

}  // namespace
}  // namespace tl
