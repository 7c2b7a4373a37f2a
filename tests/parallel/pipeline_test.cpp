// The in-process pipeline: a split ResNet with identity boundaries computes exactly what the
// unsplit model computes (outputs and gradients); micro-batches accumulate the full-batch gradient
// where samples are independent, and BatchNorm's per-micro-batch statistics are what the
// documentation says; the inference toggle; byte statistics; sample ids reaching the codecs.
#include "parallel/pipeline.h"

#include "layers/models/resnet.h"
#include "layers/optim/grad_utils.h"
#include "parallel/local_executor.h"
#include "tests/common/testing.h"
#include "tests/parallel/small_resnet.h"

namespace tl {
namespace {
using testing::all_close;

using testing::small_resnet;

using testing::ce;

Batch batch_of(const at::Tensor& x, const at::Tensor& y, const at::Tensor& ids = {}) {
  Batch b;
  b.input = x;
  b.target = y;
  b.sample_ids = ids;
  b.units = at::ones({x.size(0)}, at::kLong);
  return b;
}

std::vector<BoundarySpec> specs(size_t n, const std::string& fwd = "identity", const std::string& bwd = "identity") {
  BoundarySpec s;
  s.forward = fwd;
  s.backward = bwd;
  return std::vector<BoundarySpec>(n, s);
}

std::map<std::string, at::Tensor> grads_of(const Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = p.grad().defined() ? p.grad().clone() : at::Tensor();
  return out;
}

// One training step of `pipe` in this process under 1F1B.
StepResult step(Pipeline& pipe, const Batch& batch, int64_t micro_batches) {
  return LocalExecutor(pipe, ce).train_step(batch, micro_batches, {});
}

TEST(Pipeline, IdentityBoundariesMatchTheUnsplitModel) {
  auto reference = small_resnet(3);
  auto model = small_resnet(3);
  auto pipe = Pipeline::build(model, {"layer1", "layer2", "layer3"}, specs(3));
  ASSERT_EQ(pipe->num_stages(), 4u);
  at::Tensor x = at::randn({6, 1, 12, 12}), y = at::randint(0, 10, {6}, at::kLong);

  Variable ref_loss = cross_entropy(reference->forward(Variable(x)), y);
  ref_loss.backward();
  pipe->zero_grad();
  StepResult r = step(*pipe, batch_of(x, y), 1);
  EXPECT_NEAR(r.loss, ref_loss.item<double>(), 1e-6);
  EXPECT_EQ(r.rows, 6);
  auto ref_grads = grads_of(*reference);
  for (const auto& [name, g] : grads_of(*model))
    EXPECT_TRUE(all_close(g, ref_grads.at(name), "grad " + name, 1e-6, 1e-5));
  // Every parameter once, under the model's names.
  EXPECT_EQ(pipe->named_parameters().size(), reference->named_parameters().size());
  EXPECT_EQ(pipe->named_parameters().front().first, "model." + reference->named_parameters().front().first);
  // Running statistics updated identically.
  auto ref_state = reference->state_dict();
  for (const auto& [name, t] : model->state_dict())
    EXPECT_TRUE(all_close(t.to(at::kDouble), ref_state.at(name).to(at::kDouble), "state " + name, 1e-6, 1e-5));
}

TEST(Pipeline, MicroBatchesGiveTheFullBatchGradientWhenSamplesAreIndependent) {
  // In eval mode BatchNorm uses its running statistics, so samples are independent and the
  // accumulated gradient of M micro-batches (sizes 3, 3, 1 for B = 7, M = 3) equals M = 1's.
  auto a = small_resnet(5), b = small_resnet(5);
  auto pa = Pipeline::build(a, {"layer1", "layer2"}, specs(2));
  auto pb = Pipeline::build(b, {"layer1", "layer2"}, specs(2));
  pa->eval();
  pb->eval();
  at::Tensor x = at::randn({7, 1, 10, 10}), y = at::randint(0, 10, {7}, at::kLong);
  pa->zero_grad();
  pb->zero_grad();
  StepResult ra = step(*pa, batch_of(x, y), 1);
  StepResult rb = step(*pb, batch_of(x, y), 3);
  EXPECT_EQ(rb.micro_batches, 3);
  EXPECT_NEAR(ra.loss, rb.loss, 1e-6);
  EXPECT_EQ(ra.correct, rb.correct);
  auto ga = grads_of(*a);
  for (const auto& [name, g] : grads_of(*b)) EXPECT_TRUE(all_close(g, ga.at(name), "grad " + name, 1e-6, 1e-4));
}

TEST(Pipeline, BatchNormUsesPerMicroBatchStatisticsInTraining) {
  // Documented behaviour (pipeline.h, Note [micro-batches and BatchNorm]): with M = 2 in training
  // each half is normalised with its own statistics and the running statistics are updated twice;
  // exactly what two separate forward passes on the halves give.
  auto a = small_resnet(7), ref = small_resnet(7);
  auto pa = Pipeline::build(a, {"layer2"}, specs(1));
  at::Tensor x = at::randn({8, 1, 8, 8}), y = at::randint(0, 10, {8}, at::kLong);
  pa->zero_grad();
  StepResult r = step(*pa, batch_of(x, y), 2);
  double l0 = cross_entropy(ref->forward(Variable(x.narrow(0, 0, 4))), y.narrow(0, 0, 4)).item<double>();
  double l1 = cross_entropy(ref->forward(Variable(x.narrow(0, 4, 4))), y.narrow(0, 4, 4)).item<double>();
  EXPECT_NEAR(r.loss, (l0 + l1) / 2, 1e-5);
  auto ref_state = ref->state_dict();
  for (const auto& [name, t] : a->state_dict()) {
    if (name.find("running_") != std::string::npos) {
      EXPECT_TRUE(all_close(t, ref_state.at(name), "running stats " + name, 1e-6, 1e-5));
    }
  }
  // ...and it differs from the full-batch loss.
  auto full = small_resnet(7);
  double lf = cross_entropy(full->forward(Variable(x)), y).item<double>();
  EXPECT_GT(std::abs(lf - r.loss), 1e-6);
}

TEST(Pipeline, InferenceToggleAndByteStatistics) {
  auto model = small_resnet(11);
  auto pipe = Pipeline::build(model, {"layer1", "layer2", "layer3"}, specs(3, "topk(0.1)", "topk(0.1)"));
  at::Tensor x = at::randn({4, 1, 8, 8}), y = at::randint(0, 10, {4}, at::kLong);
  pipe->reset_stats();
  pipe->zero_grad();
  step(*pipe, batch_of(x, y), 2);
  BoundaryStats s = pipe->total_stats();
  EXPECT_EQ(s.forward.messages, 6);  // 3 boundaries x 2 micro-batches
  EXPECT_EQ(s.backward.messages, 6);
  EXPECT_GT(s.forward.bytes, 0);
  EXPECT_LT(s.forward.bytes, s.forward.raw_bytes / 3);  // 10% values + indices
  EXPECT_LT(s.backward.bytes, s.backward.raw_bytes / 3);
  // TopK 10% per sample keeps 10% of the entries (density averaged over the 6 messages) and
  // loses part of the norm.
  EXPECT_EQ(s.forward.measured, 6);
  EXPECT_NEAR(s.forward.density_mean, 0.1, 0.01);
  EXPECT_GT(s.forward.rel_error_mean, 0.05);
  EXPECT_LT(s.forward.rel_error_mean, 1.0);

  pipe->eval();
  at::Tensor on = pipe->predict(x, true), off = pipe->predict(x, false);
  at::Tensor unsplit = [&] {
    NoGradGuard g;
    return model->forward(Variable(x)).data();
  }();
  EXPECT_TRUE(all_close(off, unsplit, "compression off = unsplit model", 1e-6, 1e-5));
  EXPECT_GT(testing::max_diff(on, off), 1e-4) << "TopK 10% at inference should change the logits";
  EXPECT_TRUE(pipe->boundary(0)->active_at_inference()) << "predict restores the configured toggle";
  pipe->reset_stats();
  pipe->predict(x, true);
  EXPECT_EQ(pipe->total_stats().forward.measured, 0) << "no error measurement in predict";
  EXPECT_EQ(pipe->total_stats().forward.messages, 3);

  // Uncompressed boundaries are not measured (their error is 0): splitting then costs nothing.
  auto plain = Pipeline::build(small_resnet(11), {"layer1"}, specs(1));
  plain->zero_grad();
  step(*plain, batch_of(x, y), 1);
  EXPECT_EQ(plain->total_stats().forward.measured, 0);
  EXPECT_EQ(plain->total_stats().forward.messages, 1);
}

TEST(Pipeline, SampleIdsReachTheCodecs) {
  auto pipe = Pipeline::build(small_resnet(2), {"layer1"}, specs(1, "aqsgd(quant(4))", "identity"));
  at::Tensor x = at::randn({4, 1, 8, 8}), y = at::randint(0, 10, {4}, at::kLong);
  pipe->zero_grad();
  EXPECT_THROW(step(*pipe, batch_of(x, y), 1), c10::Error);  // AQ-SGD needs the ids
  pipe->zero_grad();
  StepResult r = step(*pipe, batch_of(x, y, at::arange(4, at::kLong) + 100), 2);
  EXPECT_EQ(r.rows, 4);
}

TEST(Pipeline, RejectsBadSplits) {
  EXPECT_THROW(Pipeline::build(small_resnet(1), {"layer9"}, specs(1)), c10::Error);
  EXPECT_THROW(Pipeline(small_resnet(1), {"layer1"}, {}), c10::Error);
  auto slices = micro_batch_slices(10, 4);  // at::chunk: 3, 3, 3, 1
  ASSERT_EQ(slices.size(), 4u);
  EXPECT_EQ(slices[3], std::make_pair(int64_t(9), int64_t(1)));
  EXPECT_EQ(micro_batch_slices(2, 4).size(), 2u);
}

}  // namespace
}  // namespace tl
