// The step planner (tasks/runner/plan.h, Note [planning a step]): a plan on shapes equals the
// in-process timeline of a real step with the same device model; the meta step holds no
// activation memory; what cannot be planned is refused by name; the inbound link model charges
// messages as ProtocolNanoGPT's simulation does; their dense baseline plans within 5% of its
// measured step.
#include "tasks/runner/plan.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "compression/codec_spec.h"
#include "parallel/channel.h"
#include "parallel/executor.h"
#include "tests/common/testing.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {

Config small_gpt(const std::vector<std::pair<std::string, std::string>>& more = {}) {
  std::vector<std::pair<std::string, std::string>> o = {{"task.name", "lm"},
                                                        {"model.arch", "gpt2-tiny"},
                                                        {"data.seq_len", "32"},
                                                        {"train.batch_size", "16"},
                                                        {"train.micro_batches", "4"},
                                                        {"timeline.device", "h100"},
                                                        {"train.optimizer", "adamw"},
                                                        {"boundary.bandwidth_mbps", "200"},
                                                        {"boundary.latency_ms", "5"},
                                                        {"boundary.forward", "bf16"},
                                                        {"boundary.backward", "quant(8, scale=channel)"}};
  o.insert(o.end(), more.begin(), more.end());
  return Config::load("", o);
}

TEST(Plan, EqualsTheInProcessTimelineOfARealStep) {
  double worst = 0;
  for (const std::string schedule : {"1f1b", "gpipe", "zbh1"})
    for (const std::string links : {"pipelined", "inbound"}) {
      if (schedule == "zbh1" && links == "inbound") continue;
      const Config c = small_gpt({{"pipeline.schedule", schedule}, {"timeline.link_model", links}});
      const Plan plan = plan_step(c);
      double units = 0;
      const StepTiming real = real_step(c, &units);
      EXPECT_NEAR(plan.step_s, real.step_s, 0.01 * real.step_s) << schedule << ", " << links;
      worst = std::max(worst, std::abs(plan.step_s - real.step_s) / real.step_s);
      EXPECT_EQ(plan.units, units);
      double flops = 0;
      for (double f : real.flops) flops += f;
      EXPECT_NEAR(plan.flops, flops, 1e-6 * flops) << schedule;
      EXPECT_NEAR(plan.bubble, real.bubble(), 0.01) << schedule;
      ASSERT_EQ(plan.rank_plans.size(), real.activation_bytes.size());
      for (size_t r = 0; r < real.activation_bytes.size(); ++r)
        EXPECT_EQ(plan.rank_plans[r].activation_bytes, static_cast<int64_t>(real.activation_bytes[r])) << r;
    }
  std::cout << "largest |planned - real| / real step: " << worst << "\n";
}

TEST(Plan, ResNetsAndBertPlanToo) {
  const Config resnet = Config::load("", {{"task.name", "vision"},
                                          {"data.dataset", "fashion-mnist"},
                                          {"model.arch", "resnet8"},
                                          {"train.batch_size", "16"},
                                          {"train.micro_batches", "4"},
                                          {"timeline.device", "a100"},
                                          {"boundary.forward", "quant(4)"},
                                          {"boundary.bandwidth_mbps", "100"}});
  const Plan plan = plan_step(resnet);
  const StepTiming real = real_step(resnet);
  EXPECT_NEAR(plan.step_s, real.step_s, 0.01 * real.step_s);
  EXPECT_EQ(plan.tied_ranks, 0);  // nothing shared between ranks
  EXPECT_EQ(plan.tied_sum_s, 0);
  EXPECT_GT(plan_step(Config::load("", {{"task.name", "vision"},
                                        {"data.dataset", "cifar10"},
                                        {"model.arch", "resnet18"},
                                        {"train.batch_size", "64"},
                                        {"timeline.device", "h100"}}))
                .flops,
            0);
  if (!testing::have_minilm()) GTEST_SKIP() << "the MiniLM files are not installed (only its config.json is read)";
  const Plan bert = plan_step(Config::load("", {{"task.name", "text"},
                                                {"model.arch", "minilm"},
                                                {"model.pretrained", "false"},
                                                {"train.batch_size", "16"},
                                                {"train.micro_batches", "4"},
                                                {"timeline.device", "h100"}}));
  EXPECT_GT(bert.step_s, 0);
  EXPECT_GT(bert.flops, 0);
}

