// Codecs whose level changes during training: schedule (by progress), adaptive (one argument per
// message under an error target) and budget (the fewest bytes under an error target). Spec round
// trips, exact bytes, decoding by a fresh replica, the error target on heavy-tailed activations,
// the switch points, state resume, gradients through a Boundary, bad specs.
#include "compression/stateful/adaptive.h"

#include "compression/boundary.h"
#include "compression/spec.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::all_close;

std::shared_ptr<CandidateSelector> make(const std::string& spec) {
  auto c = std::dynamic_pointer_cast<CandidateSelector>(parse_compressor(spec));
  EXPECT_TRUE(c) << spec;
  return c;
}

// (B, T, C) activations whose channels have scales exp(N(0, 1)): a few channels dominate, as in
// transformer residual streams.
at::Tensor activations(int64_t seed, int64_t b = 4, int64_t t = 32, int64_t c = 128) {
  at::manual_seed(seed);
  at::Tensor scale = at::randn({c}).exp();  // (C)
  return at::randn({b, t, c}) * scale;      // (B, T, C)
}

using testing::rel_error;

CodecContext training_at(double progress) {
  CodecContext ctx;
  ctx.progress = progress;
  return ctx;
}

const std::vector<std::string>& specs() {
  static const std::vector<std::string> s = {
      "schedule(quant(bits=2), 0.3, quant(bits=4))",
      "schedule(topk(0.05), 0.25, topk(0.1), 0.5, quant(8))",
      "adaptive(topk, error=0.2)",
      "adaptive(quant(scale=channel), error=0.05)",
      "adaptive(topk(scope=global) | quant(4), error=0.3, from=0.01, to=0.5)",
      "adaptive(threshold, arg=t, from=2.0, to=0.01, error=0.1)",
      "adaptive(powersgd, error=0.5, to=8)",
      "budget(quant(bits=2), quant(bits=4), topk(0.1), error=0.1)",
  };
  return s;
}

TEST(Adaptive, SpecRoundTrip) {
  const at::Tensor x = activations(0);
  for (const auto& spec : specs()) {
    SCOPED_TRACE(spec);
    auto a = parse_compressor(spec);
    auto b = parse_compressor(a->spec());
    EXPECT_EQ(b->spec(), a->spec());
    EXPECT_EQ(parse_compressor(b->spec())->spec(), a->spec());
    // The same codec: the same payload bytes for the same message and progress.
    EXPECT_TRUE(testing::same_payload(a->encode(x, training_at(0.6)), b->encode(x, training_at(0.6))));
  }
  EXPECT_EQ(parse_compressor("adaptive(topk, error=0.2)")->spec(),
            "adaptive(topk, error=0.2, arg=k, from=0.001, to=1.0)");
  EXPECT_EQ(make("adaptive(topk, error=0.2)")->size(), 10u);  // 0.001 0.002 0.005 ... 0.5 1.0
  EXPECT_EQ(make("adaptive(quant, error=0.2)")->size(), 8u);  // bits 1..8
  EXPECT_EQ(make("adaptive(threshold, arg=t, from=2.0, to=0.01, error=0.1)")->candidate(0)->spec(),
            "threshold(2, values=fp16, index=auto)");
}

TEST(Adaptive, ExactBytesAndFreshReceiver) {
  const at::Tensor x = activations(1);
  for (const auto& spec : specs()) {
    SCOPED_TRACE(spec);
    auto sender = parse_compressor(spec), receiver = parse_compressor(spec);
    for (double progress : {0.1, 0.7}) {
      const CodecContext ctx = training_at(progress);
      Payload p = sender->encode(x, ctx);
      // The nested candidate payload plus one header with a single param: exact.
      const auto bytes = p.serialize();
      EXPECT_EQ(bytes.size(), p.nbytes());
      const int64_t nested = static_cast<int64_t>(p.body_bytes());
      EXPECT_EQ(static_cast<int64_t>(p.nbytes()), testing::header_formula(x.dim(), 1) + nested);
      EXPECT_EQ(p.params.size(), 1u);
      // A replica that never encoded (its own level elsewhere) decodes the bytes to what the
      // sender decodes.
      at::Tensor mine = sender->decode(p, ctx);
      at::Tensor theirs = receiver->decode(Payload::deserialize(bytes.data(), bytes.size()), CodecContext{});
      EXPECT_TRUE(all_close(theirs, mine, "receiver replica", 0, 0));
      EXPECT_EQ(mine.sizes(), x.sizes());
    }
  }
}

