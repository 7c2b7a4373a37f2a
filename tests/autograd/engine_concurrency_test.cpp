// The engine under concurrency (Note [concurrent backward passes] in autograd/engine.cpp):
// backward passes on two threads through graphs that share leaves, two backward passes over
// disjoint graphs of one tape, recording on a tape while another thread backpropagates one of its
// graphs; and per-pass state: a failed backward leaves nothing behind on the nodes. Also typed
// saved state and saved_data in user-written Functions. Run these under ThreadSanitizer with a
// -DTAPELINE_SANITIZE=thread build (docs/ARCHITECTURE.md).
#include <atomic>
#include <thread>

#include "autograd/function.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

// (kN, kN) float32 tensor of small integers: every sum below is exact in float32, so the result of
// concurrent accumulation must equal the sequential one bit for bit, whatever the order. The
// leaves are large enough that accumulating into them takes a while, so a missing lock would
// lose updates (ThreadSanitizer does not see those: the writes happen inside libtorch's kernels).
constexpr int64_t kN = 192;
at::Tensor small_ints(int64_t seed) {
  return at::arange(kN * kN, at::kFloat).view({kN, kN}).add(static_cast<double>(seed)).remainder(7.0).sub(3.0);
}

// One step of a small graph over the shared leaves w, b (and a per-call input x): w gets gradients
// along several paths, so accumulation happens inside one pass and across passes. Per step every
// |gradient| stays below 300, so 2 x 1,000 steps sum exactly in float32.
void one_backward(const Variable& w, const Variable& b, int64_t seed) {
  Variable x(small_ints(seed));
  Variable h = mul(w, x) + b;                                   // (kN, kN)
  Variable y = mul(h, w) + mul(w, 2.0);                         // (kN, kN)
  Variable z = matmul(narrow(y, 0, 0, 4), narrow(w, 1, 0, 4));  // (4, 4)
  (sum(mul(y, Variable(small_ints(seed + 1)))) + sum(z)).backward();
}

struct Leaves {
  Variable w{at::eye(kN, at::kFloat).sub(small_ints(5).remainder(2.0)), true};  // entries in {-1, 0, 1}
  Variable b{at::ones({kN, kN}, at::kFloat), true};
};

