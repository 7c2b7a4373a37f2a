// The in-process executor: GPipe and 1F1B give bit-identical training (the per-link order of
// messages is the same, Note [codec state order]); emulated links delay the pipeline's timeline
// by exactly what the link model says; Optimus-CC's epilogue-only flag compresses only the
// critical-path backward sends; a stage's micro-batch tapes are freed after their backward; a
// device model (Note [device model] in parallel/device_model.h) gives step times that do not
// depend on this machine and add up exactly to the modelled compute and the link model.
#include "layers/models/resnet.h"
#include "layers/optim/sgd.h"
#include "parallel/device_model.h"
#include "parallel/local_executor.h"
#include "tests/common/testing.h"
#include "tests/parallel/small_resnet.h"

namespace tl {
namespace {

using testing::small_resnet;

using testing::ce;

Batch batch_of(int64_t rows, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  Batch b;
  b.input = at::randn({rows, 1, 12, 12}, gen);
  b.target = at::randint(0, 10, {rows}, gen, at::kLong);
  b.sample_ids = at::arange(rows, at::kLong);
  b.units = at::ones({rows}, at::kLong);
  return b;
}

std::shared_ptr<Pipeline> stateful_pipeline(uint64_t seed) {
  std::vector<BoundaryPtr> bs;
  for (int i = 1; i <= 3; ++i)
    bs.push_back(std::make_shared<Boundary>("b" + std::to_string(i), "ef(topk(0.3))", "ef21(quant(bits=4, seed=" +
                                                                                        std::to_string(i) + "))"));
  return std::make_shared<Pipeline>(small_resnet(seed), std::vector<std::string>{"layer1", "layer2", "layer3"}, bs);
}

TEST(Executor, GpipeAndOneFOneBTrainBitForBitAlike) {
  auto a = stateful_pipeline(4), b = stateful_pipeline(4);
  LocalExecutor ea(*a, ce, {"gpipe"}), eb(*b, ce, {"1f1b"});
  SGD opt_a(a->parameters(), GroupOptions().set_lr(0.05).set_momentum(0.9));
  SGD opt_b(b->parameters(), GroupOptions().set_lr(0.05).set_momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    Batch batch = batch_of(16, 10 + step);
    opt_a.zero_grad();
    opt_b.zero_grad();
    StepResult ra = ea.train_step(batch, 4, 0);
    StepResult rb = eb.train_step(batch, 4, 0);
    EXPECT_EQ(ra.loss, rb.loss) << "step " << step;
    EXPECT_EQ(ra.micro_batches, 4);
    opt_a.step();
    opt_b.step();
  }
  auto sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, t] : sa) EXPECT_TRUE(t.equal(sb.at(name))) << name << " differs between GPipe and 1F1B";
  EXPECT_EQ(a->total_stats().forward.bytes, b->total_stats().forward.bytes);
  EXPECT_EQ(a->total_stats().backward.bytes, b->total_stats().backward.bytes);
}

TEST(Executor, EmulatedLinksDelayTheTimelineByTheLinkModel) {
  auto pipe = Pipeline::build(small_resnet(1), {"layer2"}, {BoundarySpec{}});
  Batch batch = batch_of(8, 3);
  LocalExecutor ideal_links(*pipe, ce);
  ideal_links.train_step(batch, 1, 0);
  const StepTiming ideal = ideal_links.last_timing();
  EXPECT_EQ(ideal.comm_s.size(), 2u);

  // 1 Mbit/s and 50 ms each way. One micro-batch: the activation, then the gradient, cross the
  // link one after the other, so the step lasts at least both messages' link time.
  LocalExecutor slow_links(*pipe, ce, {"1f1b", 1, {LinkSpec{1.0, 50.0}}});
  pipe->reset_stats();
  slow_links.train_step(batch, 1, 0);
  const StepTiming slow = slow_links.last_timing();
  const BoundaryStats s = pipe->total_stats();
  const double link_s = 2 * 0.05 + 8.0 * static_cast<double>(s.forward.bytes + s.backward.bytes) / 1e6;
  EXPECT_GE(slow.step_s, link_s);
  EXPECT_GE(slow.comm_s[1], 0.05 + 8.0 * static_cast<double>(s.forward.bytes) / 1e6) << "stage 1 waits for the activation";
  EXPECT_GE(slow.comm_s[0], 0.05) << "stage 0 waits for the gradient";
  EXPECT_GT(slow.bubble(), 0.5);
}

