// Shape, slicing and indexing ops: finite differences in float64 and the libtorch-autograd oracle
// (float32) with negative dims, broadcasting, repeated indices, and multi-output ops (split,
// chunk) where only some outputs are used.
#include <limits>

#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::all_close;
using testing::gradcheck;
using testing::matches_torch;
using tensor_list = std::vector<at::Tensor>;

/// One case: the op under test on Variables, the same ATen computation, and the shapes of the
/// differentiable inputs. Index/mask tensors are built once per case and captured.
struct ShapeCase {
  std::string label;
  testing::TlFn tl_fn;
  testing::RefFn ref;
  std::vector<std::vector<int64_t>> shapes;
  /// False where finite differences do not apply by design (padding_idx: the forward uses the
  /// row, but it gets no gradient); the oracle still runs.
  bool finite_differences = true;
};

void run_cases(const std::vector<ShapeCase>& cases, const at::TensorOptions& opts, bool with_gradcheck) {
  for (const auto& c : cases) {
    tensor_list f64, oracle;
    for (const auto& s : c.shapes) {
      f64.push_back(at::randn(s, at::kDouble));
      oracle.push_back(at::randn(s, opts));
    }
    if (with_gradcheck && c.finite_differences) {
      EXPECT_TRUE(gradcheck(c.tl_fn, f64, c.label));
    }
    EXPECT_TRUE(matches_torch(c.tl_fn, c.ref, oracle, c.label + " " + c10::str(opts.device())));
  }
}

at::Tensor idx(std::vector<int64_t> v, const at::TensorOptions& opts) {
  return at::tensor(v, at::TensorOptions(at::kLong)).to(opts.device());
}

// The case tables stay one case per line or two (clang-format would spread each lambda out).
// clang-format off
std::vector<ShapeCase> view_cases() {
  using V = const variable_list&;
  using T = const tensor_list&;
  return {
      {"reshape {4,-1}", [](V v) { return tl::reshape(v[0], {4, -1}); }, [](T t) { return t[0].reshape({4, -1}); },
       {{2, 3, 4}}},
      {"reshape of a transposed input", [](V v) { return tl::reshape(tl::transpose(v[0], 0, 1), {-1}); },
       [](T t) { return t[0].transpose(0, 1).reshape({-1}); }, {{3, 4}}},
      {"view {6,4}", [](V v) { return tl::view(v[0], {6, 4}); }, [](T t) { return t[0].view({6, 4}); }, {{2, 3, 4}}},
      {"permute {2,0,1}", [](V v) { return tl::permute(v[0], {2, 0, 1}); }, [](T t) { return t[0].permute({2, 0, 1}); },
       {{2, 3, 4}}},
      {"permute {-1,0,-2}", [](V v) { return tl::permute(v[0], {-1, 0, -2}); },
       [](T t) { return t[0].permute({-1, 0, -2}); }, {{2, 3, 4}}},
      {"transpose 0,-1", [](V v) { return tl::transpose(v[0], 0, -1); }, [](T t) { return t[0].transpose(0, -1); },
       {{2, 3, 4}}},
      {"flatten", [](V v) { return tl::flatten(v[0]); }, [](T t) { return t[0].flatten(); }, {{2, 3, 4}}},
      {"flatten 1,-1", [](V v) { return tl::flatten(v[0], 1, -1); }, [](T t) { return t[0].flatten(1, -1); },
       {{2, 3, 4}}},
      {"squeeze 1", [](V v) { return tl::squeeze(v[0], 1); }, [](T t) { return t[0].squeeze(1); }, {{2, 1, 3}}},
      {"squeeze -1 (size 3: no-op)", [](V v) { return tl::squeeze(v[0], -1); }, [](T t) { return t[0].squeeze(-1); },
       {{2, 1, 3}}},
      {"unsqueeze 0", [](V v) { return tl::unsqueeze(v[0], 0); }, [](T t) { return t[0].unsqueeze(0); }, {{2, 3}}},
      {"unsqueeze -1", [](V v) { return tl::unsqueeze(v[0], -1); }, [](T t) { return t[0].unsqueeze(-1); }, {{2, 3}}},
      {"expand (3,1)->(2,3,4)", [](V v) { return tl::expand(v[0], {2, 3, 4}); },
       [](T t) { return t[0].expand({2, 3, 4}); }, {{3, 1}}},
      {"expand (1,4)->(3,-1)", [](V v) { return tl::expand(v[0], {3, -1}); }, [](T t) { return t[0].expand({3, -1}); },
       {{1, 4}}},
      {"expand (4)->(2,4)", [](V v) { return tl::expand(v[0], {2, 4}); }, [](T t) { return t[0].expand({2, 4}); },
       {{4}}},
  };
}