TEST(EngineConcurrency, TwoThreadsThousandBackwardsThroughSharedLeavesEqualTheSequentialSum) {
  constexpr int kIters = 1000;
  Leaves shared;
  auto worker = [&](int thread) {
    Tape tape;  // each thread records on its own tape, as a pipeline stage does
    TapeGuard guard(tape);
    for (int i = 0; i < kIters; ++i) one_backward(shared.w, shared.b, thread * 7 + i % 5);
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();

  Leaves sequential;
  for (int thread = 0; thread < 2; ++thread)
    for (int i = 0; i < kIters; ++i) one_backward(sequential.w, sequential.b, thread * 7 + i % 5);

  ASSERT_TRUE(shared.w.grad().defined() && shared.b.grad().defined());
  EXPECT_TRUE(shared.w.grad().equal(sequential.w.grad()))
      << "w: max diff " << testing::max_diff(shared.w.grad(), sequential.w.grad());
  EXPECT_TRUE(shared.b.grad().equal(sequential.b.grad()))
      << "b: max diff " << testing::max_diff(shared.b.grad(), sequential.b.grad());
  // The values are exact integers, so the check above has teeth: a lost update would show.
  EXPECT_GT(sequential.w.grad().abs().sum().item<double>(), 0.0);
}

TEST(EngineConcurrency, ThreadsOnTheirDefaultTapesAndASharedLeafHook) {
  // No TapeGuard: each thread's default tape. The leaf hook runs once per pass, on the pass's
  // thread, with that pass's summed gradient.
  constexpr int kIters = 300;
  Leaves shared;
  std::atomic<int> hook_calls{0};
  shared.b.register_hook([&](const at::Tensor& g) {
    hook_calls.fetch_add(1, std::memory_order_relaxed);
    return at::Tensor();
  });
  auto worker = [&](int thread) {
    for (int i = 0; i < kIters; ++i) one_backward(shared.w, shared.b, thread + i % 3);
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  Leaves sequential;
  for (int thread = 0; thread < 2; ++thread)
    for (int i = 0; i < kIters; ++i) one_backward(sequential.w, sequential.b, thread + i % 3);
  EXPECT_EQ(hook_calls.load(), 2 * kIters);
  EXPECT_TRUE(shared.w.grad().equal(sequential.w.grad()));
  EXPECT_TRUE(shared.b.grad().equal(sequential.b.grad()));
}

TEST(EngineConcurrency, TwoBackwardsOverDisjointGraphsOfOneTapeOnTwoThreads) {
  // Both graphs are recorded on one tape; their backward passes then run at the same time. Each
  // pass keeps its gradient buffers to itself, so neither sees the other's.
  constexpr int kRounds = 200;
  Leaves shared;
  Leaves sequential;
  Tape tape;
  for (int round = 0; round < kRounds; ++round) {
    Variable y0, y1;
    {
      TapeGuard guard(tape);
      y0 = sum(matmul(mul(shared.w, Variable(small_ints(round))) + shared.b, shared.w));
      y1 = sum(mul(shared.w, shared.b) * 3.0 + shared.w);
    }
    std::thread t0([&] { y0.backward(); }), t1([&] { y1.backward(); });
    t0.join();
    t1.join();
    Tape seq_tape;
    TapeGuard guard(seq_tape);
    sum(matmul(mul(sequential.w, Variable(small_ints(round))) + sequential.b, sequential.w)).backward();
    sum(mul(sequential.w, sequential.b) * 3.0 + sequential.w).backward();
  }
  EXPECT_TRUE(shared.w.grad().equal(sequential.w.grad()));
  EXPECT_TRUE(shared.b.grad().equal(sequential.b.grad()));
  EXPECT_LT(tape.size(), 4096u) << "the passes' garbage collection keeps the shared tape small";
}

TEST(EngineConcurrency, RecordingOnATapeWhileAnotherThreadBackpropagatesOneOfItsGraphs) {
  // The owner thread keeps recording (enough to trigger the tape's garbage collection) while a
  // second thread runs backward through a graph recorded earlier on the same tape.
  Tape tape;
  Variable w(at::full({8}, 0.5, at::kFloat), true);
  Variable root;
  {
    TapeGuard guard(tape);
    Variable h = w;
    for (int i = 0; i < 500; ++i) h = h * 1.0 + 0.0;
    root = sum(h);
  }
  std::atomic<bool> done{false};
  std::thread backward_thread([&] {
    root.backward();
    done = true;
  });
  {
    TapeGuard guard(tape);
    Variable v(at::ones({8}), true);
    for (int i = 0; i < 10000; ++i) (void)(v * 2.0);  // unused results: garbage for the tape
  }
  backward_thread.join();
  ASSERT_TRUE(done.load());
  EXPECT_TRUE(w.grad().equal(at::ones({8})));
}

TEST(EngineConcurrency, AFailedBackwardLeavesNoStateOnTheNodes) {
  // A hook throws half way through a backward. The gradient that had reached the nodes below it
  // belonged to that pass only; the next pass over the same (retained) graph starts clean.
  Variable x(at::full({3}, 2.0, at::kDouble), true);
  Variable h = x * x;    // d/dx = 2x = 4
  Variable m = h * 3.0;  // d/dh = 3
  bool fail = true;
  m.register_hook([&](const at::Tensor& g) {
    if (fail) throw std::runtime_error("hook failure");
    return at::Tensor();
  });
  Variable y = sum(m + h);  // h also reached directly: its buffer already holds a gradient when the hook throws
  EXPECT_THROW(y.backward({}, /*retain_graph=*/true), std::runtime_error);
  EXPECT_FALSE(x.grad().defined());
  fail = false;
  y.backward();
  EXPECT_TRUE(x.grad().equal(at::full({3}, 16.0, at::kDouble))) << x.grad();  // (3 + 1) * 2x
}

// A user extension keeping non-tensor state in saved_data (the string-keyed map), and one with
// typed state (struct Saved): both must keep working.
struct ScaleBySavedData : Function<ScaleBySavedData> {
  static at::Tensor forward(Context& ctx, const at::Tensor& x, double factor) {
    ctx.saved_data["factor"] = factor;
    return x * factor;
  }
  static std::vector<at::Tensor> backward(Context& ctx, std::vector<at::Tensor> g) {
    return {g[0] * ctx.saved_data.at("factor").toDouble()};
  }
};

struct ScaleByTypedState : Function<ScaleByTypedState> {
  static constexpr const char* name = "scale_typed";
  struct Saved {
    double factor = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& saved, const at::Tensor& x, double factor) {
    saved.factor = factor;
    return x * factor;
  }
  static std::vector<at::Tensor> backward(Context& ctx, const Saved& saved, std::vector<at::Tensor> g) {
    return {g[0] * saved.factor};
  }
};

TEST(EngineConcurrency, UserFunctionsWithSavedDataAndWithTypedState) {
  Variable x(at::ones({2}, at::kDouble), true);
  sum(ScaleBySavedData::apply(x, 3.0)).backward();
  sum(ScaleByTypedState::apply(x, 5.0)).backward();
  EXPECT_TRUE(x.grad().equal(at::full({2}, 8.0, at::kDouble)));
  Tape tape;
  TapeGuard guard(tape);
  Variable y = ScaleByTypedState::apply(x, 2.0);
  EXPECT_NE(tape.to_string().find("scale_typed"), std::string::npos);
  // Without grad the typed state is a throwaway and nothing is recorded.
  NoGradGuard no_grad;
  EXPECT_TRUE(ScaleByTypedState::apply(x, 2.0).data().equal(at::full({2}, 2.0, at::kDouble)));
  EXPECT_EQ(tape.size(), 1u);
}

}  // namespace
}  // namespace tl
