// Learned autoencoder boundary: forward and gradients equal a manual computation with libtorch
// autograd, Xavier init, channel layout, the code-wide wire both ways, training, checkpoints.
#include "autograd/ops.h"
#include "compression/boundary.h"
#include "compression/spec.h"
#include "compression/stateful/autoencoder.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;

std::shared_ptr<Autoencoder> ae_of(const BoundaryPtr& b) {
  auto ae = std::dynamic_pointer_cast<Autoencoder>(b->forward_codec());
  EXPECT_TRUE(ae);
  return ae;
}

TEST(Autoencoder, ForwardAndGradientsMatchManual) {
  auto b = std::make_shared<Boundary>("cut", "ae(4)", "");
  at::manual_seed(0);
  Variable h(at::randn({3, 5, 8}), true);
  Variable out = b->forward(h);
  auto ae = ae_of(b);
  ASSERT_EQ(ae->encoder_weight().sizes(), at::IntArrayRef({4, 8}));
  ASSERT_EQ(ae->decoder_weight().sizes(), at::IntArrayRef({8, 4}));
  const at::Tensor g = at::randn({3, 5, 8});
  out.backward(g);

  // Reference: out = (h W_e^T) W_d^T with libtorch autograd.
  at::Tensor th = h.data().clone().requires_grad_(true);
  at::Tensor we = ae->encoder_weight().data().clone().requires_grad_(true);
  at::Tensor wd = ae->decoder_weight().data().clone().requires_grad_(true);
  at::Tensor ref = th.matmul(we.t()).matmul(wd.t());
  ref.backward(g);
  EXPECT_TRUE(all_close(out.data(), ref.detach(), "out = W_d W_e h", 1e-5, 1e-5));
  EXPECT_TRUE(all_close(h.grad(), th.grad(), "dL/dh", 1e-5, 1e-5));
  EXPECT_TRUE(all_close(ae->encoder_weight().grad(), we.grad(), "dL/dW_e", 1e-5, 1e-5));
  EXPECT_TRUE(all_close(ae->decoder_weight().grad(), wd.grad(), "dL/dW_d", 1e-5, 1e-5));

  // The parameters belong to the boundary (and so to the stage that owns it).
  std::set<std::string> names;
  for (auto& [n, v] : b->named_parameters()) names.insert(n);
  EXPECT_TRUE(names.count("forward.encoder") && names.count("forward.decoder"));
  // Both directions carry d_code = 4 values per token.
  const BoundaryStats s = b->stats();
  EXPECT_EQ(s.forward.last_bytes, identity_payload_bytes(at::empty({3, 5, 4})));
  EXPECT_EQ(s.backward.last_bytes, identity_payload_bytes(at::empty({3, 5, 4})));
  EXPECT_EQ(s.forward.raw_bytes, 3 * 5 * 8 * 4);
}

TEST(Autoencoder, XavierUniformInit) {
  Autoencoder::Options o;
  o.d_code = 32;
  o.d = 96;
  auto ae = std::make_shared<Autoencoder>(o);
  const double bound = std::sqrt(6.0 / (96 + 32));
  for (const at::Tensor& w : {ae->encoder_weight().data(), ae->decoder_weight().data()}) {
    EXPECT_LE(w.abs().max().item<double>(), bound);
    // U(-b, b) has variance b^2 / 3; 3072 draws: within 10%.
    EXPECT_NEAR(w.var().item<double>(), bound * bound / 3, 0.1 * bound * bound / 3);
  }
  // Seeded: the same seed gives the same weights, another seed others.
  auto same = std::make_shared<Autoencoder>(o);
  EXPECT_TRUE(all_close(same->encoder_weight().data(), ae->encoder_weight().data(), "same seed", 0, 0));
  o.seed = 7;
  auto other = std::make_shared<Autoencoder>(o);
  EXPECT_FALSE(other->encoder_weight().data().equal(ae->encoder_weight().data()));
}