TEST(Plan, ReportsLinksBytesAndSizes) {
  const Plan plan = plan_step(small_gpt());
  // gpt2-tiny: 4 stages (embeddings, 2 blocks, head), so 3 links each way.
  ASSERT_EQ(plan.links.size(), 6u);
  const int64_t mb_tokens = 16 / 4 * 32, d = 128;
  for (const PlanLink& l : plan.links) {
    EXPECT_EQ(l.messages, 4);
    if (l.forward) {  // bf16: 2 bytes a value, plus a 40-byte header
      EXPECT_EQ(l.bytes, 4 * (2 * mb_tokens * d + 40));
      EXPECT_NEAR(l.busy_s, 8.0 * l.bytes / 200e6, 1e-12);
    }
    EXPECT_EQ(l.size, "exact");
  }
  EXPECT_GT(plan.backward_bytes_per_unit, 0);
  EXPECT_LT(plan.backward_bytes_per_unit, plan.forward_bytes_per_unit);                           // 8 bits against 16
  for (const PlanRank& r : plan.rank_plans) EXPECT_EQ(r.optimizer_bytes, 2 * r.parameter_bytes);  // adamw
  EXPECT_GT(plan.mfu, 0);
  EXPECT_LT(plan.mfu, 1);
  // Note [tied sums in a plan]: wte (256 x 128) on ranks 0 and 3, summed by a 2-rank ring: its
  // float32 bytes each way and two latencies on the (every) 200 Mbit/s + 5 ms link.
  EXPECT_EQ(plan.tied_ranks, 2);
  EXPECT_EQ(plan.tied_bytes, 256 * 128 * 4);
  EXPECT_NEAR(plan.tied_sum_s, 8.0 * 256 * 128 * 4 / 200e6 + 2 * 0.005, 1e-12);

  const Plan worst = plan_step(small_gpt({{"boundary.backward", "topk(0.1)"}}));
  bool marked = false;
  for (const PlanLink& l : worst.links) marked = marked || (!l.forward && l.size == "worst case");
  EXPECT_TRUE(marked);
  const Plan given = plan_step(small_gpt({{"boundary.backward", "topk(0.1)"}, {"plan.backward_bytes", "5000"}}));
  for (const PlanLink& l : given.links)
    if (!l.forward) {
      EXPECT_EQ(l.bytes, 4 * 5000);
      EXPECT_EQ(l.size, "given");
    }
}

TEST(Plan, AMetaStepHoldsNoActivationMemory) {
  // 8 x 1024-wide blocks on 16 x 1024 tokens: the engine would hold gigabytes for backward.
  const Config c = small_gpt({{"model.layers", "8"},
                              {"model.d_model", "1024"},
                              {"model.heads", "8"},
                              {"data.seq_len", "1024"},
                              {"train.batch_size", "16"},
                              {"train.micro_batches", "2"},
                              {"boundary.backward", "bf16"}});
  const int64_t before = peak_resident_bytes();
  const Plan plan = plan_step(c);
  const int64_t grew = peak_resident_bytes() - before;
  int64_t held = 0, params = 0;
  for (const PlanRank& r : plan.rank_plans) held = std::max(held, r.activation_bytes), params += r.parameter_bytes;
  EXPECT_GT(held, int64_t(1) << 30);
  EXPECT_GT(params, int64_t(300) << 20);
  EXPECT_LT(grew, int64_t(256) << 20) << "planning grew the resident peak by " << grew << " bytes";
}

TEST(Plan, RefusesWhatItCannotPlanByName) {
  testing::expect_error(
      [] {
        plan_step(small_gpt({{"boundary.forward", "quantile(4)"}}));
      },
      {"cannot size codec 'quantile(4"});
  testing::expect_error(
      [] {
        plan_step(small_gpt({{"timeline.device", "measured"}}));
      },
      {"timeline.device = measured"});
}

