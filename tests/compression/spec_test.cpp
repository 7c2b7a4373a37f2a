// Spec strings: the grammar (numbers, words, key=value, nested calls, '|' pipelines, spaces),
// syntax errors with column and token, the registry's errors (unknown names listed), argument
// errors naming codec, argument, value and what is accepted, and canonical spec round trips.
#include "compression/spec.h"

#include "compression/codecs/compose.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

TEST(SpecParse, Structure) {
  auto c = parse_spec("  ef( topk(0.1 , scope = global) | quant(bits=4, round=stochastic) , per=sample ) | fp16 ");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->name, "ef");
  ASSERT_EQ(c->positional.size(), 1u);
  auto inner = std::get<std::shared_ptr<SpecCall>>(c->positional[0].v);
  EXPECT_EQ(inner->name, "topk");
  EXPECT_EQ(std::get<double>(inner->positional[0].v), 0.1);
  EXPECT_EQ(inner->positional[0].text, "0.1");
  ASSERT_EQ(inner->named.size(), 1u);
  EXPECT_EQ(inner->named[0].first, "scope");
  EXPECT_EQ(std::get<std::string>(inner->named[0].second.v), "global");
  ASSERT_TRUE(inner->next);
  EXPECT_EQ(inner->next->name, "quant");
  EXPECT_EQ(inner->next->named.size(), 2u);
  EXPECT_EQ(c->named[0].first, "per");
  ASSERT_TRUE(c->next);
  EXPECT_EQ(c->next->name, "fp16");
  EXPECT_FALSE(c->next->next);

  auto n = parse_spec("x(-1, 1e-3, .5, +2, straight-through, a_b.c)");
  EXPECT_EQ(std::get<double>(n->positional[0].v), -1);
  EXPECT_EQ(std::get<double>(n->positional[1].v), 1e-3);
  EXPECT_EQ(std::get<double>(n->positional[2].v), 0.5);
  EXPECT_EQ(std::get<double>(n->positional[3].v), 2);
  EXPECT_EQ(std::get<std::string>(n->positional[4].v), "straight-through");
  EXPECT_EQ(std::get<std::string>(n->positional[5].v), "a_b.c");
  EXPECT_TRUE(parse_spec("identity")->positional.empty());
  EXPECT_TRUE(parse_spec("identity()")->positional.empty());
}

TEST(SpecParse, SyntaxErrorsNameColumnAndToken) {
  EXPECT_ERROR_CONTAINS(parse_spec("topk(0.1,,)"), "unexpected ',' at column 10");
  EXPECT_ERROR_CONTAINS(parse_spec("topk(0.1"), "unexpected end of the spec");
  EXPECT_ERROR_CONTAINS(parse_spec("topk(0.1) |"), "expected a compressor name");
  EXPECT_ERROR_CONTAINS(parse_spec("topk(4bits)"), "malformed number '4bits' at column 6");
  EXPECT_ERROR_CONTAINS(parse_spec("topk(0.1) quant"), "unexpected 'quant' at column 11");
  EXPECT_ERROR_CONTAINS(parse_spec("topk(0.1; 2)"), "unexpected character ';'");
  EXPECT_ERROR_CONTAINS(parse_spec("topk(k=0.1, 2)"), "positional arguments must come before");
  EXPECT_ERROR_CONTAINS(parse_spec("quant(bits=4, bits=5)"), "argument 'bits' of quant is given twice");
  EXPECT_ERROR_CONTAINS(parse_spec(""), "empty compressor spec");
  EXPECT_ERROR_CONTAINS(parse_spec("   "), "empty compressor spec");
  EXPECT_ERROR_CONTAINS(parse_spec("(0.1)"), "unexpected '('");
  // The message shows the spec and a caret under the token.
  const std::string msg = testing::error_of([] { parse_spec("topk(0.1,,)"); });
  EXPECT_NE(msg.find("topk(0.1,,)\n           ^"), std::string::npos) << msg;
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += "ef(";
  EXPECT_ERROR_CONTAINS(parse_spec(deep + "identity"), "nest at most");
}