TEST(Autoencoder, ChannelLayoutFor4D) {
  auto b = std::make_shared<Boundary>("conv_cut", "ae(3)", "");
  Variable h(at::randn({2, 8, 4, 4}), true);
  Variable out = b->forward(h);
  auto ae = ae_of(b);
  at::Tensor z = at::einsum("oc,bchw->bohw", {ae->encoder_weight().data(), h.data()});
  at::Tensor ref = at::einsum("co,bohw->bchw", {ae->decoder_weight().data(), z});
  EXPECT_TRUE(all_close(out.data(), ref, "channel autoencoder", 1e-5, 1e-5));
  EXPECT_EQ(b->stats().forward.last_bytes, identity_payload_bytes(at::empty({2, 3, 4, 4})));
  // layout=last on a 4-D input encodes the last dim instead.
  auto last = std::make_shared<Boundary>("cut", "ae(2, layout=last)", "");
  EXPECT_EQ(last->forward(Variable(at::randn({2, 8, 4, 4}))).sizes(), at::IntArrayRef({2, 8, 4, 4}));
  EXPECT_EQ(ae_of(last)->encoder_weight().sizes(), at::IntArrayRef({2, 4}));
}

TEST(Autoencoder, WireCodecPacksTheCode) {
  auto b = std::make_shared<Boundary>("cut", "ae(4, wire=fp16)", "");
  at::Tensor h = at::randn({6, 8});
  Variable out = b->forward(Variable(h));
  auto ae = ae_of(b);
  at::Tensor z = h.matmul(ae->encoder_weight().data().t());
  CodecContext ctx;
  auto fp16 = parse_compressor("fp16");
  Payload pz = fp16->encode(z, ctx);
  EXPECT_EQ(b->stats().forward.last_bytes, static_cast<int64_t>(pz.nbytes()));
  at::Tensor ref = fp16->decode(pz, ctx).matmul(ae->decoder_weight().data().t());
  EXPECT_TRUE(all_close(out.data(), ref, "decoder of the fp16 code", 1e-5, 1e-5));
  EXPECT_EQ(parse_compressor(ae->spec())->spec(), ae->spec());
}

TEST(Autoencoder, TrainsToReconstructLowRankData) {
  auto b = std::make_shared<Boundary>("cut", "ae(4, d=12)", "");
  at::manual_seed(1);
  const at::Tensor data = at::randn({64, 3}).matmul(at::randn({3, 12}));  // rank 3 <= d_code
  auto loss_of = [&]() { return mse_loss(b->forward(Variable(data)), Variable(data)); };
  const double initial = loss_of().item<double>();
  for (int step = 0; step < 300; ++step) {
    b->zero_grad();
    loss_of().backward();
    NoGradGuard no_grad;
    for (auto& p : b->parameters()) p.mutable_data().sub_(p.grad() * 0.05);
  }
  const double final_loss = loss_of().item<double>();
  EXPECT_LT(final_loss, 0.05 * initial) << "initial " << initial << " final " << final_loss;
}

TEST(Autoencoder, LazyWeightsRestoreFromCheckpoint) {
  auto b1 = std::make_shared<Boundary>("cut", "ae(3)", "");
  at::Tensor h = at::randn({4, 10});
  at::Tensor o1 = b1->forward(Variable(h)).data();
  auto b2 = std::make_shared<Boundary>("cut", "ae(3, seed=5)", "");  // other init, not materialised yet
  b2->load_state_dict(b1->state_dict());
  EXPECT_TRUE(all_close(b2->forward(Variable(h)).data(), o1, "restored autoencoder", 0, 0));
  EXPECT_THROW(b2->forward(Variable(at::randn({4, 11}))), c10::Error) << "another width";
}

TEST(Autoencoder, MisuseIsAnError) {
  auto ae = parse_compressor("ae(4)");
  CodecContext ctx;
  try {
    ae->encode(at::randn({2, 8}), ctx);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_compressor("ae(0)"), c10::Error);
  // Sizes are bounded, so a spec cannot ask for terabytes of weights.
  EXPECT_ERROR_CONTAINS(parse_compressor("ae(99999999, d=64)"), "d_code=99999999, d=64 is too large");
  EXPECT_ERROR_CONTAINS(parse_compressor("ae(60000, d=60000)"), "weights of d x d_code up to 67108864");
  EXPECT_THROW(parse_compressor("ef(ae(4))"), c10::Error) << "transforms cannot be wrapped";
  EXPECT_THROW(std::make_shared<Boundary>("cut", "topk(0.5)", "ae(4)"), c10::Error) << "ae is a forward codec";
}

}  // namespace
}  // namespace tl
