// AQ-SGD: warm-up sends raw, the per-sample cache tracks a fixed input at both ends, unseen samples
// go raw, missing ids are a clear error, fp16 and memory-mapped caches.
#include "compression/stateful/aqsgd.h"

#include <unistd.h>

#include <filesystem>

#include "compression/spec.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

using testing::all_close;

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

}  // namespace
}  // namespace tl
