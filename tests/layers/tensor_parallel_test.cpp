// Tensor-parallel blocks (Note [tensor-parallel blocks]): T threads, each holding one rank's
// shard of the same block and summing through shared memory, compute what the unsplit block
// computes, forward and backward. The runtime's communicator over processes and codecs is tested
// in tests/parallel/tensor_parallel_test.cpp and tests/tasks/multiprocess_train_test.cpp.
#include "layers/nn/tensor_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "layers/nn/transformer.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::error_of;

TEST(TensorShard, ShardAndUnshardAreInverses) {
  const at::Tensor full = at::arange(24, at::kFloat).view({12, 2});
  for (const TensorShard s : {TensorShard{0, 1}, TensorShard{0, 3}, TensorShard{1, 1}}) {
    const int64_t size = s.dim == 1 ? 2 : 2;
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < size; ++r) parts.push_back(shard_tensor(full, s, r, size));
    EXPECT_TRUE(unshard_tensor(parts, s).equal(full)) << "dim " << s.dim << " groups " << s.groups;
  }
  // A fused [q; k; v] of 12 rows over 2 ranks: rank 1 holds rows 2-3, 6-7 and 10-11.
  const at::Tensor r1 = shard_tensor(full, {0, 3}, 1, 2);
  EXPECT_TRUE(r1.select(1, 0).equal(at::tensor({4.f, 6.f, 12.f, 14.f, 20.f, 22.f})));
  EXPECT_NE(error_of([&] {
              shard_tensor(full, {0, 5}, 0, 2);
            }).find("is not 5 block(s) of 2 equal parts"),
            std::string::npos);
}

// An all-reduce between threads: each rank's tensor in a slot, summed in rank order by every rank
// (so every rank gets the same bits, as the runtime's communicator guarantees).
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : slots_(static_cast<size_t>(size)) {}
  at::Tensor all_reduce(int rank, const at::Tensor& x) {
    slots_[static_cast<size_t>(rank)] = x;
    wait();
    at::Tensor sum = slots_[0].clone();
    for (size_t r = 1; r < slots_.size(); ++r) sum.add_(slots_[r]);
    wait();  // nobody overwrites a slot before everyone has read it
    return sum;
  }
  int calls = 0;

 private:
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t gen = generation_;
    if (++arrived_ == static_cast<int>(slots_.size())) {
      arrived_ = 0, ++generation_, ++calls;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }
  std::vector<at::Tensor> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