// Note [data parallelism in a plan]: one replica's pipeline on its share of the micro-batches,
// then the sums on the dp link, message by message.
TEST(Plan, DataParallelSumsFollowEachRanksPipelinePart) {
  const std::vector<std::pair<std::string, std::string>> dp = {
      {"parallel.dp", "2"}, {"dp.bandwidth_mbps", "100"}, {"dp.latency_ms", "10"}};
  const Plan one = plan_step(small_gpt({{"train.batch_size", "8"}, {"train.micro_batches", "2"}}));
  std::vector<std::pair<std::string, std::string>> o = dp;
  const Plan two = plan_step(small_gpt(o));
  EXPECT_EQ(two.replicas, 2);
  EXPECT_DOUBLE_EQ(two.pipeline_s, one.step_s);  // a replica: 2 of the 4 micro-batches of 4 rows
  EXPECT_DOUBLE_EQ(two.units, 2 * one.units);
  double latest = 0;
  for (size_t r = 0; r < two.rank_plans.size(); ++r) {
    const PlanRank& p = two.rank_plans[r];
    // Uncompressed, two replicas: the rank's gradients (float32; the tied wte summed elsewhere)
    // in one bucket each way: one message of its bytes, 10 ms + 8 bytes / 100 Mbit/s.
    EXPECT_EQ(p.dp_messages, 1) << r;
    EXPECT_GT(p.dp_bytes, 0) << r;
    EXPECT_NEAR(p.dp_sum_s, 0.010 + 8.0 * static_cast<double>(p.dp_bytes) / 100e6, 1e-12) << r;
    latest = std::max(latest, p.compute_s + p.wait_s + p.dp_sum_s);
  }
  EXPECT_DOUBLE_EQ(two.step_s, std::max(latest, two.pipeline_s));
  EXPECT_DOUBLE_EQ(two.dp_sum_s, two.step_s - two.pipeline_s);
  EXPECT_EQ(one.rank_plans[0].dp_bytes, 0);  // one replica: no sums

  // Smaller buckets: more messages, each waiting its latency; the same bytes.
  o.push_back({"dp.bucket_mib", "0.05"});
  const Plan buckets = plan_step(small_gpt(o));
  for (size_t r = 0; r < buckets.rank_plans.size(); ++r) {
    const PlanRank& p = buckets.rank_plans[r];
    EXPECT_EQ(p.dp_bytes, two.rank_plans[r].dp_bytes) << r;
    EXPECT_NEAR(p.dp_sum_s, 0.010 * static_cast<double>(p.dp_messages) + 8.0 * static_cast<double>(p.dp_bytes) / 100e6,
                1e-12)
        << r;
  }
  EXPECT_GT(buckets.rank_plans[1].dp_messages, 1);

  // Four replicas: a quarter of each bucket to each of the 3 others, then the sums back.
  std::vector<std::pair<std::string, std::string>> four = {{"parallel.dp", "4"}, {"dp.bandwidth_mbps", "100"},
                                                            {"dp.latency_ms", "10"}, {"train.micro_batches", "4"}};
  const Plan p4 = plan_step(small_gpt(four));
  for (size_t r = 0; r < p4.rank_plans.size(); ++r) {
    EXPECT_EQ(p4.rank_plans[r].dp_messages, 6) << r;
    EXPECT_NEAR(static_cast<double>(p4.rank_plans[r].dp_bytes), 1.5 * static_cast<double>(two.rank_plans[r].dp_bytes),
                64)
        << r;  // 2 (D - 1) / D of the bucket
  }

  // Compressed: the matrices' payloads packed in one message; sized by the codec.
  o = dp;
  o.push_back({"dp.compression", "quant(bits=8)"});
  const Plan q = plan_step(small_gpt(o));
  EXPECT_EQ(q.dp_codec, "quant(bits=8)");
  EXPECT_EQ(q.dp_size, "exact");
  int64_t quantised = 0, raw = 0;
  for (size_t r = 0; r < q.rank_plans.size(); ++r) {
    EXPECT_LE(q.rank_plans[r].dp_bytes, two.rank_plans[r].dp_bytes) << r;  // a rank of vectors only: the same
    quantised += q.rank_plans[r].dp_bytes, raw += two.rank_plans[r].dp_bytes;
  }
  EXPECT_LT(quantised, raw / 3);
  o.back().second = "topk(0.1)";
  EXPECT_EQ(plan_step(small_gpt(o)).dp_size, "worst case");

  // Unlimited links between the replicas: the sums cost nothing (loopback).
  EXPECT_DOUBLE_EQ(plan_step(small_gpt({{"parallel.dp", "2"}})).dp_sum_s, 0.0);
  testing::expect_error([] { plan_step(small_gpt({{"parallel.dp", "3"}})); },
                        {"parallel.dp = 3", "multiple of 3"});
  testing::expect_error([] { plan_step(small_gpt({{"parallel.dp", "2"}, {"dp.compression", "quantile(4)"}})); },
                        {"dp.compression = quantile(4) cannot be sized", "the data-parallel codecs it sizes"});
}