std::vector<ShapeCase> slice_cat_cases() {
  using V = const variable_list&;
  using T = const tensor_list&;
  const int64_t end_max = std::numeric_limits<int64_t>::max();
  return {
      {"narrow 1,1,2", [](V v) { return tl::narrow(v[0], 1, 1, 2); }, [](T t) { return t[0].narrow(1, 1, 2); },
       {{2, 4, 3}}},
      {"narrow -1,0,1", [](V v) { return tl::narrow(v[0], -1, 0, 1); }, [](T t) { return t[0].narrow(-1, 0, 1); },
       {{2, 4, 3}}},
      {"slice 1,0,5,2", [](V v) { return tl::slice(v[0], 1, 0, 5, 2); }, [](T t) { return t[0].slice(1, 0, 5, 2); },
       {{2, 6}}},
      {"slice -1,1,max,3", [=](V v) { return tl::slice(v[0], -1, 1, end_max, 3); },
       [=](T t) { return t[0].slice(-1, 1, end_max, 3); }, {{3, 7}}},
      {"slice 0,-2,max", [=](V v) { return tl::slice(v[0], 0, -2, end_max); },
       [=](T t) { return t[0].slice(0, -2, end_max); }, {{4, 2}}},
      {"cat dim 1", [](V v) { return tl::cat({v[0], v[1], v[2]}, 1); },
       [](T t) { return at::cat({t[0], t[1], t[2]}, 1); }, {{2, 1, 3}, {2, 4, 3}, {2, 2, 3}}},
      {"cat dim -1", [](V v) { return tl::cat({v[0], v[1]}, -1); }, [](T t) { return at::cat({t[0], t[1]}, -1); },
       {{3, 2}, {3, 5}}},
      {"cat with a repeated input", [](V v) { return tl::cat({v[0], v[1], v[0]}, 0); },
       [](T t) { return at::cat({t[0], t[1], t[0]}, 0); }, {{2, 3}, {1, 3}}},
  };
}

std::vector<ShapeCase> split_chunk_cases() {
  using V = const variable_list&;
  using T = const tensor_list&;
  return {
      // All outputs used, in a different order than produced (each gradient must go to its own stretch).
      {"split 2 dim 1, all outputs (reversed)",
       [](V v) {
         auto s = tl::split(v[0], 2, 1);
         return tl::cat({s[2], s[0], s[1]}, 1);
       },
       [](T t) {
         auto s = t[0].split(2, 1);
         return at::cat({s[2], s[0], s[1]}, 1);
       },
       {{2, 5, 3}}},
      // Only some outputs used: the engine fills zeros for the others.
      {"split 2 dim -1, only output 1", [](V v) { return tl::split(v[0], 2, -1)[1]; },
       [](T t) { return t[0].split(2, -1)[1]; }, {{3, 5}}},
      {"split 3 dim 0, outputs 0 and 2 scaled",
       [](V v) {
         auto s = tl::split(v[0], 3, 0);
         return tl::cat({s[0] * 2.0, s[2]}, 0);
       },
       [](T t) {
         auto s = t[0].split(3, 0);
         return at::cat({s[0] * 2.0, s[2]}, 0);
       },
       {{7, 2}}},
      {"chunk 3 dim -1, all outputs summed",
       [](V v) {
         auto c = tl::chunk(v[0], 3, -1);
         return tl::sum(c[0], {-1}) + tl::sum(c[1], {-1}) * 3.0 + tl::sum(c[2], {-1});
       },
       [](T t) {
         auto c = t[0].chunk(3, -1);
         return c[0].sum({-1}) + c[1].sum({-1}) * 3.0 + c[2].sum({-1});
       },
       {{4, 7}}},
      {"chunk 2 dim 0, only output 1", [](V v) { return tl::chunk(v[0], 2, 0)[1]; },
       [](T t) { return t[0].chunk(2, 0)[1]; }, {{5, 3}}},
  };
}