TEST(Adaptive, ScheduleSwitchesAtTheProgress) {
  auto s = std::dynamic_pointer_cast<ScheduledCodec>(parse_compressor("schedule(quant(bits=2), 0.3, quant(bits=4))"));
  ASSERT_TRUE(s);
  const at::Tensor x = activations(2);
  // Step s of 10 has progress (s - 1) / 10: steps 1-3 use quant(2), steps 4-10 quant(4).
  for (int64_t step = 1; step <= 10; ++step) {
    CodecContext ctx = training_at(static_cast<double>(step - 1) / 10.0);
    ctx.step = step;
    Payload p = s->encode(x, ctx);
    const int64_t want = step <= 3 ? 0 : 1;
    EXPECT_EQ(p.params[0], want) << "step " << step;
    EXPECT_EQ(s->level()->value, want);
    EXPECT_EQ(s->level()->label, want == 0 ? s->candidate(0)->spec() : s->candidate(1)->spec());
  }
  EXPECT_EQ(s->phase_of(0.0), 0u);
  EXPECT_EQ(s->phase_of(0.2999), 0u);
  EXPECT_EQ(s->phase_of(0.3), 1u);
  EXPECT_EQ(s->phase_of(1.0), 1u);
  // Without progress (evaluation, unit tests): the phase of the last training message.
  CodecContext eval;
  eval.training = false;
  EXPECT_EQ(s->encode(x, eval).params[0], 1);
  auto fresh = make("schedule(quant(bits=2), 0.3, quant(bits=4))");
  EXPECT_EQ(fresh->encode(x, eval).params[0], 0);  // before any training message: the first phase
  EXPECT_EQ(fresh->encode(x, CodecContext{}).params[0], 0);
  // An evaluation message at a known progress uses it but does not move the level.
  CodecContext eval_late = eval;
  eval_late.progress = 0.9;
  EXPECT_EQ(fresh->encode(x, eval_late).params[0], 1);
  EXPECT_EQ(fresh->current(), 0u);
  // The 4-bit phase is the 4-bit codec, byte for byte inside the wrapper.
  Payload late = s->encode(x, training_at(0.5));
  CodecContext none;
  EXPECT_TRUE(
      all_close(s->decode(late, none),
                parse_compressor("quant(bits=4)")->decode(parse_compressor("quant(bits=4)")->encode(x, none), none),
                "phase 2 = quant(4)", 0, 0));
}

TEST(Adaptive, ErrorTargetHonouredWithTheLeastLevel) {
  for (const auto& [spec, target] :
       std::vector<std::pair<std::string, double>>{{"adaptive(topk, error=0.2)", 0.2},
                                                   {"adaptive(quant(scale=channel), error=0.1)", 0.1},
                                                   {"adaptive(hadquant(tile=32), error=0.1)", 0.1}}) {
    SCOPED_TRACE(spec);
    auto a = std::dynamic_pointer_cast<Adaptive>(parse_compressor(spec));
    ASSERT_TRUE(a);
    CodecContext ctx;
    std::vector<size_t> levels;
    for (int64_t m = 0; m < 16; ++m) {
      // A stream whose statistics jump halfway: heavier tails from message 8 on.
      at::Tensor x = activations(10 + m);
      if (m >= 8) x = x * at::randn_like(x).abs().pow(2);
      Payload p = a->encode(x, ctx);
      const double err = rel_error(x, a->decode(p, ctx));
      EXPECT_LE(err, target) << "message " << m;  // every message meets the target
      const size_t i = static_cast<size_t>(p.params[0]);
      levels.push_back(i);
      EXPECT_EQ(a->current(), i);
      EXPECT_DOUBLE_EQ(a->level()->value, a->ladder().values[i]);
      if (m == 7 || m == 15) {
        // Settled: the level below the chosen one misses the target (the least level that meets it).
        ASSERT_GT(i, 0u);
        const double below = rel_error(x, testing::round_trip(a->candidate(i - 1), x));
        EXPECT_GT(below, target) << "message " << m << " sent at level " << i;
      }
    }
    EXPECT_GE(levels.front(), a->size() - 2);                                    // started at the top
    EXPECT_LT(*std::min_element(levels.begin(), levels.end()), levels.front());  // and walked down
  }
}