// Note [tensor parallelism in a plan]: GPT-2 tiny (2 blocks of 4 heads, d = 128) split over T
// tensor ranks; each block all-reduces its attention and MLP outputs forward and their inputs'
// gradients backward, per micro-batch of (4, 32, 128) float32, counted as tensor rank 0 sends them.
TEST(Plan, TensorParallelAllReducesAsTheRuntimeSendsThem) {
  const int64_t M = 4, n = 4 * 32 * 128;  // micro-batches; values of one all-reduce
  const std::vector<std::pair<std::string, std::string>> link = {{"tp.bandwidth_mbps", "100"}, {"tp.latency_ms", "1"}};
  auto plan = [&](std::vector<std::pair<std::string, std::string>> o) {
    o.insert(o.end(), link.begin(), link.end());
    return plan_step(small_gpt(o));
  };
  auto round_s = [](double bytes) { return 0.001 + 8 * bytes / 100e6; };
  const Plan one = plan_step(small_gpt());
  const Plan free = plan_step(small_gpt({{"parallel.tp", "2"}}));  // unlimited tp links: no time
  const Plan two = plan({{"parallel.tp", "2"}});
  EXPECT_EQ(two.tensor, 2);
  EXPECT_EQ(two.parameters, one.parameters);  // the whole model's
  EXPECT_EQ(two.tp_size, "exact");
  int64_t all_reduces = 0;
  for (size_t r = 0; r < two.rank_plans.size(); ++r) {
    const PlanRank& p = two.rank_plans[r];
    all_reduces += p.tp_all_reduces;
    EXPECT_EQ(p.tp_all_reduces % (2 * M), 0) << r;  // forward and backward, every micro-batch
    // Two ranks, uncompressed: the whole tensor each way, one message (all_reduce_in_rank_order).
    EXPECT_EQ(p.tp_messages, p.tp_all_reduces) << r;
    EXPECT_EQ(p.tp_bytes, p.tp_all_reduces * n * 4) << r;
    EXPECT_NEAR(p.tp_s, static_cast<double>(p.tp_all_reduces) * round_s(n * 4.0), 1e-12) << r;
    // Charged where the rank runs them: its compute grows by their time, nothing else.
    EXPECT_NEAR(p.compute_s, free.rank_plans[r].compute_s + p.tp_s, 1e-9) << r;
    EXPECT_EQ(free.rank_plans[r].tp_s, 0.0) << r;
    // Tensor rank 0's share: the split layers' FLOPs, parameters and optimizer state halved.
    EXPECT_EQ(p.flops, free.rank_plans[r].flops) << r;
    EXPECT_LE(p.flops, one.rank_plans[r].flops) << r;
    EXPECT_LE(p.parameter_bytes, one.rank_plans[r].parameter_bytes) << r;
    EXPECT_EQ(p.optimizer_bytes, 2 * p.parameter_bytes) << r;
  }
  EXPECT_EQ(all_reduces, 2 * 2 * 2 * M);  // blocks x (attention, MLP) x (forward, backward) x micro-batches
  // The blocks' weights split in two: each block's 12 d^2 weights (qkv 3 d^2, proj d^2, MLP 8 d^2) less half.
  int64_t split = 0, whole = 0;
  for (size_t r = 0; r < two.rank_plans.size(); ++r)
    split += two.rank_plans[r].parameter_bytes, whole += one.rank_plans[r].parameter_bytes;
  EXPECT_EQ(whole - split, 2 * 4 * (12 * 128 * 128 + 3 * 128 + 512) / 2);  // and the split biases (qkv, fc)
  EXPECT_DOUBLE_EQ(two.flops, free.flops);
  EXPECT_LT(two.flops, 2 * one.flops);  // the replicated layers run on both tensor ranks
  EXPECT_GT(two.flops, one.flops);
  EXPECT_GE(two.step_s, free.step_s);

  // Four ranks, uncompressed: reduce-scatter then all-gather, 2 (T - 1) messages in two rounds.
  const Plan four = plan({{"parallel.tp", "4"}});
  for (const PlanRank& p : four.rank_plans) {
    EXPECT_EQ(p.tp_messages, 6 * p.tp_all_reduces);
    EXPECT_EQ(p.tp_bytes, p.tp_all_reduces * (n + 2 * (n / 4)) * 4);  // 3 chunks, then its own 3 times
    EXPECT_NEAR(p.tp_s, static_cast<double>(p.tp_all_reduces) * 2 * round_s(n / 4 * 4.0), 1e-12);
  }

  // Compressed: the codec's payload of the whole tensor to each other rank (allgather), or of the
  // chunks (reduce_scatter); sized by the codec.
  const CompressorPtr q8 = CodecSpec("quant(bits=8)").build();
  const int64_t whole_payload = q8->payload_size({4, 32, 128}, at::kFloat).bytes;
  const int64_t chunk_payload = q8->payload_size({4 * 32 / 4, 128}, at::kFloat).bytes;
  for (const std::string algorithm : {"allgather", "reduce_scatter"}) {
    const Plan q = plan({{"parallel.tp", "4"},
                         {"tp.forward", "quant(bits=8)"},
                         {"tp.backward", "quant(bits=8)"},
                         {"tp.algorithm", algorithm}});
    EXPECT_EQ(q.tp_forward, "quant(bits=8)");
    EXPECT_EQ(q.tp_size, "exact");
    for (const PlanRank& p : q.rank_plans) {
      const bool ag = algorithm == "allgather";
      EXPECT_EQ(p.tp_messages, (ag ? 3 : 6) * p.tp_all_reduces) << algorithm;
      EXPECT_EQ(p.tp_bytes, p.tp_all_reduces * (ag ? 3 * whole_payload : 6 * chunk_payload)) << algorithm;
      EXPECT_NEAR(p.tp_s,
                  static_cast<double>(p.tp_all_reduces) * (ag ? round_s(whole_payload) : 2 * round_s(chunk_payload)),
                  1e-12)
          << algorithm;
    }
  }
  // A data-dependent size: the worst case, said.
  EXPECT_EQ(plan({{"parallel.tp", "2"}, {"tp.forward", "topk(0.1)"}}).tp_size, "worst case");
  // With data parallelism: each tensor rank's replicas sum its part of the blocks.
  const Plan grid = plan({{"parallel.tp", "2"}, {"parallel.dp", "2"}});
  const Plan replicas = plan_step(small_gpt({{"parallel.dp", "2"}}));
  for (size_t r = 0; r < grid.rank_plans.size(); ++r)
    EXPECT_LE(grid.rank_plans[r].dp_bytes, replicas.rank_plans[r].dp_bytes) << r;

  testing::expect_error([] { plan_step(small_gpt({{"parallel.tp", "3"}})); }, {"parallel.tp = 3", "4 attention heads"});
  testing::expect_error(
      [] {
        plan_step(small_gpt({{"parallel.tp", "2"}, {"tp.forward", "quantile(4)"}}));
      },
      {"tp.forward = quantile(4) cannot be sized", "tensor-parallel all-reduce"});
}