TEST(Executor, EpilogueOnlyCompressesTheCriticalPathSendsOnly) {
  // 4 stages x 8 micro-batches: each stage's backward sends off the critical path go uncompressed
  // (identity payloads), the others through the codec. Critical by Optimus-CC's rule
  // (Action::compress_backward) or by the dependency graph (Action::critical), under 1F1B and ZB-H1.
  const int stages = 4, m = 8;
  for (const std::string schedule : {"1f1b", "zbh1"}) {
    for (EpilogueRule rule : {EpilogueRule::Optimus, EpilogueRule::CriticalPath}) {
      const bool by_graph = rule == EpilogueRule::CriticalPath;
      SCOPED_TRACE(schedule + (by_graph ? ", critical path" : ", Optimus-CC"));
      std::vector<BoundaryPtr> bs;
      for (int i = 1; i < stages; ++i) {
        bs.push_back(std::make_shared<Boundary>("b" + std::to_string(i), "identity", "topk(0.1)"));
        bs.back()->set_epilogue_only(true);
        bs.back()->set_epilogue_rule(rule);
      }
      auto pipe =
          std::make_shared<Pipeline>(small_resnet(2), std::vector<std::string>{"layer1", "layer2", "layer3"}, bs);
      LocalExecutor(*pipe, ce, {schedule}).train_step(batch_of(16, 5), m, 0);
      const auto plan = make_schedule(schedule, stages, m);
      for (int s = 1; s < stages; ++s) {
        int64_t compressed = 0;
        for (const Action& a : plan[s])
          compressed += a.type == ActionType::SendGrad && (by_graph ? a.critical : a.compress_backward);
        ASSERT_GT(compressed, 0);
        ASSERT_LT(compressed, m) << "some sends of stage " << s << " are off the critical path";
        const DirectionStats d = pipe->boundary(s - 1)->stats().backward;
        EXPECT_EQ(d.messages, m);
        // Uncompressed messages are identity payloads of the (2, C, H, W) gradient; compressed ones far smaller.
        const int64_t raw_message = d.raw_bytes / m;
        EXPECT_GT(d.bytes, (m - compressed) * raw_message);
        EXPECT_LT(d.bytes, (m - compressed) * (raw_message + 64) + compressed * raw_message / 4);
      }
      for (const auto& b : bs) EXPECT_TRUE(b->backward_compression_enabled()) << "the schedule leaves the switch alone";
    }
  }
}

// Three steps of `schedule` (with `virtual_stages`) against 1F1B: the same loss every step, the
// same parameters and buffers, the same bytes and error statistics. Returns the other pipeline's
// executor (its pipeline in `pipeline`).
std::unique_ptr<LocalExecutor> expect_trains_like_one_f_one_b(const std::string& schedule, int virtual_stages,
                                                              std::shared_ptr<Pipeline>& pipeline) {
  auto a = stateful_pipeline(6), b = stateful_pipeline(6);
  pipeline = b;
  LocalExecutor ea(*a, ce, {"1f1b"});
  auto eb = std::make_unique<LocalExecutor>(*b, ce, ScheduleSettings{schedule, virtual_stages});
  SGD opt_a(a->parameters(), GroupOptions().set_lr(0.05).set_momentum(0.9));
  SGD opt_b(b->parameters(), GroupOptions().set_lr(0.05).set_momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    Batch batch = batch_of(16, 20 + step);
    opt_a.zero_grad();
    opt_b.zero_grad();
    EXPECT_EQ(ea.train_step(batch, 4, 0).loss, eb->train_step(batch, 4, 0).loss) << schedule << " step " << step;
    opt_a.step();
    opt_b.step();
  }
  auto sa = a->state_dict(), sb = b->state_dict();
  for (const auto& [name, t] : sa) EXPECT_TRUE(t.equal(sb.at(name))) << name << " differs between 1F1B and " << schedule;
  const BoundaryStats x = a->total_stats(), y = b->total_stats();
  EXPECT_EQ(x.forward.bytes, y.forward.bytes);
  EXPECT_EQ(x.backward.bytes, y.backward.bytes);
  EXPECT_EQ(x.forward.measured, y.forward.measured);
  EXPECT_GT(y.forward.measured, 0);
  EXPECT_EQ(x.forward.rel_error_mean, y.forward.rel_error_mean);
  EXPECT_EQ(x.backward.rel_error_mean, y.backward.rel_error_mean);
  return eb;
}

