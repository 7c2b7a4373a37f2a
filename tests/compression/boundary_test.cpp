// Boundary: gradients of every backward mode, the inference toggle, exact byte statistics, error
// and density, sender/receiver halves (with 1F1B order in shared mode), checkpoint round trip of
// the codecs' state, construction errors.
#include "compression/boundary.h"

#include "compression/spec.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

using testing::all_close;

at::Tensor round_trip(const std::string& spec, const at::Tensor& x) {
  auto c = parse_compressor(spec);
  CodecContext ctx;
  return c->decode(c->encode(x, ctx), ctx);
}

int64_t payload_bytes(const std::string& spec, const at::Tensor& x) {
  CodecContext ctx;
  return static_cast<int64_t>(parse_compressor(spec)->encode(x, ctx).nbytes());
}

// Runs x through the boundary and backpropagates g; returns (output, dL/dx).
std::pair<at::Tensor, at::Tensor> run(const BoundaryPtr& b, const at::Tensor& x, const at::Tensor& g) {
  Variable v(x.clone(), true);
  Variable out = b->forward(v);
  out.backward(g);
  return {out.data(), v.grad()};
}

TEST(Boundary, StraightThroughGradientIsIdentity) {
  auto b = std::make_shared<Boundary>("cut", "topk(0.25)", "", BackwardMode::StraightThrough);
  at::manual_seed(0);
  const at::Tensor x = at::randn({4, 16}), g = at::randn({4, 16});
  auto [out, grad] = run(b, x, g);
  EXPECT_TRUE(all_close(out, round_trip("topk(0.25)", x), "forward is TopK", 0, 0));
  EXPECT_TRUE(all_close(grad, g, "straight-through: dL/dx = g", 0, 0));
  EXPECT_EQ(b->stats().backward.last_bytes, identity_payload_bytes(g));
}

TEST(Boundary, SharedAppliesTheForwardMask) {
  auto b = std::make_shared<Boundary>("cut", "topk(0.25)", "", BackwardMode::Shared);
  at::manual_seed(1);
  const at::Tensor x = at::randn({4, 16}), g = at::randn({4, 16});
  auto [out, grad] = run(b, x, g);
  const at::Tensor mask = out.ne(0);
  EXPECT_EQ(mask.sum().item<int64_t>(), 16) << "TopK 25% of 64 keeps 16";
  // TopK sends values in fp16 (its default), the gradient's too: relative rounding <= 2^-11.
  EXPECT_TRUE(all_close(grad, g * mask, "shared: gradient on the forward support", 0, 1e-3));
  EXPECT_LT(b->stats().backward.last_bytes, identity_payload_bytes(g));
  EXPECT_NEAR(b->stats().backward.density_last, 0.25, 1e-9);
}

TEST(Boundary, IndependentUsesTheBackwardCodec) {
  auto b = std::make_shared<Boundary>("cut", "topk(0.25)", "topk(0.5)", BackwardMode::Independent);
  at::manual_seed(2);
  const at::Tensor x = at::randn({4, 16}), g = at::randn({4, 16});
  auto [out, grad] = run(b, x, g);
  EXPECT_TRUE(all_close(grad, round_trip("topk(0.5)", g), "independent: dL/dx = C_b(g)", 0, 0));
  EXPECT_EQ(b->stats().backward.last_bytes, payload_bytes("topk(0.5)", g));
}