// Note [link models]: inbound charges each message when its receiver takes it, on one wire into
// the receiver shared by both directions, latency included in its hold.
TEST(Plan, InboundLinksChargeAsProtocolNanoGpt) {
  LocalChannel ch;
  const LinkSpec spec{8.0, 100.0};  // 8 Mbit/s: 1 MB a second; 0.1 s
  ch.set_link(0, 1, spec);
  ch.set_link(2, 1, spec);
  ch.set_link_model(LinkModel::Inbound);
  auto msg = [](int64_t body) {
    StageMessage m;
    Payload p;
    p.body = at::empty({body - 16}, at::kByte);  // 16 header bytes: no shape, no params
    m.payload = p;
    return m;
  };
  ch.send(0, 1, {true, 0, 0}, msg(1000000), 0.0);  // 1 s of transmission
  ch.send(2, 1, {false, 1, 0}, msg(500000), 0.2);  // 0.5 s
  ch.send(0, 1, {true, 0, 1}, msg(1000000), 5.0);
  // Taken in this order: the gradient first (the receiver's schedule decides), then activation 0.
  EXPECT_DOUBLE_EQ(ch.recv(2, 1, {false, 1, 0}, 0.0)->ready_s, 0.2 + 0.5 + 0.1);
  EXPECT_DOUBLE_EQ(ch.recv(0, 1, {true, 0, 0}, 0.0)->ready_s, 0.8 + 1.0 + 0.1);
  EXPECT_DOUBLE_EQ(ch.recv(0, 1, {true, 0, 1}, 0.0)->ready_s, 5.0 + 1.0 + 0.1);  // the wire was free
}