// Interleaved 1F1B (2 ranks x 2 virtual stages) runs each boundary's messages and each stage's
// backwards in micro-batch order, as 1F1B does: the same training, bit for bit.
TEST(Executor, InterleavedTrainsBitForBitLikeOneFOneB) {
  std::shared_ptr<Pipeline> pipe;
  auto b = expect_trains_like_one_f_one_b("interleaved", 2, pipe);
  EXPECT_EQ(b->last_timing().compute_s.size(), 2u) << "one clock per pipeline rank";
  // Interleaving needs micro-batches in multiples of the ranks.
  EXPECT_THROW(b->train_step(batch_of(16, 1), 3, 0), c10::Error);
  EXPECT_THROW(LocalExecutor(*pipe, ce, {"interleaved", 3}), c10::Error) << "3 does not divide 4 stages";
}

// ZB-H1 splits every backward in two (Note [split backward]); the sum is one backward's, bit for
// bit, and the messages on each link come in 1F1B's order, so the codecs' states agree too.
TEST(Executor, ZeroBubbleH1TrainsBitForBitLikeOneFOneB) {
  std::shared_ptr<Pipeline> pipe;
  auto b = expect_trains_like_one_f_one_b("zbh1", 1, pipe);
  const StepTiming& t = b->last_timing();
  ASSERT_EQ(t.weight_s.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_GT(t.weight_s[r], 0.0) << "rank " << r << " ran W actions";
    EXPECT_LT(t.weight_s[r] + t.forward_s[r], t.compute_s[r]) << "rank " << r;
    EXPECT_GT(t.held_for_weights_bytes[r], 0u) << "rank " << r << " held its ops' tensors between I and W";
  }
}

// ZB-V (2 ranks, stages 0 and 3 on rank 0, 1 and 2 on rank 1, Note [ZB-V]): each chunk's
// forwards, I's and W's run in micro-batch order and boundary 1 is handed over in memory, so the
// training is 1F1B's, bit for bit.
TEST(Executor, ZeroBubbleVTrainsBitForBitLikeOneFOneB) {
  std::shared_ptr<Pipeline> pipe;
  auto b = expect_trains_like_one_f_one_b("zbv", 2, pipe);
  EXPECT_EQ(b->layout().placement, Placement::V);
  const StepTiming& t = b->last_timing();
  ASSERT_EQ(t.weight_s.size(), 2u) << "one clock per pipeline rank";
  for (size_t r = 0; r < 2; ++r) EXPECT_GT(t.weight_s[r], 0.0) << "rank " << r << " ran W actions";
  // ZB-V needs exactly two stages per rank.
  EXPECT_NE(testing::error_of([&] { LocalExecutor(*pipe, ce, {"zbv", 1}).train_step(batch_of(16, 1), 4, 0); })
                .find("pipeline.virtual_stages = 2"),
            std::string::npos);
}

// Evaluation runs the forward-only lists through the same interpreter: the tally equals the
// whole-model forward's (predict), with compression on and off, and the boundaries' switches
// come back as they were.
TEST(Executor, EvaluationThroughTheInterpreterMatchesPredict) {
  auto pipe = stateful_pipeline(7);
  pipe->boundary(1)->set_active_at_inference(false);
  const Batch batch = batch_of(12, 9);
  for (int v : {1, 2, 3}) {  // 3: ZB-V's placement, two stages per rank
    LocalExecutor executor(*pipe, ce, {v == 1 ? "1f1b" : v == 2 ? "interleaved" : "zbv", std::min(v, 2)});
    for (bool on : {true, false}) {
      const at::Tensor tally = executor.evaluate_batch(batch, on);
      pipe->eval();
      at::Tensor expected;
      {
        NoGradGuard no_grad;
        expected = ce(Variable(pipe->predict(batch.input, on)), batch).tally;
      }
      pipe->train();
      EXPECT_TRUE(tally.equal(expected)) << "v " << v << " compression " << on << ": " << tally << " vs " << expected;
    }
  }
  EXPECT_TRUE(pipe->is_training());
  EXPECT_FALSE(pipe->boundary(1)->active_at_inference());
  EXPECT_TRUE(pipe->boundary(0)->active_at_inference());
  EXPECT_EQ(pipe->total_stats().forward.measured, 0) << "evaluation measures nothing";
}

