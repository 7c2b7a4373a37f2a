// Optimizers against torch::optim over 10 steps on identical parameters and gradients (SGD with
// momentum / dampening / Nesterov / weight decay, Adam with and without amsgrad, AdamW), state
// dict round trips that resume exactly, the weight-decay group builder, gradient clipping against
// torch::nn::utils::clip_grad_norm_, and gradient accumulation against the full-batch gradient.
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "layers/optim/adam.h"
#include "layers/optim/grad_utils.h"
#include "layers/optim/sgd.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::all_close;

// Parameters and 10 steps of gradients, shared by both implementations. One parameter gets no
// gradient at step 3 (both must skip it).
struct Trajectory {
  std::vector<at::Tensor> init;
  std::vector<std::vector<at::Tensor>> grads;  // [step][param]
};

Trajectory make_trajectory(at::ScalarType dtype, int steps = 10) {
  at::manual_seed(7);
  const std::vector<std::vector<int64_t>> shapes = {{5, 4}, {4}, {2, 3, 3}, {}};
  Trajectory tr;
  for (const auto& s : shapes) tr.init.push_back(at::randn(s, at::TensorOptions().dtype(dtype)));
  for (int k = 0; k < steps; ++k) {
    std::vector<at::Tensor> g;
    for (const auto& s : shapes) g.push_back(at::randn(s, at::TensorOptions().dtype(dtype)));
    if (k == 3) g[2] = at::Tensor();
    tr.grads.push_back(g);
  }
  return tr;
}

std::vector<Variable> tl_params(const Trajectory& tr) {
  std::vector<Variable> out;
  for (const auto& t : tr.init) out.emplace_back(t.clone(), true);
  return out;
}

std::vector<torch::Tensor> torch_params(const Trajectory& tr) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tr.init) out.push_back(t.clone().requires_grad_(true));
  return out;
}

// Runs both optimizers over the trajectory, halving the lr after step 5 through each one's own
// API, and compares every parameter after every step.
void run_parity(Optimizer& ours, std::vector<Variable>& p, torch::optim::Optimizer& ref, std::vector<torch::Tensor>& q,
                const Trajectory& tr, const std::function<void(double)>& set_ref_lr, const std::string& label,
                double atol, double rtol) {
  for (size_t k = 0; k < tr.grads.size(); ++k) {
    if (k == 5) {
      ours.set_lr(0, ours.lr(0) * 0.5);
      set_ref_lr(ours.lr(0));
    }
    for (size_t i = 0; i < p.size(); ++i) {
      const at::Tensor& g = tr.grads[k][i];
      if (g.defined()) {
        p[i].set_grad(g.clone());
        q[i].mutable_grad() = g.clone();
      } else {
        p[i].zero_grad();
        q[i].mutable_grad() = torch::Tensor();
      }
    }
    ours.step();
    ref.step();
    for (size_t i = 0; i < p.size(); ++i)
      ASSERT_TRUE(all_close(p[i].data(), q[i].detach(),
                            label + " step " + std::to_string(k + 1) + " param " + std::to_string(i), atol, rtol));
  }
}

TEST(Optim, SgdNesterovMomentumWeightDecayMatchesTorch) {
  auto tr = make_trajectory(at::kFloat);
  auto p = tl_params(tr);
  auto q = torch_params(tr);
  SGD ours(p, GroupOptions().set_lr(0.1).set_momentum(0.9).set_nesterov(true).set_weight_decay(0.05));
  torch::optim::SGD ref(q, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.05));
  auto set_lr = [&](double lr) { static_cast<torch::optim::SGDOptions&>(ref.param_groups()[0].options()).lr(lr); };
  run_parity(ours, p, ref, q, tr, set_lr, "SGD nesterov", 1e-6, 1e-6);
}

