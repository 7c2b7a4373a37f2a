// Learning-rate schedules: each against hand-computed values of its formula, the step schedule
// against torch::optim::StepLR, the scheduler driving several groups, and its state round trip.
#include "layers/optim/schedule.h"

#include <torch/torch.h>

#include <cmath>

#include "layers/optim/sgd.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

constexpr double kPi = 3.14159265358979323846;

TEST(LrSchedule, ConstantAndStep) {
  auto c = constant_schedule();
  for (int64_t t : {0, 1, 1000}) EXPECT_EQ(c->lr(t, 0.3), 0.3);
  auto s = step_schedule(3, 0.5);
  const double expected[] = {1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125};
  for (int64_t t = 0; t < 10; ++t) EXPECT_DOUBLE_EQ(s->lr(t, 1.0), expected[t]) << "t=" << t;
}

TEST(LrSchedule, StepMatchesTorchStepLR) {
  // torch::optim::StepLR (C++) applies its first decay one step() call later than the Python
  // closed form: after k calls its lr equals ours at step k - 1.
  auto w = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD ref({w}, torch::optim::SGDOptions(0.4));
  torch::optim::StepLR ref_sched(ref, /*step_size=*/4, /*gamma=*/0.3);
  auto s = step_schedule(4, 0.3);
  for (int64_t k = 1; k <= 20; ++k) {
    ref_sched.step();
    const double ref_lr = static_cast<torch::optim::SGDOptions&>(ref.param_groups()[0].options()).lr();
    EXPECT_NEAR(s->lr(k - 1, 0.4), ref_lr, 1e-15) << "k=" << k;
  }
}

TEST(LrSchedule, CosineToMinLr) {
  auto s = cosine_schedule(100, 0.01);
  EXPECT_DOUBLE_EQ(s->lr(0, 1.0), 1.0);
  EXPECT_NEAR(s->lr(50, 1.0), 0.505, 1e-15);  // halfway: (b + m) / 2
  EXPECT_NEAR(s->lr(25, 1.0), 0.01 + 0.99 * (1 + std::cos(kPi / 4)) / 2, 1e-15);
  EXPECT_NEAR(s->lr(100, 1.0), 0.01, 1e-15);
  EXPECT_NEAR(s->lr(250, 1.0), 0.01, 1e-15) << "held at min_lr after total_steps";
  for (int64_t t = 1; t <= 100; ++t) EXPECT_LE(s->lr(t, 1.0), s->lr(t - 1, 1.0)) << "monotone, t=" << t;
}

TEST(LrSchedule, WarmupLinear) {
  auto s = warmup_linear_schedule(10, 110, 0.0);
  EXPECT_EQ(s->lr(0, 2.0), 0.0);
  EXPECT_DOUBLE_EQ(s->lr(5, 2.0), 1.0);
  EXPECT_DOUBLE_EQ(s->lr(10, 2.0), 2.0);
  EXPECT_DOUBLE_EQ(s->lr(60, 2.0), 1.0);
  EXPECT_DOUBLE_EQ(s->lr(85, 2.0), 0.5);
  EXPECT_EQ(s->lr(110, 2.0), 0.0);
  EXPECT_EQ(s->lr(200, 2.0), 0.0);
  auto m = warmup_linear_schedule(10, 110, 0.2);
  EXPECT_DOUBLE_EQ(m->lr(60, 2.0), 1.1);  // 0.2 + 1.8 / 2
  EXPECT_DOUBLE_EQ(m->lr(110, 2.0), 0.2);
}