// ProtocolNanoGPT's dense baseline (records/20260917_vanilla_baseline): 100.475 s a step.
TEST(Plan, ProtocolNanoGptBaselineWithinFivePercent) {
  const std::string ini = testing::source_dir() + "/configs/plan/protocol_nanogpt_dense.ini";
  const Plan plan = plan_step(Config::load(ini));
  EXPECT_NEAR(plan.step_s, 100.475, 0.05 * 100.475);
  EXPECT_EQ(plan.stages, 8);
  EXPECT_EQ(plan.units, 524288);
  EXPECT_NEAR(plan.forward_bytes_per_unit + plan.backward_bytes_per_unit, 4096, 1);
}

// `tapeline plan`: plan.json written (and only whole: temp file and rename, no temp left), the
// summary printed, --sweep one row per value (specs with commas kept whole), errors exit 2 or 1.
TEST(Plan, CommandLine) {
  const std::filesystem::path exe = testing::tapeline_path();
  if (!std::filesystem::exists(exe)) GTEST_SKIP() << exe << " not built (make tapeline)";
  auto run = [&](const std::string& args, int* status) {
    std::string out;
    FILE* p = popen((exe.string() + " plan " + args + " 2>&1").c_str(), "r");
    std::array<char, 4096> buf{};
    size_t n;
    while (p && (n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int st = p ? pclose(p) : -1;
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
  };
  testing::TempDir dir;
  const std::string ini = testing::source_dir() + "/configs/plan/protocol_nanogpt_dense.ini";
  const std::filesystem::path json = dir.path() / "plan.json";
  int status = -1;
  std::string out = run("--config " + ini + " --out " + json.string(), &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("step 100.3"), std::string::npos) << out;
  EXPECT_NE(out.find("plan: running one step"), std::string::npos) << out;  // progress
  std::ifstream in(json);
  std::stringstream text;
  text << in.rdbuf();
  for (const char* field : {"\"step_s\": 100.3", "\"links\"", "\"ranks_detail\"", "\"busy_s\"", "\"bubble\"", "\"mfu\"",
                            "\"activation_bytes\"", "\"optimizer_bytes\"", "\"size\": \"exact\""})
    EXPECT_NE(text.str().find(field), std::string::npos) << field << " missing from plan.json:\n" << text.str();
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temp file left

  out = run("--config " + ini + " --quiet --sweep 'boundary.forward=bf16,quant(4, scale=channel),topk(0.1)'", &status);
  EXPECT_EQ(status, 0) << out;
  for (const char* row : {"\nbf16 ", "\nquant(4, scale=channel) ", "\ntopk(0.1) "})
    EXPECT_NE(out.find(row), std::string::npos) << row << " missing:\n" << out;
  EXPECT_NE(out.find("worst case"), std::string::npos) << out;  // topk's index=auto

  out = run("--config " + ini + " --sweep boundary.forward", &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("key=v1,v2"), std::string::npos) << out;
  out = run("--config " + ini + " --out '' '--boundary.forward=quantile(4)'", &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("cannot size codec"), std::string::npos) << out;
}

}  // namespace
}  // namespace tl
