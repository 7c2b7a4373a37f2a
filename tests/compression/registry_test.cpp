// The codec registry (compression/registry.h): every codec has one record, with an example spec
// and traits; each record's traits agree with what the codec it builds says of itself (the
// capability virtuals of compressor.h); the wire ids never change; the lists derived from the
// records (backward mode 'shared', '|' stages, adaptive's knobs); CodecSpec's walk of a spec.
#include "compression/registry.h"

#include <map>

#include "compression/boundary.h"
#include "compression/codec_spec.h"
#include "compression/codecs/sectioned.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

// Fixed forever: payloads on disk and on other ranks carry these ids (payload.h).
const std::map<std::string, uint16_t>& fixed_wire_ids() {
  static const std::map<std::string, uint16_t> ids = {
      {"identity", 1},  {"fp16", 2},      {"bf16", 3},     {"topk", 4},     {"randk", 5},     {"threshold", 6},
      {"quant", 7},     {"quantile", 8},  {"powersgd", 9}, {"compose", 10}, {"hadquant", 11}, {"colsparse", 12},
      {"ef", 32},       {"ef21", 33},     {"aqsgd", 34},   {"lazy", 35},    {"ae", 36},       {"subspace", 37},
      {"schedule", 38}, {"adaptive", 39}, {"budget", 40},
  };
  return ids;
}

// The records of tapeline's own codecs: those with a factory and a wire id of tapeline's range
// (1-63), and cast (packs as fp16 / bf16).
std::vector<const CodecRecord*> builtin_records() {
  std::vector<const CodecRecord*> out;
  for (const CodecRecord* r : codec_records())
    if (r->factory && ((r->wire_id >= 1 && r->wire_id < 64) || r->name == "cast")) out.push_back(r);
  return out;
}

bool capability(Capability c, bool inner) { return c == Capability::kInner ? inner : c == Capability::kYes; }

TEST(CodecRegistry, EveryCodecHasARecordWithAnExampleAndTraits) {
  // Every spec name is a record; a codec registered without traits (register_compressor) has no
  // example and fails here.
  for (const auto& [name, help] : known_compressors()) {
    const CodecRecord* r = find_codec(name);
    ASSERT_TRUE(r && r->factory) << name;
    EXPECT_FALSE(help.empty()) << name;
  }
  const auto records = builtin_records();
  EXPECT_GE(records.size(), 20u);
  for (const CodecRecord* r : records)
    EXPECT_FALSE(r->example.empty()) << r->name << ": a record needs an example spec (and its traits)";
}

TEST(CodecRegistry, WireIdsAreFixed) {
  for (const auto& [name, id] : fixed_wire_ids()) {
    EXPECT_EQ(codec_id(name), id) << name;
    EXPECT_EQ(codec_name(id), name);
    ASSERT_TRUE(find_codec(id)) << id;
    EXPECT_EQ(find_codec(id)->name, name);
  }
  for (const CodecRecord* r : codec_records())
    if (r->wire_id >= 1 && r->wire_id < 64) {
      EXPECT_TRUE(fixed_wire_ids().count(r->name)) << r->name << " (id " << r->wire_id << "): add it to the table";
    }
  EXPECT_EQ(find_codec("cast")->wire_id, 0);
  EXPECT_FALSE(find_codec("compose")->factory) << "compose is the '|' pipeline, not a spec name";
}

// Builds the record's example, a wrapper's with each inner codec that it accepts, and checks the
// traits against the built codec. Returns how many built.
int check_traits(const CodecRecord& r) {
  const CodecTraits& t = r.traits;
  std::vector<std::pair<std::string, CompressorPtr>> built;  // (inner spec or "", codec)
  const size_t hole = r.example.find("{}");
  if (hole == std::string::npos) {
    built.emplace_back("", parse_compressor(r.example));
  } else {
    EXPECT_TRUE(t.shared == Capability::kInner && t.decode_state != Capability::kNo)
        << r.name << ": a wrapper's shared mode follows its inner codecs, and so does its receiver state unless "
        << "it keeps its own";
    for (const char* inner : {"powersgd", "quant", "ef21(quant)"}) {
      std::string spec = r.example;
      for (size_t at = spec.find("{}"); at != std::string::npos; at = spec.find("{}")) spec.replace(at, 2, inner);
      std::string error;
      if (CompressorPtr c = try_parse_compressor(spec, &error)) built.emplace_back(inner, c);
    }
  }
  for (const auto& [inner_spec, c] : built) {
    const std::string what = r.name + " built as " + c->spec();
    const CompressorPtr inner = inner_spec.empty() ? nullptr : parse_compressor(inner_spec);
    EXPECT_EQ(t.sectioned, std::dynamic_pointer_cast<SectionedCodec>(c) != nullptr) << what;
    EXPECT_EQ(capability(t.shared, inner && inner->supports_shared()), c->supports_shared()) << what;
    EXPECT_EQ(capability(t.decode_state, inner && inner->decode_has_state()), c->decode_has_state()) << what;
    const bool transform = c->has_transform() || c->constrains_model();
    EXPECT_EQ(t.dp == MessageUse::kNoTransform, transform) << what;
    EXPECT_EQ(t.tp == MessageUse::kNoTransform, transform) << what;
    // A decoder with state of its own cannot serve D replicas' payloads.
    EXPECT_EQ(t.dp == MessageUse::kNoDecoderState, t.decode_state == Capability::kYes) << what;
    if (t.reduce_scatter) {
      EXPECT_TRUE(!transform && !c->decode_has_state()) << what;
    }
  }
  if (t.knob) {
    for (double level : {t.knob->from, t.knob->to}) {
      const std::string spec = r.name + "(" + t.knob->arg + "=" + std::to_string(level) + ")";
      std::string error;
      EXPECT_TRUE(try_parse_compressor(spec, &error)) << r.name << "'s knob: " << error;
    }
  }
  return static_cast<int>(built.size());
}

