// Subspace (Protocol Models): orthonormal seeded basis, lossless forward through a small 2-layer
// residual model once the weights writing into the residual stream are projected, the gradient
// U U^T g, k-wide messages, projection after an optimizer step.
#include "compression/stateful/subspace.h"

#include "autograd/ops.h"
#include "compression/boundary.h"
#include "compression/spec.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;

constexpr int64_t V = 20, D = 16, K = 4, H = 32, B = 2, T = 5;

// A pre-LN residual MLP stack: h = E[tok] + T[tok]; h += W2 gelu(W1 LN(h) + b1) + b2, twice.
struct TinyModel {
  Variable emb;
  std::vector<Variable> w1, b1, w2, b2;
  TinyModel() {
    emb = Variable(at::randn({V, D}) * 0.5, true);
    for (int l = 0; l < 2; ++l) {
      w1.emplace_back(at::randn({H, D}) * 0.3, true);
      b1.emplace_back(at::randn({H}) * 0.1, true);
      w2.emplace_back(at::randn({D, H}) * 0.3, true);
      b2.emplace_back(at::randn({D}) * 0.1, true);
    }
  }
  Variable forward(const at::Tensor& tok, Subspace& sub) {
    Variable h = sub.add_token_embedding(embedding(emb, tok), tok);  // (B, T, D)
    for (size_t l = 0; l < w1.size(); ++l) {
      Variable a = gelu(linear(layer_norm(h, {D}), w1[l], b1[l]));  // (B, T, H)
      h = h + linear(a, w2[l], b2[l]);                              // residual stream
    }
    return h;
  }
  // Everything that writes into the residual stream.
  std::vector<Variable> residual_writers() const { return {emb, w2[0], b2[0], w2[1], b2[1]}; }
};

TEST(Subspace, BasisIsOrthonormalAndSeeded) {
  Subspace::Options o;
  o.k = K;
  o.d = D;
  o.vocab = V;
  o.seed = 3;
  Subspace a(o), b(o);
  const at::Tensor& u = a.basis();
  ASSERT_EQ(u.sizes(), at::IntArrayRef({D, K}));
  EXPECT_TRUE(all_close(u.t().matmul(u), at::eye(K), "U^T U = I", 1e-5, 0));
  EXPECT_TRUE(all_close(b.basis(), u, "same seed, same U", 0, 0));
  EXPECT_TRUE(all_close(b.token_embedding(), a.token_embedding(), "same seed, same T", 0, 0));
  EXPECT_EQ(a.token_embedding().sizes(), at::IntArrayRef({V, D}));
  o.seed = 4;
  Subspace c(o);
  EXPECT_FALSE(c.basis().equal(u));
  for (auto& [n, v] : a.named_buffers()) EXPECT_FALSE(v.requires_grad()) << n << " is frozen";
  EXPECT_TRUE(a.named_parameters().empty());
}