TEST(LrSchedule, WarmupCosine) {
  auto s = warmup_cosine_schedule(4, 104, 0.1);
  EXPECT_EQ(s->lr(0, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(s->lr(1, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(s->lr(4, 1.0), 1.0);
  EXPECT_NEAR(s->lr(54, 1.0), 0.55, 1e-15);
  EXPECT_NEAR(s->lr(29, 1.0), 0.1 + 0.9 * (1 + std::cos(kPi / 4)) / 2, 1e-15);
  EXPECT_NEAR(s->lr(104, 1.0), 0.1, 1e-15);
  EXPECT_NEAR(s->lr(1000, 1.0), 0.1, 1e-15);
}

TEST(LrSchedule, MakeScheduleAndErrors) {
  ScheduleConfig c;
  c.kind = "warmup_cosine";
  c.warmup_steps = 5;
  c.total_steps = 50;
  EXPECT_EQ(make_schedule(c)->describe(), "warmup_cosine(warmup_steps=5, total_steps=50, min_lr=0)");
  c.kind = "cosnie";
  EXPECT_NE(testing::what_of([&] { make_schedule(c); }).find("unknown lr schedule 'cosnie'; known: constant, step"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] { step_schedule(0, 0.1); }).find("step_size must be > 0"), std::string::npos);
  EXPECT_NE(testing::what_of([&] { cosine_schedule(0); }).find("total_steps must be > 0"), std::string::npos);
  EXPECT_NE(testing::what_of([&] { warmup_linear_schedule(10, 10); }).find("0 <= warmup_steps < total_steps"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] { cosine_schedule(10, -1); }).find("min_lr must be finite and >= 0"),
            std::string::npos);
}

std::vector<ParamGroup> two_groups() {
  ParamGroup a, b;
  a.params = {Variable(at::zeros({2}), true)};
  b.params = {Variable(at::zeros({3}), true)};
  b.lr = 0.01;
  return {a, b};
}

TEST(LrSchedule, SchedulerSetsEveryGroup) {
  SGD opt(two_groups(), GroupOptions().set_lr(0.1));
  LRScheduler sched(opt, warmup_cosine_schedule(2, 10, 0.0));
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{0.1, 0.01}));
  EXPECT_EQ(opt.lr(0), 0.0) << "construction sets the lr for step 0";
  auto s = warmup_cosine_schedule(2, 10, 0.0);
  for (int64_t t = 1; t <= 12; ++t) {
    sched.step();
    EXPECT_EQ(sched.step_count(), t);
    EXPECT_DOUBLE_EQ(opt.lr(0), s->lr(t, 0.1)) << "t=" << t;
    EXPECT_DOUBLE_EQ(opt.lr(1), s->lr(t, 0.01)) << "t=" << t;
  }
}

TEST(LrSchedule, StateRoundTripResumesTheSequence) {
  SGD opt(two_groups(), GroupOptions().set_lr(0.1));
  LRScheduler sched(opt, cosine_schedule(20, 0.001));
  for (int i = 0; i < 7; ++i) sched.step();
  const TensorMap state = sched.state_dict();

  SGD opt2(two_groups(), GroupOptions().set_lr(0.5));  // different base lr: the state's wins
  LRScheduler sched2(opt2, cosine_schedule(20, 0.001));
  sched2.load_state_dict(state);
  EXPECT_EQ(sched2.step_count(), 7);
  EXPECT_EQ(sched2.base_lrs(), sched.base_lrs());
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(opt2.lr(0), opt.lr(0)) << "step " << sched.step_count();
    EXPECT_EQ(opt2.lr(1), opt.lr(1)) << "step " << sched.step_count();
    sched.step();
    sched2.step();
  }

  // A state for another number of groups, or with a bad entry, is rejected and changes nothing.
  SGD one(std::vector<Variable>{Variable(at::zeros({2}), true)}, GroupOptions().set_lr(0.1));
  LRScheduler sched1(one, constant_schedule());
  EXPECT_NE(
      testing::what_of([&] { sched1.load_state_dict(state); }).find("'base_lrs' must be a floating-point vector of 1"),
      std::string::npos);
  TensorMap bad = state;
  bad["step"] = at::scalar_tensor(-3, at::kLong);
  bad["extra"] = at::zeros({1});
  const std::string msg = testing::what_of([&] { sched2.load_state_dict(bad); });
  EXPECT_NE(msg.find("'step' must be one non-negative integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected entry 'extra'"), std::string::npos) << msg;
  EXPECT_EQ(sched2.step_count(), 22);
  EXPECT_EQ(sched1.step_count(), 0);
}

}  // namespace
}  // namespace tl