std::vector<ShapeCase> index_cases(const at::TensorOptions& opts) {
  using V = const variable_list&;
  using T = const tensor_list&;
  const at::Tensor rows = idx({2, 0, 2, 1}, opts);  // repeated: gradients must add up
  const at::Tensor cols = idx({4, 4, 0}, opts);
  const at::Tensor g1 = idx({0, 4, 4, 1, 2, 2, 3, 0, 1, 1, 1, 1}, opts).reshape({3, 4});
  const at::Tensor g0 = idx({1, 0, 1, 1, 0}, opts).reshape({1, 5});
  const at::Tensor tokens = idx({1, 3, 1, 0, 5, 1}, opts).reshape({2, 3});
  const at::Tensor mask_full = at::rand({3, 4}, opts.dtype(at::kFloat)) > 0.5;
  const at::Tensor mask_row = idx({1, 0, 0, 1}, opts).to(at::kBool).reshape({1, 4});
  const at::Tensor cond = at::rand({3, 4}, opts.dtype(at::kFloat)) > 0.5;
  const at::Tensor cond_row = idx({0, 1, 1, 0}, opts).to(at::kBool);
  return {
      {"index_select dim 0 repeated", [=](V v) { return tl::index_select(v[0], 0, rows); },
       [=](T t) { return t[0].index_select(0, rows); }, {{3, 4}}},
      {"index_select dim -1", [=](V v) { return tl::index_select(v[0], -1, cols); },
       [=](T t) { return t[0].index_select(-1, cols); }, {{2, 5}}},
      {"gather dim 1", [=](V v) { return tl::gather(v[0], 1, g1); }, [=](T t) { return t[0].gather(1, g1); },
       {{3, 5}}},
      {"gather dim -2", [=](V v) { return tl::gather(v[0], -2, g0); }, [=](T t) { return t[0].gather(-2, g0); },
       {{2, 5}}},
      {"embedding", [=](V v) { return tl::embedding(v[0], tokens); }, [=](T t) { return at::embedding(t[0], tokens); },
       {{6, 4}}},
      {"embedding padding_idx=1", [=](V v) { return tl::embedding(v[0], tokens, 1); },
       [=](T t) { return at::embedding(t[0], tokens, 1); }, {{6, 4}}, /*finite_differences=*/false},
      {"masked_fill same shape", [=](V v) { return tl::masked_fill(v[0], mask_full, -2.5); },
       [=](T t) { return t[0].masked_fill(mask_full, -2.5); }, {{3, 4}}},
      {"masked_fill broadcast mask", [=](V v) { return tl::masked_fill(v[0], mask_row, 7.0); },
       [=](T t) { return t[0].masked_fill(mask_row, 7.0); }, {{3, 4}}},
      {"masked_fill mask wider than x", [=](V v) { return tl::masked_fill(v[0], mask_full, 0.0); },
       [=](T t) { return at::masked_fill(t[0], mask_full, 0.0); }, {{4}}},
      {"where same shapes", [=](V v) { return tl::where(cond, v[0], v[1]); },
       [=](T t) { return at::where(cond, t[0], t[1]); }, {{3, 4}, {3, 4}}},
      {"where broadcast a (3,1) b (1,4)", [=](V v) { return tl::where(cond, v[0], v[1]); },
       [=](T t) { return at::where(cond, t[0], t[1]); }, {{3, 1}, {1, 4}}},
      {"where broadcast condition (4)", [=](V v) { return tl::where(cond_row, v[0], v[1]); },
       [=](T t) { return at::where(cond_row, t[0], t[1]); }, {{3, 4}, {4}}},
  };
}

// clang-format on

TEST(Shape, ViewsGradcheckAndOracle) {
  at::manual_seed(0);
  run_cases(view_cases(), at::kFloat, /*with_gradcheck=*/true);
}

TEST(Shape, SliceCatGradcheckAndOracle) {
  at::manual_seed(1);
  run_cases(slice_cat_cases(), at::kFloat, true);
}

TEST(Shape, SplitChunkPartialOutputs) {
  at::manual_seed(2);
  run_cases(split_chunk_cases(), at::kFloat, true);
  // Only output 1 of 3 used: the gradient is exactly zero outside its stretch.
  Variable x(at::randn({2, 6}, at::kDouble), true);
  tl::sum(tl::split(x, 2, 1)[1]).backward();
  at::Tensor expected = at::zeros({2, 6}, at::kDouble);
  expected.slice(1, 2, 4).fill_(1.0);
  EXPECT_TRUE(all_close(x.grad(), expected, "split, only output 1 used", 0, 0));
}

TEST(Shape, IndexingGradcheckAndOracle) {
  at::manual_seed(3);
  run_cases(index_cases(at::kFloat), at::kFloat, true);
  // padding_idx row gets no gradient even though it is looked up twice.
  Variable w(at::randn({6, 4}, at::kDouble), true);
  at::Tensor tokens = at::tensor({1, 3, 1, 0}, at::kLong);
  tl::sum(tl::embedding(w, tokens, 1)).backward();
  EXPECT_TRUE(all_close(w.grad()[1], at::zeros({4}, at::kDouble), "embedding padding row grad", 0, 0));
  EXPECT_TRUE(all_close(w.grad()[3], at::ones({4}, at::kDouble), "embedding row 3 grad", 0, 0));
  // Bad arguments are reported, not silently accepted.
  EXPECT_THROW(tl::embedding(w, tokens, 6), c10::Error);
  EXPECT_THROW(tl::embedding(w, tokens.to(at::kFloat)), c10::Error);
  EXPECT_THROW(tl::masked_fill(w, at::ones({6, 4}, at::kLong), 0.0), c10::Error);
  EXPECT_THROW(tl::cat({}, 0), c10::Error);
}

TEST(Shape, CudaOracle) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(4);
  const auto opts = at::TensorOptions(at::kFloat).device(at::kCUDA);
  run_cases(view_cases(), opts, false);
  run_cases(slice_cat_cases(), opts, false);
  run_cases(split_chunk_cases(), opts, false);
  run_cases(index_cases(opts), opts, false);
}

}  // namespace
}  // namespace tl
