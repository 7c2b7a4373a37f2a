// EF21: A <- A + C(x - A) at both ends; the two copies stay identical and follow the formula.
#include "compression/spec.h"
#include "compression/stateful/error_feedback.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;

std::shared_ptr<EF21> make_ef21(const std::string& spec) {
  auto c = std::dynamic_pointer_cast<EF21>(parse_compressor(spec));
  EXPECT_TRUE(c) << spec;
  return c;
}

using testing::round_trip;

TEST(EF21, StateIdenticalAtBothEndsAndFollowsFormula) {
  auto ef21 = make_ef21("ef21(topk(0.2))");
  auto ref = parse_compressor("topk(0.2)");
  CodecContext ctx;
  at::manual_seed(0);
  at::Tensor a = at::zeros({4, 16});
  for (int step = 0; step < 6; ++step) {
    at::Tensor x = at::randn({4, 16});
    Payload p = ef21->encode(x, ctx);
    EXPECT_EQ(p.codec, codec_id("topk")) << "ef21 sends C's payload of x - A";
    at::Tensor out = ef21->decode(p, ctx);
    a = a + round_trip(ref, x - a);  // A <- A + C(x - A)
    const std::string s = " step " + std::to_string(step);
    EXPECT_TRUE(all_close(ef21->sender_state(), a, "sender A" + s, 1e-5, 0));
    EXPECT_TRUE(all_close(ef21->receiver_state(), ef21->sender_state(), "receiver A == sender A" + s, 0, 0));
    EXPECT_TRUE(all_close(out, a, "receiver outputs A" + s, 1e-5, 0));
  }
}

TEST(EF21, TracksAFixedInput) {
  // With x fixed, ||x - A|| shrinks every step (TopK keeps the largest part of the remainder).
  auto ef21 = make_ef21("ef21(topk(0.25))");
  CodecContext ctx;
  at::manual_seed(1);
  at::Tensor x = at::randn({2, 32});
  double prev = x.norm().item<double>();
  for (int step = 0; step < 30; ++step) {
    ef21->decode(ef21->encode(x, ctx), ctx);
    const double err = (x - ef21->receiver_state()).norm().item<double>();
    EXPECT_LE(err, prev + 1e-6) << "step " << step;
    prev = err;
  }
  EXPECT_LT(prev, 1e-3 * x.norm().item<double>());
}

TEST(EF21, ShapeChangeResetsBothEnds) {
  auto ef21 = make_ef21("ef21(quant(4))");
  CodecContext ctx;
  at::manual_seed(2);
  ef21->decode(ef21->encode(at::randn({4, 8}), ctx), ctx);
  at::Tensor x = at::randn({3, 8});
  at::Tensor out = ef21->decode(ef21->encode(x, ctx), ctx);
  EXPECT_TRUE(all_close(out, round_trip(parse_compressor("quant(4)"), x), "fresh A after a shape change", 1e-6, 0));
  EXPECT_TRUE(all_close(ef21->receiver_state(), ef21->sender_state(), "ends agree after reset", 0, 0));
}

TEST(EF21, EvalIsPlainCodecAndCheckpointCarriesState) {
  auto ef21 = make_ef21("ef21(topk(0.5))");
  CodecContext ctx;
  at::manual_seed(3);
  at::Tensor x = at::randn({2, 8});
  ef21->decode(ef21->encode(x, ctx), ctx);
  at::Tensor a = ef21->sender_state().clone();
  CodecContext eval;
  eval.training = false;
  at::Tensor y = at::randn({2, 8});
  EXPECT_TRUE(all_close(ef21->decode(ef21->encode(y, eval), eval), round_trip(parse_compressor("topk(0.5)"), y),
                        "eval: C(x)", 0, 0));
  EXPECT_TRUE(all_close(ef21->sender_state(), a, "eval leaves A", 0, 0));

  // A fresh codec restored from the state dict continues identically.
  auto restored = make_ef21(ef21->spec());
  restored->load_state_dict(ef21->state_dict());
  at::Tensor z = at::randn({2, 8});
  at::Tensor o1 = ef21->decode(ef21->encode(z, ctx), ctx);
  at::Tensor o2 = restored->decode(restored->encode(z, ctx), ctx);
  EXPECT_TRUE(all_close(o1, o2, "restored EF21 continues identically", 0, 0));
}

}  // namespace
}  // namespace tl
