// AQ-SGD: warm-up sends raw, the per-sample cache tracks a fixed input at both ends, unseen samples
// go raw, missing ids are a clear error, fp16 and memory-mapped caches. The fused CUDA kernels of
// its cache passes (compression/cuda/aqsgd_*): their logic, run on the host by HostEmulationGuard,
// leaves both caches, the payloads and the receiver's outputs equal, bit for bit and step after
// step, to the ATen path's, for every cache type and a quantising and a sparsifying inner codec; on
// a GPU (label gpu) the kernels themselves do, against the CPU.
#include "compression/stateful/aqsgd.h"

#include <unistd.h>

#include <filesystem>

#include "compression/cuda/aqsgd_cuda.h"
#include "compression/spec.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;
using testing::same_payload;

std::shared_ptr<AqSgd> make_aqsgd(const std::string& spec) {
  auto c = std::dynamic_pointer_cast<AqSgd>(parse_compressor(spec));
  EXPECT_TRUE(c) << spec;
  return c;
}

CodecContext ctx_for(std::vector<int64_t> ids, int64_t epoch) {
  CodecContext ctx;
  ctx.sample_ids = at::tensor(ids, at::kLong);
  ctx.epoch = epoch;
  return ctx;
}

at::Tensor cache_rows(stateful::SampleCache& c, const std::vector<int64_t>& ids, int64_t d) {
  return c.gather(at::tensor(ids, at::kLong), d, at::kFloat, at::kCPU);
}

TEST(AqSgd, WarmupSendsRaw) {
  auto aq = make_aqsgd("aqsgd(quant(2))");
  at::manual_seed(0);
  at::Tensor x = at::randn({3, 4, 5});
  CodecContext ctx = ctx_for({7, 1, 4}, /*epoch=*/0);
  Payload p = aq->encode(x, ctx);
  EXPECT_TRUE(AqSgd::is_raw(p));
  EXPECT_EQ(p.nbytes(), p.header_bytes() + x.numel() * sizeof(float)) << "raw payload = header + values";
  EXPECT_EQ(p.header_bytes(), 8u + 8u * 3u + 8u);
  at::Tensor out = aq->decode(p, ctx);
  EXPECT_TRUE(all_close(out, x, "warm-up is lossless", 0, 0));
  EXPECT_TRUE(all_close(cache_rows(aq->sender_cache(), {7, 1, 4}, 20), x.reshape({3, 20}), "sender m <- x", 0, 0));
  EXPECT_TRUE(all_close(cache_rows(aq->receiver_cache(), {7, 1, 4}, 20), x.reshape({3, 20}), "receiver m <- x", 0, 0));
}

TEST(AqSgd, CacheTracksAFixedInput) {
  auto aq = make_aqsgd("aqsgd(quant(2))");
  at::manual_seed(1);
  const std::vector<int64_t> ids = {0, 1, 2, 3};
  at::Tensor x0 = at::randn({4, 16});
  aq->decode(aq->encode(x0, ctx_for(ids, 0)), ctx_for(ids, 0));  // warm-up: m = x0
  at::Tensor x = at::randn({4, 16});                             // a new, then fixed, input
  double prev = (x - x0).norm().item<double>();
  const double first = prev;
  for (int step = 0; step < 12; ++step) {
    CodecContext ctx = ctx_for(ids, 1);
    Payload p = aq->encode(x, ctx);
    EXPECT_FALSE(AqSgd::is_raw(p)) << "after warm-up the delta goes through C";
    EXPECT_EQ(p.codec, codec_id("quant"));
    at::Tensor out = aq->decode(p, ctx);
    EXPECT_TRUE(all_close(cache_rows(aq->receiver_cache(), ids, 16), cache_rows(aq->sender_cache(), ids, 16),
                          "both caches identical", 0, 0));
    EXPECT_TRUE(all_close(out, cache_rows(aq->receiver_cache(), ids, 16), "receiver outputs m(id)", 0, 0));
    const double err = (x - out).norm().item<double>();
    EXPECT_LT(err, prev) << "step " << step;
    prev = err;
  }
  // 2-bit max-abs quantisation keeps at least half of the delta each step: error -> 0.
  EXPECT_LT(prev, 1e-3 * first);
}