TEST(CodecRegistry, TraitsAgreeWithTheCodecs) {
  for (const CodecRecord* r : builtin_records()) EXPECT_GE(check_traits(*r), 1) << r->name << ": nothing built";
}

TEST(CodecRegistry, ListsComeFromTheRecords) {
  // Backward mode 'shared': every codec with one is named (threshold, colsparse and powersgd too).
  const std::string shared =
      testing::error_of([] { std::make_shared<Boundary>("cut", "quant(4)", "", BackwardMode::Shared); });
  for (const char* name : {"topk", "randk", "threshold", "colsparse", "powersgd"})
    EXPECT_NE(shared.find(name), std::string::npos) << shared;
  // '|' stages.
  const std::string stages = testing::error_of([] { parse_compressor("quant(4) | topk(0.1)"); });
  for (const char* name : {"identity", "fp16", "bf16", "topk", "randk", "threshold", "colsparse", "powersgd"})
    EXPECT_NE(stages.find(name), std::string::npos) << stages;
  // adaptive's knobs.
  const std::string knobs = testing::error_of([] { parse_compressor("adaptive(threshold(0.1), error=0.1)"); });
  for (const char* knob : {"topk (k)", "colsparse (k)", "quant (bits)", "powersgd (rank)", "hadquant (bits)"})
    EXPECT_NE(knobs.find(knob), std::string::npos) << knobs;
}

TEST(CodecRegistry, RegistrationErrors) {
  CodecRecord dup;
  dup.name = "topk";
  dup.factory = [](SpecArgs&) { return CompressorPtr(); };
  EXPECT_ERROR_CONTAINS(register_codec(dup), "already registered");
  CodecRecord taken;
  taken.name = "test_taken_id";
  taken.wire_id = 4;
  taken.factory = dup.factory;
  EXPECT_ERROR_CONTAINS(register_codec(taken), "taken by 'topk'");
  // A wire id first (register_codec_id), its factory later: one record.
  register_codec_id("test_late_factory", 901);
  register_compressor(
      "test_late_factory", [](SpecArgs& a) { return parse_compressor("identity"); }, "test: identity");
  EXPECT_EQ(find_codec("test_late_factory")->wire_id, 901);
  EXPECT_EQ(codec_name(901), "test_late_factory");
  EXPECT_TRUE(known_compressors().count("test_late_factory"));
}

TEST(CodecSpec, WalksEveryCodecOfASpec) {
  const CodecSpec s("ef(topk(0.1) | quant(4), per=sample) | fp16");
  EXPECT_EQ(s.text(), "ef(topk(0.1) | quant(4), per=sample) | fp16");
  std::vector<std::string> names;
  for (const CodecRecord* r : s.records()) names.push_back(r->name);
  EXPECT_EQ(names, (std::vector<std::string>{"ef", "topk", "quant", "fp16"}));
  EXPECT_EQ(s.record().name, "ef");
  EXPECT_FALSE(s.is_identity());
  EXPECT_TRUE(CodecSpec().is_identity());
  EXPECT_FALSE(CodecSpec("identity | fp16").is_identity());
  const CodecSpec w("schedule(quant(2), 0.5, aqsgd(quant(4)))");
  EXPECT_EQ(w.records().size(), 4u);
  EXPECT_EQ(w.records()[2]->traits.tp, MessageUse::kNoSampleIds);
  EXPECT_ERROR_CONTAINS(CodecSpec("ef(topkk(0.1))"), "unknown compressor 'topkk'");
  EXPECT_ERROR_CONTAINS(CodecSpec("topk(0.1"), "bad compressor spec");
  EXPECT_EQ(CodecSpec("quant(bits=2)").build()->spec(), parse_compressor("quant(bits=2)")->spec());
}

}  // namespace
}  // namespace tl