TEST(Executor, TrainingProgressReachesEveryMicroBatchsCodecs) {
  // StepPosition -> CodecContext::step and progress of every micro-batch, forward and backward:
  // a schedule switching at 50% sends with its second codec from a step at progress 0.5 on.
  auto pipe = Pipeline::build(small_resnet(2), {"layer2"},
                              {BoundarySpec{"schedule(quant(bits=2), 0.5, quant(bits=8))",
                                            "schedule(quant(bits=4), 0.5, identity)"}});
  const auto level = [&](bool forward) {
    const BoundaryPtr& b = pipe->boundary(0);
    return (forward ? b->forward_codec() : b->backward_codec())->level()->value;
  };
  const Batch batch = batch_of(8, 4);
  LocalExecutor executor(*pipe, ce);
  executor.train_step(batch, 2, StepPosition(0, 5, 0.4));
  EXPECT_EQ(level(true), 0);
  EXPECT_EQ(level(false), 0);
  const int64_t early = pipe->total_stats().forward.bytes;
  executor.train_step(batch, 2, StepPosition::of(0, 6, 10));  // progress (6 - 1) / 10
  EXPECT_EQ(level(true), 1);
  EXPECT_EQ(level(false), 1);
  EXPECT_GT(pipe->total_stats().forward.bytes - early, 3 * early);  // 8 bits instead of 2
  // An epoch alone (progress unknown) keeps the level of the last training message.
  executor.train_step(batch, 2, 0);
  EXPECT_EQ(level(true), 1);
}

TEST(Executor, StageRuntimeFreesEachMicroBatchAfterItsBackward) {
  auto pipe = Pipeline::build(small_resnet(3), {"layer1"}, {BoundarySpec{}});
  StageRuntime first(*pipe, 0, ce), last(*pipe, 1, ce);
  Batch batch = batch_of(4, 1);
  CodecContext c0, c1;
  c1.micro_batch = 1;
  auto p0 = first.forward(0, batch.slice(0, 2), nullptr, c0);
  auto p1 = first.forward(1, batch.slice(2, 2), nullptr, c1);
  ASSERT_TRUE(p0 && p1);
  EXPECT_EQ(first.in_flight(), 2u);
  EXPECT_FALSE(last.forward(0, batch.slice(0, 2), &*p0, c0).has_value()) << "the last stage sends nothing forward";
  auto g0 = last.backward(0, nullptr);
  ASSERT_TRUE(g0.has_value());
  EXPECT_EQ(last.in_flight(), 0u);
  EXPECT_FALSE(first.backward(0, &*g0).has_value()) << "stage 0 sends no gradient";
  EXPECT_EQ(first.in_flight(), 1u) << "micro-batch 1 is still waiting for its backward";
  EXPECT_THROW(first.backward(0, &*g0), c10::Error) << "a second backward of the same micro-batch";
  EXPECT_THROW(last.backward(7, nullptr), c10::Error) << "backward before forward";
}

// ---- the device model ---------------------------------------------------------------------------