TEST(Adaptive, BudgetPicksTheFewestBytesUnderTheTarget) {
  auto b = make("budget(quant(bits=2), quant(bits=4), topk(0.1), quant(bits=8), error=0.1)");
  for (int64_t m = 0; m < 4; ++m) {
    at::Tensor x = activations(20 + m);
    if (m % 2) x = x * at::randn_like(x).abs().pow(3);  // heavy tails: quant needs more bits
    // The choice computed independently: each candidate's bytes and error.
    int64_t best = -1, best_bytes = 0;
    for (size_t i = 0; i < b->size(); ++i) {
      auto c = parse_compressor(b->candidate(i)->spec());
      CodecContext none;
      Payload p = c->encode(x, none);
      const double err = rel_error(x, c->decode(p, none));
      if (err <= 0.1 && (best < 0 || static_cast<int64_t>(p.nbytes()) < best_bytes))
        best = static_cast<int64_t>(i), best_bytes = static_cast<int64_t>(p.nbytes());
    }
    ASSERT_GE(best, 0);
    CodecContext ctx;
    Payload p = b->encode(x, ctx);
    EXPECT_EQ(p.params[0], best) << "message " << m;
    EXPECT_EQ(static_cast<int64_t>(p.body_bytes()), best_bytes);
    EXPECT_LE(rel_error(x, b->decode(p, ctx)), 0.1);
  }
  // None meets the target: the most accurate.
  auto tight = make("budget(quant(bits=2), topk(0.5), quant(bits=3), error=0.001)");
  CodecContext ctx;
  EXPECT_EQ(tight->encode(activations(30), ctx).params[0], 1);  // topk(0.5) errs least
}

TEST(Adaptive, StateResumesExactly) {
  for (const std::string spec : {"adaptive(topk, error=0.2)", "adaptive(randk, error=0.6)",
                                 "budget(quant(2, round=stochastic), quant(4, round=stochastic), error=0.2)",
                                 "schedule(quant(2), 0.5, quant(4))"}) {
    SCOPED_TRACE(spec);
    auto a = parse_compressor(spec);
    for (int64_t m = 0; m < 5; ++m) a->encode(activations(40 + m), training_at(0.15 * static_cast<double>(m)));
    const TensorMap state = a->state_dict();
    ASSERT_TRUE(state.count("level"));
    auto b = parse_compressor(spec);
    b->load_state_dict(state);
    EXPECT_EQ(b->level()->label, a->level()->label);
    for (int64_t m = 5; m < 10; ++m) {
      const at::Tensor x = activations(40 + m);
      CodecContext ctx;  // progress unknown: both continue from the restored level
      EXPECT_TRUE(testing::same_payload(a->encode(x, ctx), b->encode(x, ctx))) << "message " << m;
    }
  }
}

TEST(Adaptive, GradientsFlowThroughABoundary) {
  at::manual_seed(5);
  const at::Tensor x = activations(50, 2, 8, 32), g = at::randn({2, 8, 32});
  struct Case {
    std::string fwd, bwd;
    BackwardMode mode;
  };
  for (const auto& c : std::vector<Case>{
           {"adaptive(topk, error=0.3)", "schedule(quant(bits=4), 0.5, quant(bits=8))", BackwardMode::Independent},
           {"budget(topk(0.1), topk(0.5), error=0.4)", "", BackwardMode::Shared},
           {"schedule(quant(4), 0.5, identity)", "budget(quant(2), quant(8), error=0.05)",
            BackwardMode::Independent}}) {
    SCOPED_TRACE(c.fwd + " / " + c.bwd);
    auto b = std::make_shared<Boundary>("cut", c.fwd, c.bwd, c.mode);
    Variable v(x.clone(), true);
    Variable out = b->forward(v);
    out.backward(g);
    ASSERT_TRUE(v.grad().defined());
    EXPECT_GT(v.grad().abs().sum().item<double>(), 0);
    const auto s = b->stats();
    EXPECT_EQ(s.forward.messages, 1);
    EXPECT_EQ(s.backward.messages, 1);
    if (c.mode == BackwardMode::Shared) {
      // The gradient travels on the forward's kept positions only.
      EXPECT_TRUE(at::equal(v.grad().ne(0), out.data().ne(0)));
    } else {
      EXPECT_LT(s.backward.rel_error_last, 0.2);
    }
  }
}

