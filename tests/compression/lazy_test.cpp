// Optimus-CC lazy error propagation lazy(powersgd(rank=r)): one buffer per boundary shared across
// micro-batches (M <- M + e; compress; e <- M - P Q^T), the carry policy, and epilogue-only
// compression through a Boundary.
#include "compression/boundary.h"
#include "compression/spec.h"
#include "compression/stateful/error_feedback.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

using testing::all_close;

std::shared_ptr<ErrorFeedback> make_lazy(const std::string& spec) {
  auto c = std::dynamic_pointer_cast<ErrorFeedback>(parse_compressor(spec));
  EXPECT_TRUE(c && c->options().lazy) << spec;
  return c;
}

TEST(LazyErrorPropagation, OneBufferSharedAcrossMicroBatches) {
  auto lazy = make_lazy("lazy(powersgd(rank=2))");
  at::manual_seed(0);
  at::Tensor e = at::zeros({12, 8});
  for (int64_t mb = 0; mb < 4; ++mb) {
    CodecContext ctx;
    ctx.micro_batch = mb;  // a different micro-batch each call: the buffer is still the same one
    at::Tensor g = at::randn({12, 8});
    ASSERT_TRUE(all_close(lazy->residual(g, ctx), e, "pending error before micro-batch " + std::to_string(mb), 0, 0));
    Payload p = lazy->encode(g, ctx);
    EXPECT_EQ(p.codec, codec_id("powersgd"));
    at::Tensor pq = lazy->decode(p, ctx);  // P Q^T
    at::Tensor sv = at::linalg_svdvals(pq);
    EXPECT_LT(sv[2].item<double>(), 1e-4 * sv[0].item<double>()) << "the message is rank <= r";
    at::Tensor m = g + e;  // M <- M + e
    e = lazy->residual(g, ctx).clone();
    EXPECT_TRUE(all_close(e, m - pq, "e <- M - P Q^T, micro-batch " + std::to_string(mb), 1e-5, 1e-5));
  }
  EXPECT_GT(e.norm().item<double>(), 0.1) << "rank-2 compression of rank-8 gradients leaves an error";
}

TEST(LazyErrorPropagation, CarryPolicy) {
  at::manual_seed(1);
  at::Tensor g = at::randn({6, 5});
  CodecContext ctx;
  auto keep = make_lazy("lazy(powersgd(rank=1))");
  auto drop = make_lazy("lazy(powersgd(rank=1), carry=microbatches)");
  keep->encode(g, ctx);
  drop->encode(g, ctx);
  at::Tensor e = keep->residual(g, ctx).clone();
  keep->after_optimizer_step();
  drop->after_optimizer_step();
  EXPECT_TRUE(all_close(keep->residual(g, ctx), e, "carry=steps keeps the error across steps", 0, 0));
  EXPECT_EQ(drop->residual(g, ctx).abs().sum().item<double>(), 0.0) << "carry=microbatches drops it";
  EXPECT_EQ(parse_compressor(drop->spec())->spec(), drop->spec());
  EXPECT_THROW(parse_compressor("lazy(powersgd(rank=1), carry=forever)"), c10::Error);
}

TEST(LazyErrorPropagation, EpilogueOnlyThroughBoundary) {
  // Backward-only compression (Optimus-CC): the forward is uncompressed; schedules switch backward
  // compression on for the critical-path sends only.
  auto b = std::make_shared<Boundary>("stage1", "", "lazy(powersgd(rank=1))");
  b->set_epilogue_only(true);
  EXPECT_TRUE(b->epilogue_only());
  auto lazy = std::dynamic_pointer_cast<ErrorFeedback>(b->backward_codec());
  ASSERT_TRUE(lazy);
  at::manual_seed(2);
  CodecContext ctx;
  const at::Tensor g1 = at::randn({16, 12}), g2 = at::randn({16, 12});

  // A critical-path send: compressed, the error stays in the buffer.
  b->set_backward_compression_enabled(true);
  Variable x1(at::randn({16, 12}), true);
  b->forward(x1, ctx).backward(g1);
  const at::Tensor e = lazy->residual(g1, ctx).clone();
  EXPECT_GT(e.norm().item<double>(), 1e-3);
  EXPECT_FALSE(all_close(x1.grad(), g1, "compressed", 1e-6, 0));
  const BoundaryStats s1 = b->stats();
  EXPECT_LT(s1.backward.last_bytes, identity_payload_bytes(g1));

  // Off the critical path: sent uncompressed, carrying the pending error, which is cleared.
  b->set_backward_compression_enabled(false);
  Variable x2(at::randn({16, 12}), true);
  b->forward(x2, ctx).backward(g2);
  EXPECT_TRUE(all_close(x2.grad(), g2 + e, "uncompressed send delivers g + e", 1e-6, 0));
  EXPECT_EQ(lazy->residual(g2, ctx).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(b->stats().backward.last_bytes, identity_payload_bytes(g2));
}

}  // namespace
}  // namespace tl