TEST(DeviceModel, RooflinePerOp) {
  const DeviceModel h100 = device_model("h100");
  // A big GEMM is compute-bound: 2 * 4096^3 FLOPs at half of 989 TFLOP/s, plus one launch.
  const double n = 4096;
  const OpCost gemm{2 * n * n * n, 3 * n * n * 4, 1};
  EXPECT_NEAR(h100.seconds(gemm), 2 * n * n * n / (0.5 * 989e12) + 4e-6, 1e-12);
  // An elementwise pass is memory-bound: float32 counted, bf16 modelled (half the bytes).
  const OpCost add{n * n, 3 * n * n * 4, 1};
  EXPECT_NEAR(h100.seconds(add), 3 * n * n * 2 / (0.8 * 3.35e12) + 4e-6, 1e-12);
  // A tiny op costs the host's floor (Note [the host's floor]), per kernel; none on a model without one.
  EXPECT_NEAR(h100.seconds(OpCost{10, 40, 1}), h100.host_s, 1e-12);
  EXPECT_NEAR(h100.seconds(OpCost{10, 40, 3}), 3 * h100.host_s, 1e-12);
  EXPECT_GT(h100.host_s, 4e-6);
  DeviceModel no_floor = h100;
  no_floor.host_s = 0;
  EXPECT_NEAR(no_floor.seconds(OpCost{10, 40, 1}), 4e-6, 1e-9);
  EXPECT_EQ(device_model("measured").seconds(gemm), 0.0);
  try {
    device_model("tpu");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("timeline.device = 'tpu'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("h100"), std::string::npos) << e.what();
  }
}

std::shared_ptr<Pipeline> two_stages(const std::string& forward_codec) {
  return Pipeline::build(small_resnet(1), {"layer2"}, {BoundarySpec{forward_codec, "identity"}});
}

// The in-process executor of a 2-stage pipeline on the h100 device model, with `links`.
LocalExecutor on_h100(Pipeline& pipe, std::vector<LinkSpec> links = {}) {
  return LocalExecutor(pipe, ce, {"1f1b", 1, std::move(links), device_model("h100")});
}

TEST(DeviceModel, TimelineIsTheModelledComputePlusTheLinks) {
  // One micro-batch through two stages runs strictly in sequence: F0, (link), F1, B1, (link), B0.
  auto pipe = two_stages("identity");
  const Batch batch = batch_of(8, 3);
  LocalExecutor ideal_links = on_h100(*pipe);
  ideal_links.train_step(batch, 1, 0);
  const StepTiming ideal = ideal_links.last_timing();
  ASSERT_EQ(ideal.modelled_s.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(ideal.flops[r], 0);
    EXPECT_GT(ideal.modelled_s[r], 0);
    EXPECT_DOUBLE_EQ(ideal.compute_s[r], ideal.modelled_s[r]) << "the clock takes the modelled seconds";
  }
  EXPECT_NEAR(ideal.step_s, ideal.modelled_s[0] + ideal.modelled_s[1], 1e-12);

  // Another run of the same step: the same times, bit for bit (nothing measured).
  auto again = two_stages("identity");
  LocalExecutor again_links = on_h100(*again);
  again_links.train_step(batch, 1, 0);
  EXPECT_EQ(again_links.last_timing().step_s, ideal.step_s);

  // 200 Mbit/s and 50 ms: each message adds its latency and its bytes at the link's rate.
  LocalExecutor slow_links = on_h100(*pipe, {LinkSpec{200.0, 50.0}});
  pipe->reset_stats();
  slow_links.train_step(batch, 1, 0);
  const StepTiming slow = slow_links.last_timing();
  const BoundaryStats s = pipe->total_stats();
  const double link_s = 2 * 0.05 + 8.0 * static_cast<double>(s.forward.bytes + s.backward.bytes) / 200e6;
  EXPECT_NEAR(slow.step_s, slow.modelled_s[0] + slow.modelled_s[1] + link_s, 1e-9);
}

TEST(DeviceModel, CodecsAreChargedByTheBytesTheyTouch) {
  // The same step with a compressed forward boundary models more compute (Note [codec cost]).
  auto plain = two_stages("identity"), quant = two_stages("quant(bits=4)");
  const Batch batch = batch_of(8, 3);
  LocalExecutor on_plain = on_h100(*plain), on_quant = on_h100(*quant);
  on_plain.train_step(batch, 1, 0);
  on_quant.train_step(batch, 1, 0);
  EXPECT_GT(on_quant.last_timing().flops[0], on_plain.last_timing().flops[0]) << "the encode on stage 0";
  EXPECT_GT(on_quant.last_timing().flops[1], on_plain.last_timing().flops[1]) << "the decode on stage 1";
}

}  // namespace
}  // namespace tl
