// Error feedback ef(C): the EF invariant e' = x + e - C(x + e), per boundary and per sample, the
// shape-change and eval policies, flush, spec round trip and rejected inner codecs.
#include "compression/spec.h"
#include "compression/stateful/error_feedback.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;

std::shared_ptr<ErrorFeedback> make_ef(const std::string& spec) {
  auto c = std::dynamic_pointer_cast<ErrorFeedback>(parse_compressor(spec));
  EXPECT_TRUE(c) << spec;
  return c;
}

using testing::round_trip;

TEST(ErrorFeedback, InvariantPerBoundary) {
  // Any inner codec: sparse, quantising (issue 18's hadquant) and structured (colsparse).
  for (const auto& [inner, name] : std::vector<std::pair<std::string, std::string>>{
           {"topk(0.1)", "topk"}, {"hadquant(2, tile=16)", "hadquant"}, {"colsparse(0.1, block=2)", "colsparse"}}) {
    SCOPED_TRACE(inner);
    auto ef = make_ef("ef(" + inner + ")");
    auto ref = parse_compressor(inner);
    at::manual_seed(0);
    CodecContext ctx;
    at::Tensor e = at::zeros({4, 32});
    for (int step = 0; step < 5; ++step) {
      at::Tensor x = at::randn({4, 32});
      at::Tensor e_before = ef->residual(x, ctx).clone();
      ASSERT_TRUE(all_close(e_before, e, "residual before step " + std::to_string(step), 0, 0));
      Payload p = ef->encode(x, ctx);
      EXPECT_EQ(p.codec, codec_id(name)) << "ef sends the inner codec's payload";
      at::Tensor c = round_trip(ref, x + e_before);  // C(x + e)
      at::Tensor e_after = ef->residual(x, ctx);
      EXPECT_TRUE(all_close(e_after, x + e_before - c, "e' = x + e - C(x + e), step " + std::to_string(step), 1e-6, 0));
      EXPECT_TRUE(all_close(ef->decode(p, ctx), c, "receiver gets C(x + e)", 0, 0));
      e = e_after.clone();
    }
    // The residual is nonzero (each drops or rounds away part of x + e) and is what the next
    // step adds.
    EXPECT_GT(e.abs().sum().item<double>(), 1.0);
  }
}

TEST(ErrorFeedback, InvariantPerSample) {
  auto ef = make_ef("ef(quant(2), per=sample)");
  auto ref = parse_compressor("quant(2)");
  at::manual_seed(1);
  std::map<int64_t, at::Tensor> e;  // per-sample reference residuals
  const std::vector<std::vector<int64_t>> batches = {{0, 1, 2}, {2, 3, 4}, {4, 0, 5}, {1, 2, 3}};
  for (const auto& ids_vec : batches) {
    CodecContext ctx;
    ctx.sample_ids = at::tensor(ids_vec, at::kLong);
    at::Tensor x = at::randn({3, 2, 5});
    at::Tensor ebatch = at::zeros({3, 2, 5});
    for (size_t i = 0; i < ids_vec.size(); ++i)
      if (e.count(ids_vec[i])) ebatch[i] = e[ids_vec[i]];
    ASSERT_TRUE(all_close(ef->residual(x, ctx), ebatch, "per-sample residual rows", 0, 0));
    ef->encode(x, ctx);
    at::Tensor expect = x + ebatch - round_trip(ref, x + ebatch);
    at::Tensor got = ef->residual(x, ctx);
    EXPECT_TRUE(all_close(got, expect, "per-sample e' = x + e - C(x + e)", 1e-6, 0));
    for (size_t i = 0; i < ids_vec.size(); ++i) e[ids_vec[i]] = expect[i].clone();
  }
}

TEST(ErrorFeedback, PerSampleNeedsIds) {
  auto ef = make_ef("ef(topk(0.5), per=sample)");
  CodecContext ctx;
  try {
    ef->encode(at::randn({2, 4}), ctx);
    FAIL() << "expected an error without sample ids";
  } catch (const c10::Error& err) {
    EXPECT_NE(std::string(err.what()).find("sample ids"), std::string::npos) << err.what();
  }
  ctx.sample_ids = at::tensor({3, 3}, at::kLong);
  EXPECT_THROW(ef->encode(at::randn({2, 4}), ctx), c10::Error) << "duplicate ids";
  ctx.sample_ids = at::tensor({0, 1, 2}, at::kLong);
  EXPECT_THROW(ef->encode(at::randn({2, 4}), ctx), c10::Error) << "one id per row";
}

