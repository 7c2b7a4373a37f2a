// PowerSGD: exact on matrices of rank <= r from the first call, warm start converging to the
// best rank-r approximation, Q carried by checkpoints, shared mode projecting on the forward
// basis, exact payload sizes and corrupt payloads.
#include "compression/codecs/powersgd.h"

#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::header_formula;
using testing::round_trip;

at::Tensor low_rank(int64_t rows, int64_t cols, int64_t rank) {
  return at::randn({rows, rank}).mm(at::randn({rank, cols}));
}

TEST(PowerSgd, ExactOnMatricesOfRankAtMostR) {
  at::manual_seed(0);
  for (int64_t rank : {1, 3, 4}) {
    at::Tensor m = low_rank(40, 24, rank);
    auto c = parse_compressor("powersgd(4)");
    // One step from the seeded Q: P = orth(M Q) spans M's columns, so P P^T M = M.
    EXPECT_TRUE(all_close(round_trip(c, m), m, "first call, rank " + std::to_string(rank), 1e-4, 1e-4));
    // And again from the warm-started Q, on a new matrix of the same rank.
    at::Tensor m2 = low_rank(40, 24, rank);
    EXPECT_TRUE(all_close(round_trip(c, m2), m2, "warm-started call, rank " + std::to_string(rank), 1e-4, 1e-4));
  }
  // (B, T, hidden) viewed as (B*T, hidden).
  at::Tensor t = low_rank(6 * 5, 16, 2).view({6, 5, 16});
  EXPECT_TRUE(all_close(round_trip(parse_compressor("powersgd(2)"), t), t, "3-D, dim=-1", 1e-4, 1e-4));
  // rank larger than the matrix: the matrix itself.
  at::Tensor small = at::randn({3, 5});
  EXPECT_TRUE(all_close(round_trip(parse_compressor("powersgd(16)"), small), small, "r > min(rows, cols)", 1e-5, 1e-4));
}

TEST(PowerSgd, WarmStartConvergesToTheBestRankR) {
  at::manual_seed(1);
  // Singular values 10, 8, 6, 4 and then 0.1: a clear gap after rank 4.
  at::Tensor u = std::get<0>(at::linalg_qr(at::randn({60, 8})));
  at::Tensor v = std::get<0>(at::linalg_qr(at::randn({30, 8})));
  at::Tensor sv = at::tensor({10.0, 8.0, 6.0, 4.0, 0.1, 0.1, 0.1, 0.1}, at::kFloat);
  at::Tensor m = u.mm(at::diag(sv)).mm(v.t());
  const double best = std::sqrt(4 * 0.01);  // ||tail||_F
  auto c = parse_compressor("powersgd(4)");
  const double first = (round_trip(c, m) - m).norm().item<double>();
  double last = first;
  for (int i = 0; i < 5; ++i) last = (round_trip(c, m) - m).norm().item<double>();
  EXPECT_LE(last, first + 1e-6);
  EXPECT_LT(last, 1.01 * best) << "first " << first << ", after 6 calls " << last << ", optimum " << best;
}

TEST(PowerSgd, WarmStartIsCheckpointed) {
  at::manual_seed(2);
  at::Tensor m = at::randn({20, 12});
  CodecContext ctx;
  auto a = std::dynamic_pointer_cast<PowerSgd>(parse_compressor("powersgd(3, seed=5)"));
  EXPECT_EQ(a->warm_start().numel(), 0);
  a->encode(m, ctx);
  EXPECT_EQ(a->warm_start().sizes(), (std::vector<int64_t>{12, 3}));
  TensorMap state = a->state_dict();
  for (auto& [name, t] : state) t = t.clone();
  auto b = parse_compressor("powersgd(3, seed=5)");
  b->load_state_dict(state);  // the empty q takes the checkpoint's shape
  EXPECT_TRUE(testing::same_payload(a->encode(m, ctx), b->encode(m, ctx)));
  // A different seed starts elsewhere.
  auto other = parse_compressor("powersgd(3, seed=6)");
  auto fresh = parse_compressor("powersgd(3, seed=5)");
  EXPECT_FALSE(testing::same_payload(other->encode(m, ctx), fresh->encode(m, ctx)));
}

TEST(PowerSgd, SizesAndSharedMode) {
  at::manual_seed(3);
  CodecContext ctx;
  at::Tensor x = at::randn({8, 10, 32}), g = at::randn({8, 10, 32});
  for (const char* vt : {"fp32", "fp16"}) {
    const int64_t es = std::string(vt) == "fp32" ? 4 : 2;
    auto c = parse_compressor(std::string("powersgd(4, values=") + vt + ")");
    Payload fwd = c->encode(x, ctx);
    EXPECT_EQ(static_cast<int64_t>(fwd.nbytes()), header_formula(3, 6) + (80 * 4 + 32 * 4) * es) << vt;
    ASSERT_TRUE(c->supports_shared());
    Payload bwd = c->encode_shared(g, fwd, ctx);
    EXPECT_EQ(static_cast<int64_t>(bwd.nbytes()), header_formula(3, 2) + 32 * 4 * es) << vt << ": Q_g only";
    // Receiver: P P^T G with the forward's P as sent.
    at::Tensor p =
        fwd.body.narrow(0, 0, 80 * 4 * es).view(es == 4 ? at::kFloat : at::kHalf).to(at::kFloat).view({80, 4});
    at::Tensor gm = g.reshape({80, 32});
    at::Tensor expect = p.mm(p.t().mm(gm)).view({8, 10, 32});
    EXPECT_TRUE(all_close(c->decode_shared(bwd, fwd, ctx), expect, std::string("shared ") + vt, 1e-2, 1e-2));
  }
  // Exact for gradients in the span of the forward basis.
  auto c = parse_compressor("powersgd(4)");
  at::Tensor m = low_rank(80, 32, 4).view({8, 10, 32});
  Payload fwd = c->encode(m, ctx);
  at::Tensor in_span = m * -0.5;  // P spans m's columns
  EXPECT_TRUE(all_close(c->decode_shared(c->encode_shared(in_span, fwd, ctx), fwd, ctx), in_span, "gradient in span",
                        1e-4, 1e-4));
  EXPECT_ERROR_CONTAINS(c->decode(c->encode_shared(g, fwd, ctx), ctx), "shared-mode");
}

TEST(PowerSgd, CorruptPayloadsAreRejected) {
  CodecContext ctx;
  auto c = parse_compressor("powersgd(2)");
  Payload p = c->encode(at::randn({6, 5}), ctx);
  Payload cut = p;
  cut.body = p.body.narrow(0, 0, p.body.numel() - 4);
  EXPECT_ERROR_CONTAINS(c->decode(cut, ctx), "powersgd: payload body truncated");
  Payload extra = p;
  extra.body = at::cat({p.body, at::zeros({4}, at::kByte)});
  EXPECT_ERROR_CONTAINS(c->decode(extra, ctx), "bytes besides P and Q");
  Payload rank = p;
  rank.params[1] = 7;
  EXPECT_ERROR_CONTAINS(c->decode(rank, ctx), "corrupt payload: rank 7");
  EXPECT_ERROR_CONTAINS(parse_compressor("powersgd(2, dim=3)")->encode(at::randn({6, 5}), ctx),
                        "dim=3 is out of range");
}

}  // namespace
}  // namespace tl