TEST(AqSgd, UnseenSamplesGoRawAfterWarmup) {
  auto aq = make_aqsgd("aqsgd(topk(0.3))");
  at::manual_seed(2);
  aq->decode(aq->encode(at::randn({2, 8}), ctx_for({0, 1}, 0)), ctx_for({0, 1}, 0));
  at::Tensor x = at::randn({2, 8});
  CodecContext ctx = ctx_for({1, 9}, 1);  // sample 9 was never seen
  Payload p = aq->encode(x, ctx);
  EXPECT_TRUE(AqSgd::is_raw(p));
  EXPECT_TRUE(all_close(aq->decode(p, ctx), x, "raw", 0, 0));
  // Now both are cached: the next message is a delta.
  EXPECT_FALSE(AqSgd::is_raw(aq->encode(x, ctx)));
}

TEST(AqSgd, MissingIdsAndDivergedCachesAreErrors) {
  auto aq = make_aqsgd("aqsgd(quant(4))");
  CodecContext none;
  try {
    aq->encode(at::randn({2, 3}), none);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample ids"), std::string::npos) << e.what();
  }
  // A receiver that never saw the warm-up cannot apply a delta.
  auto sender = make_aqsgd("aqsgd(quant(4))");
  auto receiver = make_aqsgd("aqsgd(quant(4))");
  at::Tensor x = at::randn({2, 3});
  sender->encode(x, ctx_for({0, 1}, 0));
  Payload delta = sender->encode(x, ctx_for({0, 1}, 1));
  EXPECT_THROW(receiver->decode(delta, ctx_for({0, 1}, 1)), c10::Error);
}

TEST(AqSgd, Fp16CacheStaysIdenticalAtBothEnds) {
  auto aq = make_aqsgd("aqsgd(quant(3), cache=fp16, warmup=0)");
  at::manual_seed(3);
  at::Tensor x = at::randn({3, 10});
  for (int step = 0; step < 4; ++step) {
    CodecContext ctx = ctx_for({4, 5, 6}, 0);
    at::Tensor out = aq->decode(aq->encode(x + 0.1 * step, ctx), ctx);
    at::Tensor s = cache_rows(aq->sender_cache(), {4, 5, 6}, 10);
    EXPECT_TRUE(all_close(cache_rows(aq->receiver_cache(), {4, 5, 6}, 10), s, "fp16 caches identical", 0, 0));
    // Warm-up (step 0) outputs x itself; afterwards the output is the stored (fp16) m(id).
    if (step > 0) {
      EXPECT_TRUE(all_close(out, s, "output = stored m(id)", 0, 0));
    }
  }
  bool found = false;
  for (auto& [n, v] : aq->named_buffers()) {
    if (n != "cache_sender_rows") continue;
    found = true;
    EXPECT_EQ(v.scalar_type(), at::kHalf);
  }
  EXPECT_TRUE(found) << "the cache is a registered buffer";
}

TEST(AqSgd, EvalUsesPlainCodecAndLeavesCache) {
  auto aq = make_aqsgd("aqsgd(quant(4))");
  at::Tensor x = at::randn({2, 6});
  aq->decode(aq->encode(x, ctx_for({0, 1}, 0)), ctx_for({0, 1}, 0));
  at::Tensor before = cache_rows(aq->sender_cache(), {0, 1}, 6).clone();
  CodecContext eval = ctx_for({0, 1}, 5);
  eval.training = false;
  at::Tensor y = at::randn({2, 6});
  auto q = parse_compressor("quant(4)");
  CodecContext plain;
  EXPECT_TRUE(
      all_close(aq->decode(aq->encode(y, eval), eval), q->decode(q->encode(y, plain), plain), "eval: C(x)", 0, 0));
  EXPECT_TRUE(all_close(cache_rows(aq->sender_cache(), {0, 1}, 6), before, "cache untouched", 0, 0));
}

// The capacity bounds the ids; in memory the rows grow with the ids seen, not to the capacity up
// front (8192 rows of a 1024 x 1024 message would be 16 GB in fp16 before the first step).
TEST(AqSgd, CapacityBoundsTheIdsWithoutAllocatingThem) {
  auto aq = make_aqsgd("aqsgd(quant(3), capacity=100000)");
  at::Tensor x = at::randn({3, 2, 4});
  aq->decode(aq->encode(x, ctx_for({2, 0, 5}, 0)), ctx_for({2, 0, 5}, 0));
  auto rows = [&] {
    for (auto& [n, v] : aq->named_buffers())
      if (n == "cache_sender_rows") return v.size(0);
    return int64_t(-1);
  };
  EXPECT_EQ(rows(), 6);  // ids 0..5
  const at::Tensor before = cache_rows(aq->sender_cache(), {2, 0, 5}, 8).clone();
  aq->encode(at::randn({1, 2, 4}), ctx_for({40}, 1));
  EXPECT_EQ(rows(), 41);
  EXPECT_TRUE(all_close(cache_rows(aq->sender_cache(), {2, 0, 5}, 8), before, "rows kept when the cache grows", 0, 0));
  EXPECT_THROW(aq->encode(x, ctx_for({2, 100000, 5}, 1)), c10::Error) << "id beyond capacity";
}