TEST(SpecRegistry, KnownNamesAndUnknownNameError) {
  auto known = known_compressors();
  for (const char* name :
       {"identity", "fp16", "bf16", "cast", "topk", "randk", "threshold", "quant", "quantile", "powersgd"})
    EXPECT_TRUE(known.count(name)) << name;
  EXPECT_FALSE(known.at("topk").empty());
  const std::string msg = testing::error_of([] { parse_compressor("topkk(0.1)"); });
  EXPECT_NE(msg.find("unknown compressor 'topkk'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("known: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("topk"), std::string::npos) << msg;
  EXPECT_NE(msg.find("quant"), std::string::npos) << msg;
  EXPECT_ERROR_CONTAINS(register_compressor(
                            "topk", [](SpecArgs&) { return CompressorPtr(); }, ""),
                        "already registered");
  EXPECT_ERROR_CONTAINS(register_compressor(
                            "9x", [](SpecArgs&) { return CompressorPtr(); }, ""),
                        "not a valid name");
}

TEST(SpecRegistry, ArgumentErrors) {
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(bits=9)"), "quant: bad argument bits=9");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(bits=9)"), "accepted: an integer in 1..8");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4.5)"), "bad argument bits=4.5");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4, scale=chanel)"), "bad argument scale=chanel");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4, scale=chanel)"), "accepted: tensor, channel, block");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4, scale=3)"), "bad argument scale=3");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(0.1, foo=1)"), "topk: unknown argument 'foo'");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(0.1, foo=1)"), "accepted: k, scope, values, index");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(0.1, 2)"), "unexpected argument '2' (argument 2)");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk()"), "topk: missing argument 'k'");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(1.5)"), "topk: bad argument k=1.5");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(0.1, k=0.2)"), "argument 'k' is given twice");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(word)"), "bad argument k=word");
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(0.1, values=int8)"), "accepted: fp32, fp16, bf16");
  EXPECT_ERROR_CONTAINS(parse_compressor("randk(0.1, seed=-1)"), "bad argument seed=-1");
  EXPECT_ERROR_CONTAINS(parse_compressor("threshold(-1)"), "threshold: bad argument t=-1");
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4, block=64)"), "block= with scale=block");
  EXPECT_ERROR_CONTAINS(parse_compressor("quantile(bits=0)"), "quantile: bad argument bits=0");
  EXPECT_ERROR_CONTAINS(parse_compressor("powersgd(0)"), "powersgd: bad argument rank=0");
  EXPECT_ERROR_CONTAINS(parse_compressor("fp16(1)"), "fp16: unexpected argument '1'");
  EXPECT_ERROR_CONTAINS(parse_compressor("cast(fp8)"), "accepted: fp16, bf16");
}

TEST(SpecRegistry, PipelinesBuildCompositions) {
  auto c = parse_compressor("topk(0.1) | quant(4)");
  auto comp = std::dynamic_pointer_cast<Composition>(c);
  ASSERT_TRUE(comp);
  EXPECT_EQ(comp->outer()->codec(), std::string("topk"));
  auto chain = std::dynamic_pointer_cast<Composition>(parse_compressor("powersgd(2) | topk(0.5) | fp16"));
  ASSERT_TRUE(chain);
  EXPECT_TRUE(std::dynamic_pointer_cast<Composition>(chain->inner())) << "a | b | c is a | (b | c)";
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4) | topk(0.1)"), "has no value sections to pass on");
  // The outer stage is checked before the rest is built: the rest's own error does not come first.
  EXPECT_ERROR_CONTAINS(parse_compressor("quant(4) | ae(4, d=16, bogus=1)"), "has no value sections to pass on");
  // A transform encodes activations, not another codec's sections.
  EXPECT_ERROR_CONTAINS(parse_compressor("topk(0.1) | ae(4, d=16)"), "learned or projecting transform");
  EXPECT_ERROR_CONTAINS(parse_compressor("powersgd(2) | topk(0.5) | subspace(4, d=16)"),
                        "learned or projecting transform");
}

TEST(SpecRegistry, CanonicalSpecsRoundTrip) {
  for (const char* text :
       {"identity", "fp16", "bf16", "cast(bf16)", "topk(0.1)", "topk(100, scope=global, values=fp32, index=delta)",
        "topk(1.0)", "randk(0.05, rescale=true, seed=7)", "threshold(0.001, index=bitmap)", "quant(4)",
        "quant(bits=3, scale=channel, dim=-1, mode=minmax, round=stochastic, scales=fp32, seed=3)",
        "quant(2, scale=block, block=64)", "quantile(4, sample=1000, centers=quantile, codebook=fp16)",
        "powersgd(rank=8, dim=1, values=bf16, seed=2)", "topk(0.1) | quant(4, scale=channel)",
        "powersgd(2) | quant(8) "}) {
    CompressorPtr c = parse_compressor(text);
    const std::string canonical = c->spec();
    EXPECT_EQ(parse_compressor(canonical)->spec(), canonical) << text;
  }
  EXPECT_EQ(parse_compressor("topk(0.1)")->spec(), "topk(0.1, scope=sample, values=fp16, index=auto)");
  EXPECT_EQ(parse_compressor("topk(100)")->spec(), "topk(100, scope=sample, values=fp16, index=auto)");
  EXPECT_EQ(parse_compressor("cast(fp16)")->spec(), "fp16");
}

}  // namespace
}  // namespace tl