TEST(Subspace, LosslessWhenWeightsAreProjected) {
  auto bnd = std::make_shared<Boundary>("cut", "subspace(4, d=16, vocab=20, seed=3)", "");
  auto sub = std::dynamic_pointer_cast<Subspace>(bnd->forward_codec());
  ASSERT_TRUE(sub);
  at::manual_seed(0);
  TinyModel model;
  const at::Tensor tok = at::randint(V, {B, T}, at::kLong);
  CodecContext ctx;
  ctx.token_ids = tok;

  // Unprojected weights: h - T[tok] has components outside span(U), which are lost.
  Variable h = model.forward(tok, *sub);
  const double before = (bnd->forward(h, ctx).data() - h.data()).norm().item<double>() / h.data().norm().item<double>();
  EXPECT_GT(before, 1e-2);

  sub->designate(model.residual_writers());  // W <- U U^T W, now and after every optimizer step
  h = model.forward(tok, *sub);
  Variable out = bnd->forward(h, ctx);
  EXPECT_TRUE(all_close(out.data(), h.data(), "decode(encode(h)) == h", 1e-5, 1e-5));
  EXPECT_EQ(bnd->stats().forward.last_bytes, identity_payload_bytes(at::empty({B, T, K})))
      << "k values per token on the wire";
  EXPECT_LT(bnd->stats().forward.rel_error_last, 1e-6);

  // An optimizer step moves the weights off the subspace; after_optimizer_step projects them back.
  {
    NoGradGuard no_grad;
    for (auto& w : model.residual_writers()) w.mutable_data().add_(at::randn(w.sizes()) * 0.05);
  }
  h = model.forward(tok, *sub);
  EXPECT_FALSE(all_close(bnd->forward(h, ctx).data(), h.data(), "off the subspace", 1e-5, 1e-5));
  bnd->after_optimizer_step();
  h = model.forward(tok, *sub);
  EXPECT_TRUE(all_close(bnd->forward(h, ctx).data(), h.data(), "lossless again after the step", 1e-5, 1e-5));
}

TEST(Subspace, GradientIsProjectedAndKWide) {
  auto bnd = std::make_shared<Boundary>("cut", "subspace(4, d=16, vocab=20)", "");
  auto sub = std::dynamic_pointer_cast<Subspace>(bnd->forward_codec());
  CodecContext ctx;
  ctx.token_ids = at::randint(V, {B, T}, at::kLong);
  Variable h(at::randn({B, T, D}), true);
  const at::Tensor g = at::randn({B, T, D});
  bnd->forward(h, ctx).backward(g);
  const at::Tensor& u = sub->basis();
  EXPECT_TRUE(all_close(h.grad(), g.matmul(u).matmul(u.t()), "dL/dh = U U^T g", 1e-5, 1e-5));
  EXPECT_EQ(bnd->stats().backward.last_bytes, identity_payload_bytes(at::empty({B, T, K})));
}

TEST(Subspace, ErrorsAndSpec) {
  auto bnd = std::make_shared<Boundary>("cut", "subspace(4, vocab=20)", "");
  try {
    bnd->forward(Variable(at::randn({B, T, D})), CodecContext{});
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token ids"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_compressor("subspace(32, d=16)"), c10::Error) << "k > d";
  EXPECT_THROW(parse_compressor("subspace(0)"), c10::Error);
  // Sizes are bounded (the spec fuzzer asked for vocab=9999999256: a 2.5 TB embedding).
  EXPECT_ERROR_CONTAINS(parse_compressor("subspace(8, d=64, vocab=9999999256)"), "vocab up to 4194304");
  EXPECT_ERROR_CONTAINS(parse_compressor("subspace(8, d=64000, vocab=4000000)"), "vocab x d up to 67108864");
  EXPECT_ERROR_CONTAINS(parse_compressor("subspace(60000, d=60000)"), "a basis of d x k");
  // Parsing builds no table (Note [subspace tables are lazy]): 999,999 x 64 floats wait for a model.
  auto big = parse_compressor("subspace(8, d=64, vocab=999999)");
  for (auto& [n, v] : big->named_buffers()) EXPECT_EQ(v.data().numel(), 0) << n << " was generated at parse time";
  auto c = parse_compressor("subspace(k=8, d=64, vocab=100, seed=2, wire=fp16)");
  EXPECT_EQ(parse_compressor(c->spec())->spec(), c->spec());
  // Without a vocabulary it is a plain projection: lossless on span(U).
  auto plain = std::make_shared<Boundary>("cut", "subspace(4, d=16)", "");
  auto sub = std::dynamic_pointer_cast<Subspace>(plain->forward_codec());
  at::Tensor x = at::randn({3, K}).matmul(sub->basis().t());
  EXPECT_TRUE(all_close(plain->forward(Variable(x)).data(), x, "in-span input", 1e-5, 1e-5));
}

}  // namespace
}  // namespace tl