TEST(AqSgd, MemoryMappedCacheMatchesInMemory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tl_aqsgd_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "cache.bin").string();
  AqSgd::Options o;
  o.cache.capacity = 10;
  o.cache.file = file;
  {
    auto mapped = std::make_shared<AqSgd>(parse_compressor("quant(3)"), o);
    auto memory = make_aqsgd("aqsgd(quant(3), capacity=10)");
    at::manual_seed(4);
    at::Tensor x = at::randn({3, 2, 4});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      CodecContext ctx = ctx_for({9, 0, 5}, epoch);
      at::Tensor a = mapped->decode(mapped->encode(x * (epoch + 1), ctx), ctx);
      at::Tensor b = memory->decode(memory->encode(x * (epoch + 1), ctx), ctx);
      EXPECT_TRUE(all_close(a, b, "mapped == in-memory, epoch " + std::to_string(epoch), 0, 0));
    }
    EXPECT_EQ(fs::file_size(file + ".sender"), 10u * 8u * sizeof(float));
    EXPECT_EQ(fs::file_size(file + ".receiver"), 10u * 8u * sizeof(float));
    EXPECT_THROW(mapped->encode(x, ctx_for({10, 1, 2}, 3)), c10::Error) << "id beyond capacity";
  }
  // No temporary file is left behind; a file of the wrong size is refused.
  for (auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  o.cache.capacity = 11;
  auto wrong = std::make_shared<AqSgd>(parse_compressor("quant(3)"), o);
  EXPECT_THROW(wrong->encode(at::randn({1, 8}), ctx_for({0}, 0)), c10::Error);
  fs::remove_all(dir);
}

TEST(AqSgd, SpecRoundTrip) {
  for (std::string spec : {"aqsgd(quant(4))", "aqsgd(topk(0.3), warmup=2, capacity=100, cache=bf16)"}) {
    auto c = parse_compressor(spec);
    EXPECT_EQ(parse_compressor(c->spec())->spec(), c->spec()) << spec;
  }
  EXPECT_THROW(parse_compressor("aqsgd(quant(4), cache=int8)"), c10::Error);
  EXPECT_THROW(parse_compressor("aqsgd(quant(4), warmup=-1)"), c10::Error);
}

// Every registered buffer of a and b (the caches' rows and seen masks) equal, bit for bit.
::testing::AssertionResult same_buffers(AqSgd& a, AqSgd& b) {
  auto ba = a.named_buffers(), bb = b.named_buffers();
  if (ba.size() != bb.size()) return ::testing::AssertionFailure() << ba.size() << " vs " << bb.size() << " buffers";
  for (size_t i = 0; i < ba.size(); ++i) {
    const at::Tensor x = ba[i].second.data(), y = bb[i].second.data();
    if (ba[i].first != bb[i].first || !x.sizes().equals(y.sizes()) || x.scalar_type() != y.scalar_type() ||
        !at::equal(x.cpu(), y.cpu()))
      return ::testing::AssertionFailure() << "buffer " << ba[i].first << " differs";
  }
  return ::testing::AssertionSuccess();
}

const std::vector<std::string>& aqsgd_specs() {
  static const std::vector<std::string> specs = {
      "aqsgd(quant(4), warmup=0)", "aqsgd(quant(3, scale=channel), warmup=0, cache=fp16)",
      "aqsgd(quant(2), warmup=0, cache=bf16)", "aqsgd(topk(0.3), warmup=0, cache=fp16)",
      "aqsgd(topk(0.3, values=fp32), warmup=0)"};
  return specs;
}