TEST(Adaptive, CorruptPayloadsAreErrors) {
  auto s = make("schedule(topk(0.1), 0.5, quant(bits=4))");
  const at::Tensor x = activations(60);
  CodecContext ctx;
  Payload p = s->encode(x, training_at(0.7));
  const auto wire = [](const Payload& q) {
    const auto bytes = q.serialize();
    return Payload::deserialize(bytes.data(), bytes.size());
  };
  Payload bad_index = p;
  bad_index.params[0] = 5;
  EXPECT_ERROR_CONTAINS(s->decode(wire(bad_index), ctx), "names candidate 5");
  Payload swapped = p;  // quant's payload announced as candidate 0 (topk)
  swapped.params[0] = 0;
  EXPECT_ERROR_CONTAINS(s->decode(wire(swapped), ctx), "topk");
  EXPECT_ERROR_CONTAINS(s->decode(parse_compressor("quant(bits=4)")->encode(x, ctx), ctx), "schedule");
  const auto bytes = p.serialize();
  EXPECT_THROW(Payload::deserialize(bytes.data(), bytes.size() - 1), c10::Error);
  EXPECT_TRUE(all_close(s->decode(wire(p), ctx), s->decode(p, ctx), "intact payload", 0, 0));
}

TEST(Adaptive, BadSpecsSayWhatIsAccepted) {
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(topk, error=1.5)"), "error=1.5");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(topk, error=1.5)"), "in (0, 1)");
  EXPECT_ERROR_CONTAINS(parse_compressor("budget(quant(2), quant(4), error=0)"), "in (0, 1)");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(topk)"), "missing argument 'error'");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(topkk, error=0.1)"), "unknown compressor 'topkk'");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(fp16, error=0.1)"), "'fp16' has no level");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(fp16, error=0.1)"), "quant (bits)");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(topk(0.1), error=0.1)"), "leave it out");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(quant(bits=4), error=0.1)"), "sets bits=4");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(quant, error=0.1, to=12)"), "is not a codec");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(fp16, arg=x, from=1, to=2, error=0.1)"), "unknown argument 'x'");
  EXPECT_ERROR_CONTAINS(parse_compressor("adaptive(ef21(topk), error=0.1)"), "has no level");
  EXPECT_ERROR_CONTAINS(parse_compressor("budget(ef21(topk(0.1)), quant(4), error=0.1)"), "keeps receiver state");
  EXPECT_ERROR_CONTAINS(parse_compressor("budget(quant(4), error=0.1)"), "at least two candidate codecs");
  EXPECT_ERROR_CONTAINS(parse_compressor("schedule(quant(2), 0.3)"), "alternating");
  EXPECT_ERROR_CONTAINS(parse_compressor("schedule(quant(2), quant(4))"), "alternating");
  EXPECT_ERROR_CONTAINS(parse_compressor("schedule(quant(2), 1.5, quant(4))"), "in (0, 1)");
  EXPECT_ERROR_CONTAINS(parse_compressor("schedule(quant(2), 0.5, quant(4), 0.3, quant(8))"),
                        "above the previous switch point 0.5");
  EXPECT_ERROR_CONTAINS(parse_compressor("schedule(quant(2), 0.5, 0.7)"), "a compressor spec");
  EXPECT_ERROR_CONTAINS(parse_compressor("schedule(ae(8), 0.5, quant(4))"), "learned or projecting");
  // Each candidate is checked as soon as it is built, before the next (which has an error too).
  EXPECT_ERROR_CONTAINS(parse_compressor("schedule(ae(8, d=16), 0.5, quant(4, bogus=1))"), "learned or projecting");
  EXPECT_ERROR_CONTAINS(parse_compressor("budget(quant(4), ae(8, d=16), quant(4, bogus=1), error=0.1)"),
                        "learned or projecting");
}

}  // namespace
}  // namespace tl