TEST(Optim, SgdMomentumDampeningMatchesTorch) {
  auto tr = make_trajectory(at::kDouble);
  auto p = tl_params(tr);
  auto q = torch_params(tr);
  SGD ours(p, GroupOptions().set_lr(0.05).set_momentum(0.8).set_dampening(0.3).set_weight_decay(0.01));
  torch::optim::SGD ref(q, torch::optim::SGDOptions(0.05).momentum(0.8).dampening(0.3).weight_decay(0.01));
  auto set_lr = [&](double lr) { static_cast<torch::optim::SGDOptions&>(ref.param_groups()[0].options()).lr(lr); };
  run_parity(ours, p, ref, q, tr, set_lr, "SGD dampening", 1e-12, 1e-12);
}

TEST(Optim, SgdPlainMatchesTorch) {
  auto tr = make_trajectory(at::kFloat);
  auto p = tl_params(tr);
  auto q = torch_params(tr);
  SGD ours(p, GroupOptions().set_lr(0.2));
  torch::optim::SGD ref(q, torch::optim::SGDOptions(0.2));
  auto set_lr = [&](double lr) { static_cast<torch::optim::SGDOptions&>(ref.param_groups()[0].options()).lr(lr); };
  run_parity(ours, p, ref, q, tr, set_lr, "SGD plain", 1e-6, 1e-6);
}

TEST(Optim, AdamMatchesTorch) {
  for (bool amsgrad : {false, true}) {
    // float64 and a large eps, so that eps placement and bias correction are visible well
    // above the tolerance.
    auto tr = make_trajectory(at::kDouble);
    auto p = tl_params(tr);
    auto q = torch_params(tr);
    Adam ours(
        p, GroupOptions().set_lr(0.01).set_betas(0.8, 0.95).set_eps(0.05).set_weight_decay(0.02).set_amsgrad(amsgrad));
    torch::optim::Adam ref(q, torch::optim::AdamOptions(0.01)
                                  .betas(std::make_tuple(0.8, 0.95))
                                  .eps(0.05)
                                  .weight_decay(0.02)
                                  .amsgrad(amsgrad));
    auto set_lr = [&](double lr) { static_cast<torch::optim::AdamOptions&>(ref.param_groups()[0].options()).lr(lr); };
    run_parity(ours, p, ref, q, tr, set_lr, amsgrad ? "Adam amsgrad" : "Adam", 1e-12, 1e-12);
  }
}

TEST(Optim, AdamWMatchesTorch) {
  for (bool amsgrad : {false, true}) {
    auto tr = make_trajectory(amsgrad ? at::kDouble : at::kFloat);
    auto p = tl_params(tr);
    auto q = torch_params(tr);
    AdamW ours(p,
               GroupOptions().set_lr(0.01).set_weight_decay(0.1).set_eps(amsgrad ? 0.05 : 1e-8).set_amsgrad(amsgrad));
    torch::optim::AdamW ref(
        q, torch::optim::AdamWOptions(0.01).weight_decay(0.1).eps(amsgrad ? 0.05 : 1e-8).amsgrad(amsgrad));
    auto set_lr = [&](double lr) { static_cast<torch::optim::AdamWOptions&>(ref.param_groups()[0].options()).lr(lr); };
    run_parity(ours, p, ref, q, tr, set_lr, amsgrad ? "AdamW amsgrad (f64)" : "AdamW (f32)", amsgrad ? 1e-12 : 1e-6,
               amsgrad ? 1e-12 : 1e-5);
  }
}

// 5 steps, state_dict into a fresh optimizer over copies of the parameters, 5 more steps on both:
// the resumed run must equal the uninterrupted one exactly.
template <class Opt>
void check_resume(const GroupOptions& opts, const std::string& label) {
  auto tr = make_trajectory(at::kFloat);
  auto p = tl_params(tr);
  Opt a(p, opts);
  auto apply = [&](Optimizer& opt, std::vector<Variable>& params, size_t k) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (tr.grads[k][i].defined())
        params[i].set_grad(tr.grads[k][i].clone());
      else
        params[i].zero_grad();
    }
    opt.step();
  };
  for (size_t k = 0; k < 5; ++k) apply(a, p, k);
  TensorMap state = a.state_dict();
  std::vector<Variable> p2;
  for (auto& v : p) p2.emplace_back(v.data().clone(), true);
  Opt b(p2, GroupOptions());  // different options: load_state_dict restores them
  b.load_state_dict(state);
  EXPECT_EQ(b.group(0).options.lr, opts.lr) << label;
  for (size_t k = 5; k < 10; ++k) {
    apply(a, p, k);
    apply(b, p2, k);
  }
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_TRUE(all_close(p2[i].data(), p[i].data(), label + " resumed param " + std::to_string(i), 0, 0));
  // The state dict holds what it should.
  EXPECT_TRUE(state.count("groups.0.lr")) << label;
}

