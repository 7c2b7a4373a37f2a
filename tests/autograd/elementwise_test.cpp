// Elementwise ops: finite differences in float64 and the libtorch-autograd oracle, with
// broadcasting shapes.
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::gradcheck;
using testing::matches_torch;

using testing::pos;
using testing::rnd;

struct Binary {
  const char* name;
  Variable (*tl_fn)(const Variable&, const Variable&);
  at::Tensor (*ref)(const at::Tensor&, const at::Tensor&);
};

TEST(Elementwise, BinaryBroadcastGradcheckAndOracle) {
  at::manual_seed(0);
  const Binary ops[] = {
      {"add", &tl::add, [](const at::Tensor& a, const at::Tensor& b) { return a + b; }},
      {"sub", &tl::sub, [](const at::Tensor& a, const at::Tensor& b) { return a - b; }},
      {"mul", &tl::mul, [](const at::Tensor& a, const at::Tensor& b) { return a * b; }},
      {"div", &tl::div, [](const at::Tensor& a, const at::Tensor& b) { return a / b; }},
  };
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{3, 1}, {1, 5}}, {{2, 1, 4}, {3, 1}}};
  for (const auto& op : ops) {
    for (const auto& [sa, sb] : shapes) {
      const std::string label = std::string(op.name) + " " + c10::str(at::IntArrayRef(sa)) + " x " +
                                c10::str(at::IntArrayRef(sb));
      auto fn = [&](const variable_list& v) { return op.tl_fn(v[0], v[1]); };
      EXPECT_TRUE(gradcheck(fn, {rnd(sa), pos(sb)}, label));
      EXPECT_TRUE(matches_torch(fn, [&](const std::vector<at::Tensor>& t) { return op.ref(t[0], t[1]); },
                                {rnd(sa, at::kFloat), pos(sb, at::kFloat)}, label));
    }
  }
}

struct Unary {
  const char* name;
  std::function<Variable(const Variable&)> tl_fn;
  std::function<at::Tensor(const at::Tensor&)> ref;
  bool positive;  // domain restricted to x > 0
};

TEST(Elementwise, UnaryGradcheckAndOracle) {
  at::manual_seed(1);
  const std::vector<Unary> ops = {
      {"neg", [](const Variable& x) { return -x; }, [](const at::Tensor& x) { return -x; }, false},
      {"add_scalar", [](const Variable& x) { return x + 2.5; }, [](const at::Tensor& x) { return x + 2.5; }, false},
      {"sub_scalar", [](const Variable& x) { return x - 1.5; }, [](const at::Tensor& x) { return x - 1.5; }, false},
      {"mul_scalar", [](const Variable& x) { return 3.0 * x; }, [](const at::Tensor& x) { return x * 3.0; }, false},
      {"div_scalar", [](const Variable& x) { return x / 4.0; }, [](const at::Tensor& x) { return x / 4.0; }, false},
      {"pow3", [](const Variable& x) { return tl::pow(x, 3.0); }, [](const at::Tensor& x) { return x.pow(3.0); }, false},
      {"pow-0.7", [](const Variable& x) { return tl::pow(x, -0.7); }, [](const at::Tensor& x) { return x.pow(-0.7); }, true},
      {"exp", [](const Variable& x) { return tl::exp(x); }, [](const at::Tensor& x) { return x.exp(); }, false},
      {"log", [](const Variable& x) { return tl::log(x); }, [](const at::Tensor& x) { return x.log(); }, true},
      {"sqrt", [](const Variable& x) { return tl::sqrt(x); }, [](const at::Tensor& x) { return x.sqrt(); }, true},
      {"rsqrt", [](const Variable& x) { return tl::rsqrt(x); }, [](const at::Tensor& x) { return x.rsqrt(); }, true},
      {"abs", [](const Variable& x) { return tl::abs(x); }, [](const at::Tensor& x) { return x.abs(); }, false},
      {"clamp", [](const Variable& x) { return tl::clamp(x, -0.5, 0.7); },
       [](const at::Tensor& x) { return x.clamp(-0.5, 0.7); }, false},
      {"clamp_min", [](const Variable& x) { return tl::clamp(x, 0.1, std::nullopt); },
       [](const at::Tensor& x) { return x.clamp_min(0.1); }, false},
  };
  for (const auto& op : ops) {
    auto fn = [&](const variable_list& v) { return op.tl_fn(v[0]); };
    at::Tensor x = op.positive ? pos({3, 5}) : rnd({3, 5});
    // Keep finite differences away from the kinks of abs and clamp.
    if (std::string(op.name).rfind("clamp", 0) == 0 || std::string(op.name) == "abs") {
      x = at::where((x.abs() < 0.05).logical_or((x - 0.7).abs() < 0.05).logical_or((x + 0.5).abs() < 0.05)
                        .logical_or((x - 0.1).abs() < 0.05),
                    x + 0.2, x);
    }
    EXPECT_TRUE(gradcheck(fn, {x}, op.name));
    EXPECT_TRUE(matches_torch(fn, [&](const std::vector<at::Tensor>& t) { return op.ref(t[0]); }, {x.to(at::kFloat)},
                              op.name));
  }
}

}  // namespace
}  // namespace tl