class ThreadComm : public TensorParallelComm {
 public:
  ThreadComm(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  at::Tensor all_reduce(const at::Tensor& x, const std::string& site, TpDirection direction) override {
    log.push_back(site + (direction == TpDirection::Forward ? " forward" : " backward"));
    return group_.all_reduce(rank_, x);
  }
  std::vector<std::string> log;

 private:
  ThreadGroup& group_;
  int rank_;
};

struct Result {
  at::Tensor y, grad_x;
  std::map<std::string, at::Tensor> grads;
  std::vector<std::string> log;
};

Result run_block(const TransformerBlockOptions& o, int64_t rank, int64_t size, ThreadGroup* group, const at::Tensor& x0,
                 const at::Tensor& grad_y) {
  at::Generator gen = at::detail::createCPUGenerator(7);
  auto block = std::make_shared<TransformerBlock>(o, gen);
  auto comm = group ? std::make_shared<ThreadComm>(*group, static_cast<int>(rank)) : nullptr;
  if (size > 1) {
    auto tp = std::make_shared<TensorParallel>(rank, size);
    tp->bind(comm);
    shard_tensor_parallel(*block, tp, "block");
  }
  Variable x(x0.clone(), true);
  Variable y = block->forward(x);
  y.backward(grad_y);
  Result r{y.data(), x.grad(), {}, {}};
  for (const auto& [n, p] : block->named_parameters()) r.grads[n] = p.grad();
  if (comm) r.log = comm->log;
  return r;
}

void expect_split_matches_whole(const TransformerBlockOptions& o, int64_t size) {
  const at::Tensor x = at::randn({2, 5, o.dim_}, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor grad_y = at::randn_like(x);
  const Result whole = run_block(o, 0, 1, nullptr, x, grad_y);
  ThreadGroup group(static_cast<int>(size));
  std::vector<Result> parts(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < size; ++r)
    threads.emplace_back([&, r] { parts[static_cast<size_t>(r)] = run_block(o, r, size, &group, x, grad_y); });
  for (auto& t : threads) t.join();

  // A sharded block of the same seed: which parameters are split, and how.
  auto probe = std::make_shared<TransformerBlock>(o, at::detail::createCPUGenerator(7));
  shard_tensor_parallel(*probe, std::make_shared<TensorParallel>(0, size), "block");
  const auto shards = probe->named_shards();
  EXPECT_FALSE(shards.empty());
  const std::string label = "T = " + std::to_string(size);
  for (int64_t r = 0; r < size; ++r) {
    const Result& p = parts[static_cast<size_t>(r)];
    EXPECT_TRUE(all_close(p.y, whole.y, label + " output of rank " + std::to_string(r), 1e-5, 1e-4));
    EXPECT_TRUE(all_close(p.grad_x, whole.grad_x, label + " input gradient of rank " + std::to_string(r), 1e-5, 1e-4));
    EXPECT_TRUE(p.y.equal(parts[0].y)) << "every rank holds the same bits";
    EXPECT_EQ(p.log, parts[0].log);
  }
  for (const auto& [name, g] : whole.grads) {
    auto s = shards.find(name);
    if (s == shards.end()) {  // replicated: the whole gradient on every rank
      for (int64_t r = 0; r < size; ++r)
        EXPECT_TRUE(all_close(parts[static_cast<size_t>(r)].grads.at(name), g, label + " " + name, 1e-5, 1e-4));
      continue;
    }
    std::vector<at::Tensor> gs;
    for (const auto& p : parts) gs.push_back(p.grads.at(name));
    EXPECT_TRUE(all_close(unshard_tensor(gs, s->second), g, label + " " + name + " (gathered)", 1e-5, 1e-4));
  }
  // Two sites (attention, MLP), each one all-reduce forward and one backward.
  EXPECT_EQ(parts[0].log, (std::vector<std::string>{"attn forward", "mlp forward", "mlp backward", "attn backward"}));
}

TEST(TensorParallelBlock, Gpt2StyleSplitOverTwoAndFourRanksMatchesTheWholeBlock) {
  const auto o =
      TransformerBlockOptions(32, 4).norm(NormPlacement::Pre).fused_qkv(true).causal(true).activation("gelu_tanh");
  expect_split_matches_whole(o, 2);
  expect_split_matches_whole(o, 4);
}

TEST(TensorParallelBlock, BertStyleSplitMatchesTheWholeBlock) {
  const auto o = TransformerBlockOptions(32, 4).norm(NormPlacement::Post).fused_qkv(false).hidden(48);
  expect_split_matches_whole(o, 2);
}

TEST(TensorParallelBlock, SizesThatDoNotDivideAreErrorsNamingThem) {
  auto block = std::make_shared<TransformerBlock>(TransformerBlockOptions(24, 6), at::detail::createCPUGenerator(1));
  const std::string e =
      error_of([&] { shard_tensor_parallel(*block, std::make_shared<TensorParallel>(0, 4), "gpt2"); });
  EXPECT_NE(e.find("parallel.tp = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("6 attention heads do not split evenly over 4"), std::string::npos) << e;
  auto linear = std::make_shared<Linear>(4, 4);
  EXPECT_NE(tensor_parallel_problem(*linear, 2).find("ResNets run with parallel.tp = 1"), std::string::npos);
  EXPECT_EQ(tensor_parallel_problem(*block, 3), "");
}

TEST(TensorParallelBlock, AnUnboundGroupIsAnErrorNotACrash) {
  auto block = std::make_shared<TransformerBlock>(TransformerBlockOptions(16, 2), at::detail::createCPUGenerator(1));
  shard_tensor_parallel(*block, std::make_shared<TensorParallel>(0, 2), "gpt2");
  const std::string e = error_of([&] { block->forward(Variable(at::randn({1, 3, 16}))); });
  EXPECT_NE(e.find("no communicator is bound"), std::string::npos) << e;
}

}  // namespace
}  // namespace tl