TEST(Optim, StateDictResumesExactly) {
  check_resume<SGD>(GroupOptions().set_lr(0.1).set_momentum(0.9).set_nesterov(true).set_weight_decay(0.01), "SGD");
  check_resume<Adam>(GroupOptions().set_lr(0.01).set_amsgrad(true), "Adam amsgrad");
  check_resume<AdamW>(GroupOptions().set_lr(0.01).set_weight_decay(0.1), "AdamW");
}

TEST(Optim, StateDictKeysAreParameterNames) {
  ParamGroup g;
  g.params = {Variable(at::randn({3, 2}), true), Variable(at::randn({2}), true)};
  g.names = {"fc.weight", "fc.bias"};
  AdamW opt({g}, GroupOptions().set_lr(0.1));
  g.params[0].set_grad(at::ones({3, 2}));  // only the weight steps
  opt.step();
  auto sd = opt.state_dict();
  for (const char* k :
       {"state.fc.weight.step", "state.fc.weight.exp_avg", "state.fc.weight.exp_avg_sq", "groups.0.lr",
        "groups.0.weight_decay", "groups.0.beta1", "groups.0.beta2", "groups.0.eps", "groups.0.amsgrad"})
    EXPECT_TRUE(sd.count(k)) << "missing " << k;
  EXPECT_FALSE(sd.count("state.fc.bias.exp_avg")) << "a parameter that never stepped has no state";
  EXPECT_EQ(sd.at("state.fc.weight.step").item<int64_t>(), 1);
  EXPECT_EQ(sd.size(), 9u);
}