// Steps over overlapping micro-batches of ids (new ids go raw, seen ones as deltas), with inputs
// that drift, so deltas are small and caches change every step. (B, 5, 7) float32 messages.
struct Step {
  std::vector<int64_t> ids;
  at::Tensor x;
};
std::vector<Step> aqsgd_steps() {
  at::manual_seed(41);
  at::Tensor base = at::randn({12, 5, 7}) * 3;  // one message per sample id
  const std::vector<std::vector<int64_t>> batches = {{0, 1, 2, 3}, {4, 5, 6, 7},   {2, 0, 3, 1},  {5, 7, 4, 6},
                                                     {0, 1, 2, 3}, {8, 9, 10, 11}, {11, 1, 6, 8}, {3, 10, 9, 2}};
  std::vector<Step> steps;
  for (size_t s = 0; s < batches.size(); ++s) {
    at::Tensor idx = at::tensor(batches[s], at::kLong);
    steps.push_back({batches[s], base.index_select(0, idx) + 0.05 * static_cast<double>(s) * at::randn({4, 5, 7})});
  }
  return steps;
}

TEST(AqSgdKernelLogic, SameCachesPayloadsAndOutputsAsAtenPath) {
  const std::vector<Step> steps = aqsgd_steps();
  for (const auto& spec : aqsgd_specs()) {
    auto aten = make_aqsgd(spec), fused = make_aqsgd(spec);
    int64_t deltas = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      const std::string where = spec + ", step " + std::to_string(s);
      CodecContext ctx = ctx_for(steps[s].ids, 0);
      Payload pa = aten->encode(steps[s].x, ctx);
      at::Tensor ya = aten->decode(pa, ctx);
      const int64_t runs = codec::gpu::aqsgd_host_runs();
      Payload pf;
      at::Tensor yf;
      {
        codec::gpu::HostEmulationGuard guard;
        pf = fused->encode(steps[s].x, ctx);
        yf = fused->decode(pf, ctx);
      }
      const bool raw = AqSgd::is_raw(pa);
      deltas += !raw;
      // A delta step runs the delta and update passes at the sender and the update at the receiver.
      EXPECT_EQ(codec::gpu::aqsgd_host_runs() - runs, raw ? 0 : 3) << where << ": the kernels' logic did not run";
      EXPECT_TRUE(same_payload(pf, pa)) << where;
      EXPECT_TRUE(at::equal(yf, ya)) << where << ": receiver outputs differ, max diff "
                                     << (yf - ya).abs().max().item<float>();
      EXPECT_TRUE(same_buffers(*fused, *aten)) << where;
    }
    EXPECT_EQ(deltas, 5) << spec;
  }
}

TEST(AqSgdKernelLogic, CacheRoundingFollowsAtensCasts) {
  // The update rounds to fp16 as at::Tensor::to does: 65000 + 600 overflows to inf (no clamp).
  const float big = 65000.0f;
  at::Tensor rows = at::full({2, 3}, big).to(at::kHalf);  // (N, D)
  at::Tensor ids = at::tensor({1}, at::kLong);
  at::Tensor c = at::tensor({600.0f, -0.5f, 1e-8f}).view({1, 3});
  at::Tensor want = (rows.index_select(0, ids).to(at::kFloat) + c).to(at::kHalf);
  const codec::gpu::CacheRows m{rows.data_ptr(), codec::gpu::WireType::kF16, 3, ids.data_ptr<int64_t>(), 1};
  at::Tensor out = at::empty({1, 3});
  codec::gpu::aqsgd_update_host(c.data_ptr<float>(), m, out.data_ptr<float>());
  EXPECT_TRUE(at::equal(rows[1].view({1, 3}), want));
  EXPECT_TRUE(std::isinf(out[0][0].item<float>()));
  EXPECT_TRUE(at::equal(rows[0], at::full({3}, big).to(at::kHalf))) << "row 0 is not in the batch";
}

TEST(AqSgdGpu, KernelCachesEqualCpu) {
  std::string why;
  if (testing::skip_without_cuda_kernels(&why)) GTEST_SKIP() << why;
  const std::vector<Step> steps = aqsgd_steps();
  for (const auto& spec : aqsgd_specs()) {
    auto cpu = make_aqsgd(spec), gpu = make_aqsgd(spec);
    for (size_t s = 0; s < steps.size(); ++s) {
      const std::string where = spec + ", step " + std::to_string(s);
      CodecContext ctx = ctx_for(steps[s].ids, 0);
      Payload pc = cpu->encode(steps[s].x, ctx);
      Payload pg = gpu->encode(steps[s].x.cuda(), ctx);
      EXPECT_TRUE(same_payload(pg, pc)) << where;
      EXPECT_TRUE(at::equal(gpu->decode(pg, ctx).cpu(), cpu->decode(pc, ctx))) << where;
      EXPECT_TRUE(same_buffers(*gpu, *cpu)) << where;
    }
  }
}

}  // namespace
}  // namespace tl
