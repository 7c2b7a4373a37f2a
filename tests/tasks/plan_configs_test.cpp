// Study 3 of docs/TIME.md: the shipped plan configs (configs/plan/).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "compression/spec.h"
#include "compression/stateful/adaptive.h"
#include "tasks/runner/plan.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

// Study 3 (docs/TIME.md): every config of configs/plan/ plans; the protocol_nanogpt_*.ini codecs
// differ from the dense baseline only in [boundary] and [plan]; and where one gives the bytes of
// a message (a codec the planner cannot size), they are what its codec sends for the step's
// message, (rows / micro-batches, seq_len, d_model) float32: a real encode, or the worst case
// bounding one.
TEST(PlanConfigs, ShippedPlanConfigsPlanAndGiveTheBytesTheirCodecsSend) {
  const std::filesystem::path dir = std::filesystem::path(testing::source_dir()) / "configs" / "plan";
  auto outside = [](const Config& c) {  // the keys that must match the dense baseline's
    std::vector<std::pair<std::string, std::string>> kv;
    for (const auto& [k, v] : c.resolved())
      if (k.rfind("boundary.", 0) != 0 && k.rfind("plan.", 0) != 0) kv.emplace_back(k, v);
    return kv;
  };
  const Config dense = Config::load((dir / "protocol_nanogpt_dense.ini").string());
  int planned = 0, codecs = 0, given = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".ini") continue;
    const std::string name = entry.path().filename().string();
    const Config c = Config::load(entry.path().string());
    // A config trained with measured compute (two_stage_slow_link.ini) is planned on the cpu model.
    const Plan plan = plan_step(
        c.timeline.device == "measured" ? Config::load(entry.path().string(), {{"timeline.device", "cpu"}}) : c);
    ++planned;
    EXPECT_GT(plan.step_s, 0) << name;
    if (name.rfind("protocol_nanogpt_", 0) != 0) continue;
    ++codecs;
    EXPECT_EQ(outside(c), outside(dense)) << name << " differs from protocol_nanogpt_dense.ini outside [boundary]";
    EXPECT_EQ(plan.units, 524288) << name;
    if (c.plan.forward_bytes < 0 && c.plan.backward_bytes < 0) continue;
    ++given;
    const std::vector<int64_t> shape = {c.train.batch_size / c.train.micro_batches, c.data.seq_len, c.model.d_model};
    at::manual_seed(0);
    const at::Tensor x = at::randn(shape);
    CodecContext ctx;
    ctx.sample_ids = at::arange(shape[0], at::kLong);
    CompressorPtr fwd = c.boundary.forward.build();
    const std::string spec = c.boundary.forward.text();
    if (spec.rfind("aqsgd(", 0) == 0) {  // the warm-up's raw payload; with a cache hit, the inner codec's
      // The cache's capacity does not change a payload: 8 rows here, not the config's 8192 (16 GB
      // at this width, in float16, filled when made).
      const size_t at = spec.find("capacity=");
      ASSERT_NE(at, std::string::npos) << spec;
      fwd = parse_compressor(spec.substr(0, at) + "capacity=8" + spec.substr(spec.find_first_of(",)", at)));
      EXPECT_EQ(static_cast<int64_t>(fwd->encode(x, ctx).nbytes()), c.plan.forward_bytes) << name;
      ctx.epoch = 1;
      EXPECT_EQ(static_cast<int64_t>(fwd->encode(x, ctx).nbytes()),
                parse_compressor("quant(bits=4, scale=channel)")->payload_size(shape, at::kFloat).bytes)
          << name;
    } else if (spec.rfind("adaptive(", 0) == 0) {  // the top level, wrapped: a bound on every message
      for (const CodecSpec* s : {&c.boundary.forward, &c.boundary.backward}) {
        CompressorPtr a = s->build();
        const auto* sel = dynamic_cast<const CandidateSelector*>(a.get());
        ASSERT_NE(sel, nullptr) << name;
        const int64_t top =
            static_cast<int64_t>(sel->candidate(sel->size() - 1)->encode(x, ctx).nbytes()) + payload_header_bytes(3, 1);
        EXPECT_EQ(top, s == &c.boundary.forward ? c.plan.forward_bytes : c.plan.backward_bytes) << name;
        EXPECT_LE(static_cast<int64_t>(a->encode(x, ctx).nbytes()), top) << name;
      }
    } else if (spec.rfind("ae(", 0) == 0) {  // the code, (B, T, d_code), sent raw
      const at::Tensor code = fwd->pre(Variable(x), ctx).data();
      EXPECT_EQ(static_cast<int64_t>(fwd->encode(code, ctx).nbytes()), c.plan.forward_bytes) << name;
    } else {
      ADD_FAILURE() << name << " gives message bytes for '" << spec << "', which this test does not check";
    }
  }
  EXPECT_GE(planned, 2);
  EXPECT_EQ(codecs, 8);  // study 2's codecs: dense, quant 8 and 4, hadquant, AQ-SGD, TopK, AE, adaptive
  EXPECT_EQ(given, 3);   // AQ-SGD, AE, adaptive
}

}  // namespace
}  // namespace tl