TEST(Optim, LoadStateDictRejectsMismatchAndChangesNothing) {
  ParamGroup g;
  g.params = {Variable(at::randn({3, 2}), true)};
  g.names = {"w"};
  SGD opt({g}, GroupOptions().set_lr(0.1).set_momentum(0.9));
  g.params[0].set_grad(at::ones({3, 2}));
  opt.step();
  const TensorMap good = opt.state_dict();
  const at::Tensor buf_before = opt.param_state("w")->at("momentum_buffer").clone();

  auto with = [&](const std::string& k, at::Tensor v) {
    TensorMap m = good;
    if (v.defined())
      m[k] = v;
    else
      m.erase(k);
    return m;
  };
  auto expect_error = [&](const TensorMap& m, const std::string& needle) {
    const std::string msg = testing::what_of([&] { opt.load_state_dict(m); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
  };
  expect_error(with("state.w.momentum_buffer", at::zeros({2, 3})), "state.w.momentum_buffer: shape [2, 3]");
  expect_error(with("state.v.momentum_buffer", at::zeros({3, 2})), "unexpected state.v.momentum_buffer");
  expect_error(with("groups.0.momentum", at::Tensor()), "missing groups.0.momentum");
  expect_error(with("groups.0.lr", at::scalar_tensor(-1.0, at::kDouble)), "lr must be finite and >= 0");
  expect_error(with("groups.0.momentum", at::scalar_tensor(-0.5, at::kDouble)), "momentum must be finite and >= 0");
  expect_error(with("groups.0.momentum", at::ones({2}, at::kDouble)),
               "groups.0.momentum: expected a floating-point scalar");
  // Adam state into SGD: every slot is unexpected.
  ParamGroup g2;
  g2.params = {Variable(at::randn({3, 2}), true)};
  g2.names = {"w"};
  Adam adam({g2}, GroupOptions());
  g2.params[0].set_grad(at::ones({3, 2}));
  adam.step();
  TensorMap adam_sd = adam.state_dict();
  expect_error(adam_sd, "unexpected state.w.exp_avg");
  // Incomplete Adam state.
  adam_sd.erase("state.w.exp_avg_sq");
  const std::string msg = testing::what_of([&] { adam.load_state_dict(adam_sd); });
  EXPECT_NE(msg.find("incomplete state for parameter 'w'"), std::string::npos) << msg;

  // Nothing changed by the failed loads.
  EXPECT_EQ(opt.lr(0), 0.1);
  EXPECT_TRUE(all_close(opt.param_state("w")->at("momentum_buffer"), buf_before, "momentum buffer kept", 0, 0));
}

TEST(Optim, InvalidOptionsAndGroupsRejected) {
  Variable w(at::randn({2}), true);
  EXPECT_NE(
      testing::what_of([&] { SGD({w}, GroupOptions().set_lr(0.1).set_nesterov(true)); }).find("requires momentum > 0"),
      std::string::npos);
  EXPECT_NE(testing::what_of([&] { Adam({w}, GroupOptions().set_betas(1.0, 0.9)); }).find("beta1 must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] { AdamW({w}, GroupOptions().set_lr(-1)); }).find("lr must be finite and >= 0"),
            std::string::npos);
  ParamGroup a, b;
  a.params = {w};
  b.params = {w};
  EXPECT_NE(testing::what_of([&] {
              SGD({a, b}, GroupOptions());
            }).find("already in this optimizer"),
            std::string::npos);
  ParamGroup c;
  c.params = {Variable(at::randn({2}), true), Variable(at::randn({2}), true)};
  c.names = {"x", "x"};
  EXPECT_NE(testing::what_of([&] { SGD({c}, GroupOptions()); }).find("'x' appears twice"), std::string::npos);
  c.names = {"x"};
  EXPECT_NE(testing::what_of([&] { SGD({c}, GroupOptions()); }).find("2 parameters but 1 names"), std::string::npos);
}

std::shared_ptr<Module> named_net() {
  auto net = std::make_shared<Module>("Net");
  auto embed = net->register_module("embed", std::make_shared<Module>("Embedding"));
  embed->register_parameter("weight", at::randn({10, 4}));
  net->register_parameter("pos_embed", at::randn({6, 4}));
  auto fc = net->register_module("fc", std::make_shared<Module>("Linear"));
  fc->register_parameter("weight", at::randn({3, 4}));
  fc->register_parameter("bias", at::randn({3}));
  auto ln = net->register_module("ln", std::make_shared<Module>("LayerNorm"));
  ln->register_parameter("weight", at::ones({4}));
  ln->register_parameter("bias", at::zeros({4}));
  auto bn = net->register_module("bn", std::make_shared<Module>("BatchNorm2d"));
  bn->register_parameter("weight", at::ones({4}));
  bn->register_buffer("running_mean", at::zeros({4}));
  auto odd = net->register_module("odd", std::make_shared<Module>("GroupNormLike"));
  odd->register_parameter("scale", at::ones({2, 2}));  // 2-D, but a norm's parameter
  auto head = net->register_module("head", std::make_shared<Module>("Linear"));
  head->register_parameter("weight", at::randn({2, 3}));
  head->register_parameter("frozen", at::randn({2, 3}), /*requires_grad=*/false);
  return net;
}

TEST(Optim, WeightDecayGroupsSplitByNameAndType) {
  auto net = named_net();
  auto groups = weight_decay_groups(*net, 0.05, {"pos_embed"});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].names, (std::vector<std::string>{"embed.weight", "fc.weight", "head.weight"}));
  EXPECT_EQ(groups[1].names,
            (std::vector<std::string>{"pos_embed", "fc.bias", "ln.weight", "ln.bias", "bn.weight", "odd.scale"}));
  EXPECT_EQ(*groups[0].weight_decay, 0.05);
  EXPECT_EQ(*groups[1].weight_decay, 0.0);
  // Without the extra pattern, the 2-D position embedding decays.
  auto plain = weight_decay_groups(*net, 0.05);
  EXPECT_EQ(plain[0].names.size(), 4u);

  // Zero gradients: only weight decay moves parameters, and only those of group 0.
  AdamW opt(groups, GroupOptions().set_lr(0.1));
  EXPECT_EQ(opt.group(0).options.weight_decay, 0.05);
  EXPECT_EQ(opt.group(1).options.weight_decay, 0.0);
  std::map<std::string, at::Tensor> before;
  for (auto& [n, p] : net->named_parameters()) {
    before[n] = p.data().clone();
    p.set_grad(at::zeros_like(p.data()));
  }
  opt.step();
  for (auto& [n, p] : net->named_parameters()) {
    const bool decays = n == "embed.weight" || n == "fc.weight" || n == "head.weight";
    if (decays)
      EXPECT_TRUE(all_close(p.data(), before[n] * (1 - 0.1 * 0.05), n + " decayed", 1e-6, 1e-6));
    else
      EXPECT_TRUE(all_close(p.data(), before[n], n + " not decayed", 0, 0));
  }
}

TEST(Optim, ClipGradNormMatchesTorch) {
  at::manual_seed(3);
  const std::vector<std::vector<int64_t>> shapes = {{4, 5}, {5}, {3, 2, 2}};
  for (double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    for (double max_norm : {0.5, 1e3}) {  // clipping, and a bound above the norm (no change)
      std::vector<Variable> p;
      std::vector<torch::Tensor> q;
      for (const auto& s : shapes) {
        at::Tensor v = at::randn(s), g = at::randn(s);
        p.emplace_back(v.clone(), true);
        p.back().set_grad(g.clone());
        q.push_back(v.clone().requires_grad_(true));
        q.back().mutable_grad() = g.clone();
      }
      p.emplace_back(at::randn({3}), true);  // no gradient: skipped by both
      q.push_back(at::randn({3}).requires_grad_(true));
      const std::string label = "norm " + std::to_string(norm_type) + " max " + std::to_string(max_norm);
      const double ours = clip_grad_norm(p, max_norm, norm_type);
      const double ref = torch::nn::utils::clip_grad_norm_(q, max_norm, norm_type);
      EXPECT_NEAR(ours, ref, 1e-6 * ref) << label;
      for (size_t i = 0; i < shapes.size(); ++i)
        EXPECT_TRUE(all_close(p[i].grad(), q[i].grad(), label + " grad " + std::to_string(i), 1e-7, 1e-6));
      EXPECT_FALSE(p.back().grad().defined());
      if (max_norm < 1) {
        EXPECT_NEAR(grad_norm(p, norm_type), max_norm, 1e-5) << label << ": clipped to the bound";
      }
    }
  }
}

TEST(Optim, ClipGradNormNonFinite) {
  Variable w(at::zeros({3}), true);
  w.set_grad(at::tensor({1.0f, INFINITY, 2.0f}));
  const std::string msg = testing::what_of([&] { clip_grad_norm({w}, 1.0, 2.0, /*error_if_nonfinite=*/true); });
  EXPECT_NE(msg.find("is inf"), std::string::npos) << msg;
  EXPECT_EQ(w.grad()[0].item<float>(), 1.0f) << "nothing scaled before the error";
  EXPECT_EQ(clip_grad_norm({Variable(at::zeros({2}), true)}, 1.0), 0.0) << "no gradients: norm 0";
}

// loss(w, b) over rows [lo, hi): mean((x w + b - y)^2), built from elementwise ops and reductions.
Variable batch_loss(const Variable& w, const Variable& b, const at::Tensor& x, const at::Tensor& y, int64_t lo,
                    int64_t hi) {
  Variable xs(x.slice(0, lo, hi)), ys(y.slice(0, lo, hi));
  Variable pred = tl::sum(xs * w, {1}) + b;  // (n,)
  Variable d = pred - ys;
  return tl::mean(d * d);
}

TEST(Optim, GradAccumulationEqualsFullBatch) {
  at::manual_seed(11);
  at::Tensor x = at::randn({10, 3}, at::kDouble), y = at::randn({10}, at::kDouble);
  Variable w(at::randn({3}, at::kDouble), true), b(at::randn({1}, at::kDouble), true);

  batch_loss(w, b, x, y, 0, 10).backward();
  const at::Tensor gw = w.grad().clone(), gb = b.grad().clone();
  w.zero_grad();
  b.zero_grad();

  // Unequal micro-batches 4 + 4 + 2 weighted by their sizes give the full-batch gradient.
  GradAccumulator acc({w, b});
  const std::vector<std::pair<int64_t, int64_t>> parts = {{0, 4}, {4, 8}, {8, 10}};
  for (auto [lo, hi] : parts) acc.backward(batch_loss(w, b, x, y, lo, hi), static_cast<double>(hi - lo));
  EXPECT_EQ(acc.micro_batches(), 3);
  EXPECT_EQ(acc.finish(), 10.0);
  EXPECT_TRUE(all_close(w.grad(), gw, "accumulated grad w", 1e-12, 1e-10));
  EXPECT_TRUE(all_close(b.grad(), gb, "accumulated grad b", 1e-12, 1e-10));
  EXPECT_EQ(acc.micro_batches(), 0) << "finish resets";

  // Weight 1: the plain average of the micro-batch gradients.
  w.zero_grad();
  b.zero_grad();
  at::Tensor sum_w = at::zeros({3}, at::kDouble);
  for (auto [lo, hi] : parts) {
    batch_loss(w, b, x, y, lo, hi).backward();
    sum_w += w.grad();
    w.zero_grad();
    b.zero_grad();
  }
  for (auto [lo, hi] : parts) acc.backward(batch_loss(w, b, x, y, lo, hi));
  acc.finish();
  EXPECT_TRUE(all_close(w.grad(), sum_w / 3, "averaged grad w", 1e-12, 1e-10));
  EXPECT_GT(testing::max_diff(w.grad(), gw), 1e-6) << "unweighted averaging differs from the full batch here";

  EXPECT_NE(testing::what_of([&] { acc.finish(); }).find("no micro-batch"), std::string::npos);
  EXPECT_NE(
      testing::what_of([&] { acc.backward(batch_loss(w, b, x, y, 0, 2), 0.0); }).find("weight must be finite and > 0"),
      std::string::npos);
}

// Note [scaling without a kernel]: the loop gives mul_(double)'s bits, specials included, for
// float32 and float64; larger, non-contiguous and other-dtype gradients still go through mul_.
TEST(Optim, ScaleGradsGivesTheBitsOfMul) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf}) {
    for (int64_t n : {int64_t(7), int64_t(1000), (int64_t(1) << 18) + 5}) {
      // Magnitudes over 2^-60 .. 2^60, then zeros of both signs, the smallest subnormal, an
      // infinity and a NaN.
      at::Tensor g = at::randn({n}, at::kDouble).mul_(at::randint(-60, 60, {n}, at::kDouble).exp2_()).to(dtype);
      const double tiny = dtype == at::kDouble ? 4.9e-324 : dtype == at::kFloat ? 1.4e-45 : 6e-8;
      const double specials[] = {0.0, -0.0, tiny, -tiny, std::numeric_limits<double>::infinity(),
                                 std::numeric_limits<double>::quiet_NaN()};
      for (int64_t i = 0; i < 6; ++i) g[i] = specials[i];
      for (double factor : {1.0 / 3, 1.0 / 4096, 3e-9, 7.0}) {
        at::Tensor want = g.clone().mul_(factor);
        Variable p(at::zeros({n}, dtype), true);
        p.set_grad(g.clone());
        scale_grads({p}, factor);
        // Bit for bit (signed zeros included), NaNs where and only where mul_ gives NaN (their
        // payload is not an arithmetic result).
        auto no_nan = [](const at::Tensor& t) { return at::where(t.isnan(), at::zeros_like(t), t); };
        EXPECT_TRUE(at::equal(p.grad().isnan(), want.isnan()) &&
                    at::equal(no_nan(p.grad()).view(at::kByte), no_nan(want).view(at::kByte)))
            << dtype << " n=" << n << " factor " << factor;
      }
    }
  }
}

}  // namespace
}  // namespace tl