TEST(Boundary, NoneGivesZeroGradient) {
  auto b = std::make_shared<Boundary>("cut", "quant(4)", "none", BackwardMode::None);
  const at::Tensor x = at::randn({3, 8}), g = at::randn({3, 8});
  auto [out, grad] = run(b, x, g);
  ASSERT_TRUE(grad.defined());
  EXPECT_EQ(grad.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(b->stats().backward.bytes, 0);
  EXPECT_FALSE(b->sends_gradient());
}

TEST(Boundary, GradcheckOfIdentityAndTransforms) {
  // An uncompressed boundary and an autoencoder boundary are exact differentiable functions.
  auto ident = std::make_shared<Boundary>("cut", "", "");
  EXPECT_TRUE(testing::gradcheck([&](const variable_list& v) { return ident->forward(v[0]); },
                                 {at::randn({2, 3}, at::kDouble)}, "identity boundary"));
  auto ae = std::make_shared<Boundary>("cut", "ae(2, d=3)", "");
  ae->to(at::kDouble);
  EXPECT_TRUE(testing::gradcheck([&](const variable_list& v) { return ae->forward(v[0]); },
                                 {at::randn({2, 3}, at::kDouble)}, "autoencoder boundary"));
}

TEST(Boundary, InferenceToggle) {
  const at::Tensor x = at::randn({4, 8});
  auto off = std::make_shared<Boundary>("cut", "quant(2)", "", BackwardMode::StraightThrough, false);
  auto on = std::make_shared<Boundary>("cut", "quant(2)", "", BackwardMode::StraightThrough, true);
  const at::Tensor q = round_trip("quant(2)", x);
  EXPECT_TRUE(all_close(off->forward(Variable(x)).data(), q, "training always compresses", 0, 0));
  off->eval();
  on->eval();
  off->reset_stats();
  EXPECT_TRUE(all_close(off->forward(Variable(x)).data(), x, "eval, toggle off: identity", 0, 0));
  EXPECT_EQ(off->stats().forward.messages, 0) << "nothing sent";
  EXPECT_TRUE(all_close(on->forward(Variable(x)).data(), q, "eval, toggle on: compressed", 0, 0));
  off->set_active_at_inference(true);
  EXPECT_TRUE(all_close(off->forward(Variable(x)).data(), q, "toggled on", 0, 0));
  off->train();
  off->set_active_at_inference(false);
  EXPECT_TRUE(all_close(off->forward(Variable(x)).data(), q, "toggle only matters in eval", 0, 0));
}

TEST(Boundary, StatisticsAreExact) {
  auto b = std::make_shared<Boundary>("cut", "quant(4)", "topk(0.1)");
  at::manual_seed(3);
  double err_sum = 0;
  int64_t bytes = 0, bwd_bytes = 0;
  for (int i = 0; i < 3; ++i) {
    const at::Tensor x = at::randn({8, 32}), g = at::randn({8, 32});
    auto [out, grad] = run(b, x, g);
    bytes += payload_bytes("quant(4)", x);
    bwd_bytes += payload_bytes("topk(0.1)", g);
    const double err = ((x - out).norm() / x.norm()).item<double>();
    err_sum += err;
    const BoundaryStats s = b->stats();
    EXPECT_EQ(s.forward.last_bytes, payload_bytes("quant(4)", x));
    EXPECT_NEAR(s.forward.rel_error_last, err, 1e-6);
    EXPECT_NEAR(s.forward.density_last, out.ne(0).sum().item<double>() / x.numel(), 1e-12);
    EXPECT_NEAR(s.backward.rel_error_last, ((g - grad).norm() / g.norm()).item<double>(), 1e-6);
    EXPECT_NEAR(s.backward.density_last, grad.ne(0).sum().item<double>() / g.numel(), 1e-12);
  }
  const BoundaryStats s = b->stats();
  EXPECT_EQ(s.forward.messages, 3);
  EXPECT_EQ(s.forward.bytes, bytes);
  EXPECT_EQ(s.backward.bytes, bwd_bytes);
  EXPECT_EQ(s.forward.raw_bytes, 3 * 8 * 32 * 4);
  EXPECT_EQ(s.backward.raw_bytes, 3 * 8 * 32 * 4);
  EXPECT_NEAR(s.forward.rel_error_mean, err_sum / 3, 1e-6);
  EXPECT_GT(s.forward.ratio(), 4.0);
  b->reset_stats();
  EXPECT_EQ(b->stats().forward.bytes, 0);
  EXPECT_EQ(b->stats().backward.measured, 0);
}

TEST(Boundary, IdentitySpecsCountUncompressedBytes) {
  for (std::string spec : {"", "none", "identity"}) {
    auto b = std::make_shared<Boundary>("cut", spec, spec);
    const at::Tensor x = at::randn({2, 3, 5}), g = at::randn({2, 3, 5});
    auto [out, grad] = run(b, x, g);
    EXPECT_TRUE(out.equal(x) && grad.equal(g)) << "'" << spec << "'";
    EXPECT_EQ(b->stats().forward.bytes, payload_bytes("identity", x)) << "'" << spec << "'";
    EXPECT_EQ(b->stats().backward.bytes, payload_bytes("identity", g)) << "'" << spec << "'";
    EXPECT_EQ(b->stats().forward.rel_error_last, 0.0);
  }
}

TEST(Boundary, HalvesMatchInProcessInOneFOneBOrder) {
  // Shared mode across "processes": two micro-batches forward, then backward in reverse order,
  // for every codec with a shared mode that keeps per-micro-batch support.
  for (const char* spec : {"topk(0.25)", "colsparse(0.25, block=2)", "colsparse(0.25, block=3) | quant(8)"}) {
    SCOPED_TRACE(spec);
    auto sender = std::make_shared<Boundary>("cut", spec, "", BackwardMode::Shared);
    auto receiver = std::make_shared<Boundary>("cut", spec, "", BackwardMode::Shared);
    auto local = std::make_shared<Boundary>("cut", spec, "", BackwardMode::Shared);
    at::manual_seed(4);
    std::vector<at::Tensor> xs = {at::randn({4, 8}), at::randn({4, 8})}, gs = {at::randn({4, 8}), at::randn({4, 8})};
    std::vector<Payload> wire(2);
    std::vector<at::Tensor> received(2);
    for (int64_t mb = 0; mb < 2; ++mb) {
      CodecContext ctx;
      ctx.micro_batch = mb;
      Payload p = sender->send_forward(sender->sender_transform(Variable(xs[mb]), ctx).data(), ctx);
      Payload copy = Payload::deserialize(p.serialize().data(), p.nbytes());  // over the wire
      received[mb] = receiver->receiver_transform(Variable(receiver->receive_forward(copy, ctx)), ctx).data();
    }
    for (int64_t mb = 1; mb >= 0; --mb) {
      CodecContext ctx;
      ctx.micro_batch = mb;
      Payload p = receiver->send_backward(gs[mb], ctx);
      at::Tensor grad = sender->receive_backward(Payload::deserialize(p.serialize().data(), p.nbytes()), ctx);
      auto [out, ref_grad] = run(local, xs[mb], gs[mb]);
      EXPECT_TRUE(all_close(received[mb], out, "forward halves == in-process, mb " + std::to_string(mb), 0, 0));
      EXPECT_TRUE(all_close(grad, ref_grad, "backward halves == in-process, mb " + std::to_string(mb), 0, 0));
    }
    EXPECT_EQ(sender->stats().forward.bytes, local->stats().forward.bytes);
    EXPECT_EQ(receiver->stats().backward.bytes, local->stats().backward.bytes);
    // A gradient for a micro-batch whose forward payload is gone is an error.
    CodecContext ctx;
    ctx.micro_batch = 0;
    EXPECT_THROW(receiver->send_backward(gs[0], ctx), c10::Error);
  }
}

TEST(Boundary, CheckpointRoundTripOfCodecState) {
  auto make = [] { return std::make_shared<Boundary>("cut", "ef(topk(0.2))", "ef21(quant(4))"); };
  auto a = make();
  at::manual_seed(5);
  for (int i = 0; i < 3; ++i) run(a, at::randn({4, 8}), at::randn({4, 8}));
  TensorMap state = a->state_dict();
  EXPECT_TRUE(state.count("forward.error") && state.count("backward.state_sender") &&
              state.count("backward.state_receiver"));
  EXPECT_EQ(state.at("forward.error").sizes(), at::IntArrayRef({4, 8}));
  auto b = make();  // fresh: its buffers are still empty
  b->load_state_dict(state);
  const at::Tensor x = at::randn({4, 8}), g = at::randn({4, 8});
  auto [oa, ga] = run(a, x, g);
  auto [ob, gb] = run(b, x, g);
  EXPECT_TRUE(all_close(ob, oa, "restored forward EF", 0, 0));
  EXPECT_TRUE(all_close(gb, ga, "restored backward EF21", 0, 0));
  for (auto& [n, t] : a->state_dict()) EXPECT_TRUE(t.equal(b->state_dict().at(n))) << n;
}

TEST(Boundary, CudaMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::pair<std::string, std::string>> specs = {
      {"ef(topk(0.25))", "ef21(topk(0.5))"},
      {"aqsgd(topk(0.5), warmup=1)", "lazy(powersgd(rank=2))"},
      {"ae(4, d=8)", "topk(0.5)"}};
  for (const auto& [fwd, bwd] : specs) {
    auto cpu = std::make_shared<Boundary>("cut", fwd, bwd);
    auto gpu = std::make_shared<Boundary>("cut", fwd, bwd);
    gpu->to(at::kCUDA);
    at::manual_seed(6);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const at::Tensor x = at::randn({4, 8}), g = at::randn({4, 8});
      CodecContext ctx;
      ctx.epoch = epoch;
      ctx.sample_ids = at::tensor({3, 1, 0, 2}, at::kLong);
      cpu->set_context(ctx);
      ctx.sample_ids = ctx.sample_ids.to(at::kCUDA);
      gpu->set_context(ctx);
      auto [oc, gc] = run(cpu, x, g);
      auto [og, gg] = run(gpu, x.to(at::kCUDA), g.to(at::kCUDA));
      const std::string label = fwd + " / " + bwd + ", step " + std::to_string(epoch);
      EXPECT_TRUE(all_close(og.cpu(), oc, "CUDA forward, " + label, 1e-4, 1e-4));
      EXPECT_TRUE(all_close(gg.cpu(), gc, "CUDA backward, " + label, 1e-4, 1e-4));
    }
    EXPECT_EQ(gpu->stats().forward.bytes, cpu->stats().forward.bytes) << fwd;
  }
}

TEST(Boundary, ConstructionErrors) {
  auto expect_error = [](auto make, const std::string& needle) {
    try {
      make();
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([] { Boundary("cut", "quant(4)", "", BackwardMode::Shared); }, "shared");
  expect_error([] { Boundary("cut", "topk(0.1)", "quant(4)", BackwardMode::Shared); }, "backward spec");
  expect_error([] { Boundary("cut", "topk(0.1)", "quant(4)", BackwardMode::StraightThrough); }, "straight-through");
  expect_error([] { Boundary("layer3", "topkk(0.1)", ""); }, "layer3");
  expect_error([] { parse_backward_mode("sometimes"); }, "straight-through");
  EXPECT_EQ(parse_backward_mode("ste"), BackwardMode::StraightThrough);
  // A boundary not owned by a shared_ptr cannot record a backward.
  Boundary stack("cut", "quant(4)", "");
  expect_error([&] { stack.forward(Variable(at::randn({2, 2}), true)); }, "shared_ptr");
  EXPECT_NE(std::make_shared<Boundary>("cut", "topk(0.1)", "", BackwardMode::Shared)->describe().find("mode=shared"),
            std::string::npos);
}

}  // namespace
}  // namespace tl
