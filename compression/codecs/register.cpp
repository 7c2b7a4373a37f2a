// Spec names of the stateless codecs; register_basic_codecs() is called once by the registry in
// compression/spec.cpp. Syntax: docs/COMPRESSION.md.
#include "compression/codecs/colsparse.h"
#include "compression/codecs/dense.h"
#include "compression/codecs/hadamard.h"
#include "compression/codecs/powersgd.h"
#include "compression/codecs/quant.h"
#include "compression/codecs/quantile.h"
#include "compression/codecs/sparse.h"

namespace tl {

// Wire ids are fixed: never renumber one (payloads on disk and on other ranks carry them). 1-31
// are the stateless codecs', 32-63 the stateful and learned ones' (stateful/register.cpp).
void register_basic_codecs() {
  register_codec_id("compose", 10);  // the '|' pipeline (compose.h): a payload without a spec name
  register_compressor(
      "identity", [](SpecArgs& a) { return DenseCodec::from_spec("identity", a); }, "identity: the tensor as it is", 1);
  register_compressor(
      "fp16", [](SpecArgs& a) { return DenseCodec::from_spec("fp16", a); }, "fp16: cast to float16", 2);
  register_compressor(
      "bf16", [](SpecArgs& a) { return DenseCodec::from_spec("bf16", a); }, "bf16: cast to bfloat16", 3);
  register_compressor(
      "cast", [](SpecArgs& a) { return DenseCodec::from_spec("cast", a); }, "cast(fp16|bf16): the same as fp16 / bf16");
  register_compressor(
      "topk", [](SpecArgs& a) { return SparseCodec::from_spec(SparseKind::kTopK, a); },
      "topk(k, scope=sample|global, values=fp16|fp32|bf16, index=auto|int32|delta|bitmap): k largest "
      "|x| (k: fraction like 0.1, or count)",
      4);
  register_compressor(
      "randk", [](SpecArgs& a) { return SparseCodec::from_spec(SparseKind::kRandK, a); },
      "randk(k, scope=sample|global, rescale=false|true, seed=0, values=fp16, index=auto): k uniform "
      "random entries",
      5);
  register_compressor(
      "threshold", [](SpecArgs& a) { return SparseCodec::from_spec(SparseKind::kThreshold, a); },
      "threshold(t, values=fp16, index=auto): entries with |x| > t", 6);
  register_compressor("quant", Quantize::from_spec,
                      "quant(bits=8, scale=tensor|channel|block, dim=auto, block=256, mode=maxabs|minmax, "
                      "round=nearest|stochastic, scales=fp16|fp32|bf16, seed=0): uniform quantisation",
                      7);
  register_compressor("quantile", QuantileCodec::from_spec,
                      "quantile(bits=8, sample=65536, centers=mean|quantile, codebook=fp32|fp16|bf16): quantile "
                      "codebook quantisation",
                      8);
  register_compressor("powersgd", PowerSgd::from_spec,
                      "powersgd(rank=4, dim=-1, values=fp32|fp16|bf16, seed=0): one PowerSGD step, warm-started Q", 9);
  register_compressor("hadquant", HadamardQuant::from_spec,
                      "hadquant(bits=4, tile=128, seed=0, scales=fp16|fp32|bf16): randomised Hadamard rotation per "
                      "tile of the last dim, then max-abs quantisation with one scale per tile (TAH-Quant)",
                      11);
  register_compressor("colsparse", ColumnSparse::from_spec,
                      "colsparse(k=0.1, block=32, values=fp16|fp32|bf16, index=auto|int32|delta|bitmap): per block of "
                      "tokens, the k hidden channels of largest L2 norm (Beyond Top-K)",
                      12);
}

}  // namespace tl