TEST(ErrorFeedback, ShapeChangeResets) {
  auto ef = make_ef("ef(topk(0.25))");
  auto ref = parse_compressor("topk(0.25)");
  CodecContext ctx;
  at::manual_seed(2);
  ef->encode(at::randn({4, 8}), ctx);
  // A smaller last micro-batch: the residual restarts from zero (documented policy).
  at::Tensor x = at::randn({2, 8});
  EXPECT_EQ(ef->residual(x, ctx).abs().sum().item<double>(), 0.0);
  ef->encode(x, ctx);
  EXPECT_TRUE(all_close(ef->residual(x, ctx), x - round_trip(ref, x), "residual after reset", 1e-6, 0));
}

TEST(ErrorFeedback, EvalLeavesStateUntouched) {
  auto ef = make_ef("ef(topk(0.25))");
  auto ref = parse_compressor("topk(0.25)");
  CodecContext train;
  at::manual_seed(3);
  at::Tensor x = at::randn({4, 8});
  ef->encode(x, train);
  at::Tensor e = ef->residual(x, train).clone();
  CodecContext eval;
  eval.training = false;
  at::Tensor y = at::randn({4, 8});
  at::Tensor got = ef->decode(ef->encode(y, eval), eval);
  EXPECT_TRUE(all_close(got, round_trip(ref, y), "eval sends plain C(x)", 0, 0));
  EXPECT_TRUE(all_close(ef->residual(x, train), e, "residual unchanged by eval", 0, 0));
}

TEST(ErrorFeedback, FlushDeliversResidual) {
  auto ef = make_ef("ef(topk(0.25))");
  CodecContext ctx;
  at::manual_seed(4);
  ef->encode(at::randn({4, 8}), ctx);
  at::Tensor x = at::randn({4, 8});
  at::Tensor e = ef->residual(x, ctx).clone();
  EXPECT_TRUE(all_close(ef->flush(x, ctx), x + e, "flush = x + e", 1e-6, 0));
  EXPECT_EQ(ef->residual(x, ctx).abs().sum().item<double>(), 0.0);
}

TEST(ErrorFeedback, BackwardFormIsTheSameUpdate) {
  // Research form for gradients: c = C(g + e); e <- e + g - c. Check against the codec.
  auto ef = make_ef("ef(topk(0.2))");
  auto ref = parse_compressor("topk(0.2)");
  CodecContext ctx;
  at::manual_seed(5);
  at::Tensor e = at::zeros({3, 10});
  for (int i = 0; i < 3; ++i) {
    at::Tensor g = at::randn({3, 10});
    at::Tensor c = round_trip(ref, g + e);
    e = e + g - c;
    at::Tensor got = ef->decode(ef->encode(g, ctx), ctx);
    EXPECT_TRUE(all_close(got, c, "c = C(g + e)", 1e-6, 0));
    EXPECT_TRUE(all_close(ef->residual(g, ctx), e, "e <- e + g - c", 1e-5, 0));
  }
}

TEST(ErrorFeedback, SpecRoundTripAndState) {
  for (std::string spec : {"ef(topk(0.1))", "ef(quant(4), per=sample)", "ef(topk(0.1), per=sample, capacity=16)"}) {
    auto c = parse_compressor(spec);
    EXPECT_EQ(parse_compressor(c->spec())->spec(), c->spec()) << spec;
  }
  // The residual is a registered, checkpointed buffer; the inner codec is child "inner".
  auto ef = make_ef("ef(topk(0.1))");
  bool found = false;
  for (auto& [n, v] : ef->named_buffers()) found = found || n == "error";
  EXPECT_TRUE(found);
}

TEST(ErrorFeedback, RejectsInnerWithReceiverState) {
  try {
    parse_compressor("ef(ef21(topk(0.1)))");
    FAIL() << "expected an error";
  } catch (const c10::Error& err) {
    EXPECT_NE(std::string(err.what()).find("receiver state"), std::string::npos) << err.what();
  }
  EXPECT_THROW(parse_compressor("ef(per=sample)"), c10::Error) << "missing inner codec";
  EXPECT_THROW(parse_compressor("ef(topk(0.1), per=everywhere)"), c10::Error);
}

TEST(ErrorFeedback, DoublePrecisionStaysExact) {
  auto ef = make_ef("ef(topk(0.5))");
  auto ref = parse_compressor("topk(0.5)");
  CodecContext ctx;
  at::Tensor x = at::randn({2, 6}, at::kDouble);
  ef->encode(x, ctx);
  at::Tensor e = ef->residual(x, ctx);
  EXPECT_EQ(e.scalar_type(), at::kDouble);
  EXPECT_TRUE(all_close(e, x - round_trip(ref, x), "float64 residual", 1e-14, 0));
}

}  // namespace
}  // namespace tl
