// Which codecs may compress data-parallel gradients and tensor-parallel all-reduces: decided from
// the traits of the codecs' registry records (compression/registry.h), for every codec a spec
// names, nested ones included, with errors naming why and what is accepted.
#include <gtest/gtest.h>

#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/tensor_parallel.h"

namespace tl::ranks {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CodecUse, DataParallelRefusesReceiverStateAndTransforms) {
  for (const char* ok : {"identity", "powersgd(rank=4)", "ef(powersgd(rank=4))", "quant(bits=8)", "ef(topk(0.01))",
                         "schedule(quant(2), 0.5, ef(topk(0.1)))"})
    EXPECT_EQ(dp_codec_problem(ok), "") << ok;
  for (const char* state : {"ef21(quant(4))", "aqsgd(quant(4))", "schedule(quant(2), 0.5, ef21(quant(4)))"}) {
    const std::string why = dp_codec_problem(state);
    EXPECT_TRUE(contains(why, "keeps state per sender (aqsgd, ef21)")) << state << ": " << why;
  }
  const std::string ae = dp_codec_problem("ae(4)");
  EXPECT_TRUE(contains(ae, "learned or projecting codecs (ae, subspace)")) << ae;
  EXPECT_TRUE(contains(dp_codec_problem("topkk(0.1)"), "unknown compressor 'topkk'"));
}

TEST(CodecUse, TensorParallelRefusesSampleIdsAndTransforms) {
  for (const char* ok : {"identity", "quant(bits=8)", "ef(topk(0.1))", "ef21(quant(4))", "powersgd(rank=4)"})
    EXPECT_EQ(tp_codec_problem(ok, "allgather"), "") << ok;
  // Nested anywhere: the spec's every codec is looked up, not its text.
  for (const char* cache : {"aqsgd(quant(4))", "schedule(quant(2), 0.5, aqsgd(quant(4)))"}) {
    const std::string why = tp_codec_problem(cache, "allgather");
    EXPECT_TRUE(contains(why, "aqsgd keeps a per-sample cache")) << cache << ": " << why;
  }
  EXPECT_TRUE(contains(tp_codec_problem("subspace(4)", "allgather"), "learned or projecting codecs (ae, subspace)"));
  // reduce_scatter: the codec itself must be defined per chunk (quant), or nothing compresses.
  EXPECT_EQ(tp_codec_problem("quant(bits=8)", "reduce_scatter"), "");
  EXPECT_EQ(tp_codec_problem("quant", "reduce_scatter"), "");
  EXPECT_EQ(tp_codec_problem("identity", "reduce_scatter"), "");
  for (const char* other : {"topk(0.1)", "ef(quant(4))", "fp16"})
    EXPECT_TRUE(contains(tp_codec_problem(other, "reduce_scatter"), "only identity, quant (stateless, per chunk)"))
        << other;
  EXPECT_TRUE(contains(tp_codec_problem("quant(4)", "ring"), "reduce_scatter (identity, quant)"));
}

}  // namespace
}  // namespace tl::ranks
