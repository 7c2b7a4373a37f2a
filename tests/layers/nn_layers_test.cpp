// Basic layers against torch::nn: same weights, same input, same output gradient; outputs and all
// gradients compared. Also PyTorch's default initialisation (same seed, same draws).
#include "layers/nn/nn.h"
#include "tests/layers/parity.h"

namespace tl {
namespace {
namespace F = torch::nn::functional;
using testing::all_close;
using testing::expect_parity;

TEST(NnLayers, LinearMatchesTorch) {
  at::manual_seed(0);
  Linear ours(6, 4);
  torch::nn::Linear ref(6, 4);
  expect_parity(
      ours, *ref, [&](const at::Tensor& x) { return ref(x); }, at::randn({3, 5, 6}), "Linear (3,5,6)");
  Linear no_bias(6, 4, /*bias=*/false);
  torch::nn::Linear ref_nb(torch::nn::LinearOptions(6, 4).bias(false));
  expect_parity(
      no_bias, *ref_nb, [&](const at::Tensor& x) { return ref_nb(x); }, at::randn({7, 6}), "Linear no bias");
  EXPECT_FALSE(no_bias.bias().defined());
  EXPECT_THROW(ours.forward(Variable(at::randn({2, 5}))), c10::Error);
}

TEST(NnLayers, Conv2dMatchesTorch) {
  at::manual_seed(1);
  Conv2d ours(Conv2dOptions(3, 8, 3).stride(2).padding(1));
  torch::nn::Conv2d ref(torch::nn::Conv2dOptions(3, 8, 3).stride(2).padding(1));
  expect_parity(ours, *ref, [&](const at::Tensor& x) { return ref(x); }, at::randn({2, 3, 9, 9}), "Conv2d s2 p1",
                {1e-4, 1e-4});
  Conv2d grouped(Conv2dOptions(4, 6, 3).groups(2).dilation(2).bias(false));
  torch::nn::Conv2d ref_g(torch::nn::Conv2dOptions(4, 6, 3).groups(2).dilation(2).bias(false));
  expect_parity(grouped, *ref_g, [&](const at::Tensor& x) { return ref_g(x); }, at::randn({2, 4, 8, 7}),
                "Conv2d groups 2 dilation 2", {1e-4, 1e-4});
  EXPECT_THROW(ours.forward(Variable(at::randn({2, 4, 9, 9}))), c10::Error);
}

TEST(NnLayers, BatchNorm2dMatchesTorchInTrainAndEval) {
  at::manual_seed(2);
  BatchNorm2d ours(5);
  torch::nn::BatchNorm2d ref(5);
  {  // non-trivial affine parameters and running statistics
    torch::NoGradGuard g;
    ref->weight.uniform_(0.5, 1.5);
    ref->bias.normal_();
    ref->running_mean.normal_();
    ref->running_var.uniform_(0.5, 2.0);
  }
  auto fwd = [&](const at::Tensor& x) { return ref(x); };
  // Training: batch statistics; the running statistics and num_batches_tracked are compared too.
  expect_parity(ours, *ref, fwd, at::randn({4, 5, 3, 3}) * 2 + 1, "BatchNorm2d train");
  EXPECT_EQ(ours.num_batches_tracked().data().item<int64_t>(), ref->num_batches_tracked.item<int64_t>());
  // A second step without re-copying: the running statistics evolve identically.
  testing::ParityOptions keep;
  keep.copy_weights = false;
  expect_parity(ours, *ref, fwd, at::randn({4, 5, 3, 3}), "BatchNorm2d train step 2", keep);
  EXPECT_EQ(ours.num_batches_tracked().data().item<int64_t>(), 2);
  // Eval: running statistics, no update.
  ours.eval();
  ref->eval();
  const at::Tensor before = ours.running_mean().data().clone();
  expect_parity(ours, *ref, fwd, at::randn({3, 5, 2, 4}), "BatchNorm2d eval");
  EXPECT_TRUE(all_close(ours.running_mean().data(), ref->running_mean, "eval keeps running_mean"));
  EXPECT_EQ(ours.num_batches_tracked().data().item<int64_t>(), ref->num_batches_tracked.item<int64_t>());
  (void)before;
}

TEST(NnLayers, LayerNormMatchesTorch) {
  at::manual_seed(3);
  LayerNorm ours(std::vector<int64_t>{4, 6}, 1e-6);
  torch::nn::LayerNorm ref(torch::nn::LayerNormOptions({4, 6}).eps(1e-6));
  {
    torch::NoGradGuard g;
    ref->weight.normal_();
    ref->bias.normal_();
  }
  expect_parity(
      ours, *ref, [&](const at::Tensor& x) { return ref(x); }, at::randn({2, 3, 4, 6}), "LayerNorm (4,6)");
}

TEST(NnLayers, EmbeddingMatchesTorchWithPadding) {
  at::manual_seed(4);
  Embedding ours(10, 5, /*padding_idx=*/2);
  torch::nn::Embedding ref(torch::nn::EmbeddingOptions(10, 5).padding_idx(2));
  const at::Tensor ids = at::tensor({1, 2, 3, 2, 9, 1, 0, 4}, at::kLong).view({2, 4});
  expect_parity(
      ours, *ref, [&](const at::Tensor& x) { return ref(x); }, ids, "Embedding padding_idx 2");
  EXPECT_EQ(ours.weight().grad()[2].abs().sum().item<double>(), 0.0) << "padding row got a gradient";
  EXPECT_THROW(ours.forward(at::zeros({2, 2})), c10::Error);  // float ids
}

TEST(NnLayers, ActivationsPoolingFlattenMatchTorch) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({2, 3, 8, 6});
  struct Case {
    std::string label;
    ModulePtr ours;
    std::function<at::Tensor(const at::Tensor&)> ref;
  };
  torch::nn::Module none;
  torch::nn::GELU gelu_tanh(torch::nn::GELUOptions().approximate("tanh"));
  std::vector<Case> cases = {
      {"ReLU", std::make_shared<ReLU>(), [](const at::Tensor& t) { return torch::relu(t); }},
      {"GELU erf", std::make_shared<GELU>("none"), [](const at::Tensor& t) { return torch::nn::GELU()(t); }},
      {"GELU tanh", std::make_shared<GELU>("tanh"), [&](const at::Tensor& t) { return gelu_tanh(t); }},
      {"Tanh", std::make_shared<Tanh>(), [](const at::Tensor& t) { return torch::tanh(t); }},
      {"MaxPool2d 3 s2 p1", std::make_shared<MaxPool2d>(3, 2, 1),
       [](const at::Tensor& t) {
         return torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1))(t);
       }},
      {"MaxPool2d 2", std::make_shared<MaxPool2d>(2),
       [](const at::Tensor& t) { return torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2))(t); }},
      {"AvgPool2d 3 s2 p1", std::make_shared<AvgPool2d>(3, 2, 1),
       [](const at::Tensor& t) {
         return torch::nn::AvgPool2d(torch::nn::AvgPool2dOptions(3).stride(2).padding(1))(t);
       }},
      {"AdaptiveAvgPool2d 3x2", std::make_shared<AdaptiveAvgPool2d>(std::array<int64_t, 2>{3, 2}),
       [](const at::Tensor& t) {
         return torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({3, 2}))(t);
       }},
      {"Flatten 1", std::make_shared<Flatten>(), [](const at::Tensor& t) { return torch::nn::Flatten()(t); }},
      {"Flatten 1..2", std::make_shared<Flatten>(1, 2),
       [](const at::Tensor& t) { return torch::nn::Flatten(torch::nn::FlattenOptions().start_dim(1).end_dim(2))(t); }},
      {"Identity", std::make_shared<Identity>(), [](const at::Tensor& t) { return t * 1; }},
  };
  for (auto& c : cases) expect_parity(*c.ours, none, c.ref, x, c.label);
}

TEST(NnLayers, SequentialMatchesTorch) {
  at::manual_seed(6);
  Sequential ours;
  ours.push_back(std::make_shared<Linear>(5, 8));
  ours.push_back(std::make_shared<ReLU>());
  ours.push_back(std::make_shared<Linear>(8, 3));
  torch::nn::Sequential ref(torch::nn::Linear(5, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  expect_parity(
      ours, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, at::randn({4, 5}), "Sequential");
  ASSERT_EQ(ours.size(), 3u);
  EXPECT_EQ(ours.named_parameters()[2].first, "2.weight");
  EXPECT_THROW(ours[3], c10::Error);
}

TEST(NnLayers, DropoutMatchesTorchForTheSameSeedAndIsIdentityInEval) {
  const at::Tensor x = at::randn({64, 33});
  Dropout ours(0.3, at::detail::createCPUGenerator(1234));
  torch::nn::Dropout ref(0.3);
  at::manual_seed(1234);  // torch draws from the default generator, ours from its own, same seed
  // (Not expect_parity: ours has a buffer torch's lacks, its mask stream's state.)
  Variable xv(x.clone(), true);
  Variable y = ours.forward(xv);
  at::Tensor xr = x.clone().requires_grad_(true);
  at::Tensor yr = ref(xr);
  EXPECT_TRUE(all_close(y.data(), yr, "Dropout p=0.3 train output", 0, 0));
  const at::Tensor go = at::randn_like(yr);
  y.backward(go);
  yr.backward(go);
  EXPECT_TRUE(all_close(xv.grad(), xr.grad(), "Dropout p=0.3 d/d(input)", 0, 0));

  // Masks: every output is 0 or x / (1 - p); about p of them are dropped; the generator, not
  // the default RNG, decides.
  Dropout d(0.3, at::detail::createCPUGenerator(7));
  Variable y1 = d.forward(Variable(x));
  const at::Tensor kept = y1.data().ne(0);
  EXPECT_TRUE(all_close(y1.data(), at::where(kept, x / 0.7, at::zeros_like(x)), "dropout scaling"));
  const double dropped = 1.0 - kept.to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(dropped, 0.3, 0.05);
  Dropout d2(0.3, at::detail::createCPUGenerator(7));
  at::manual_seed(99);
  EXPECT_TRUE(d2.forward(Variable(x)).data().equal(y1.data())) << "same generator seed must give the same mask";

  d.eval();
  EXPECT_TRUE(d.forward(Variable(x)).data().equal(x));
  EXPECT_THROW(Dropout(1.5), c10::Error);
}

TEST(NnLayers, DefaultInitialisationMatchesTorch) {
  at::manual_seed(11);
  torch::nn::Linear rl(7, 5);
  at::manual_seed(11);
  Linear l(7, 5);
  EXPECT_TRUE(all_close(l.weight().data(), rl->weight, "Linear weight init", 1e-7, 0));
  EXPECT_TRUE(all_close(l.bias().data(), rl->bias, "Linear bias init", 1e-7, 0));

  at::manual_seed(12);
  torch::nn::Conv2d rc(torch::nn::Conv2dOptions(4, 6, 3));
  at::manual_seed(12);
  Conv2d c(Conv2dOptions(4, 6, 3));
  EXPECT_TRUE(all_close(c.weight().data(), rc->weight, "Conv2d weight init", 1e-7, 0));
  EXPECT_TRUE(all_close(c.bias().data(), rc->bias, "Conv2d bias init", 1e-7, 0));

  at::manual_seed(13);
  torch::nn::Embedding re(torch::nn::EmbeddingOptions(9, 4).padding_idx(0));
  at::manual_seed(13);
  Embedding e(9, 4, 0);
  EXPECT_TRUE(all_close(e.weight().data(), re->weight, "Embedding init", 0, 0));

  // An explicit generator makes initialisation independent of the default RNG.
  Linear g1(7, 5, true, at::detail::createCPUGenerator(5));
  at::manual_seed(77);
  Linear g2(7, 5, true, at::detail::createCPUGenerator(5));
  EXPECT_TRUE(g1.weight().data().equal(g2.weight().data()));

  BatchNorm2d bn(3);
  EXPECT_TRUE(bn.weight().data().equal(at::ones({3})));
  EXPECT_TRUE(bn.bias().data().equal(at::zeros({3})));
  EXPECT_TRUE(bn.running_var().data().equal(at::ones({3})));
  EXPECT_EQ(bn.num_batches_tracked().data().scalar_type(), at::kLong);
  LayerNorm ln(4);
  EXPECT_TRUE(ln.weight().data().equal(at::ones({4})));
}

}  // namespace
}  // namespace tl
