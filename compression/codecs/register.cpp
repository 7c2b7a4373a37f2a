// The records of the stateless codecs (compression/registry.h); register_basic_codecs() is called
// once by the registry. Syntax: docs/COMPRESSION.md.
#include "compression/codecs/colsparse.h"
#include "compression/codecs/dense.h"
#include "compression/codecs/hadamard.h"
#include "compression/codecs/powersgd.h"
#include "compression/codecs/quant.h"
#include "compression/codecs/quantile.h"
#include "compression/codecs/sparse.h"

namespace tl {

namespace {

// A stateless codec is allowed on every message and keeps no receiver state (CodecTraits'
// defaults); these set what differs.
CodecTraits sectioned(bool shared) {
  CodecTraits t;
  t.sectioned = true;
  t.shared = shared ? Capability::kYes : Capability::kNo;
  return t;
}
CodecTraits with_knob(CodecTraits t, const char* arg, bool fraction, double from, double to) {
  t.knob = AdaptiveKnob{arg, fraction, from, to};
  return t;
}
CodecTraits quantiser(bool reduce_scatter = false) {
  CodecTraits t = with_knob(CodecTraits{}, "bits", false, 1, 8);
  t.reduce_scatter = reduce_scatter;
  return t;
}

CompressorFactory dense(const char* name) {
  return [name](SpecArgs& a) { return DenseCodec::from_spec(name, a); };
}
CompressorFactory sparse(SparseKind kind) {
  return [kind](SpecArgs& a) { return SparseCodec::from_spec(kind, a); };
}

}  // namespace

// Wire ids are fixed: never renumber one (payloads on disk and on other ranks carry them). 1-31
// are the stateless codecs', 32-63 the stateful and learned ones' (stateful/register.cpp).
void register_basic_codecs() {
  register_codec_id("compose", 10);  // the '|' pipeline (compose.h): a payload without a spec name
  CodecTraits identity = sectioned(false);
  identity.reduce_scatter = true;  // nothing to compress: the plain all-reduce
  register_codec({"identity", 1, dense("identity"), "identity: the tensor as it is", "identity", identity});
  register_codec({"fp16", 2, dense("fp16"), "fp16: cast to float16", "fp16", sectioned(false)});
  register_codec({"bf16", 3, dense("bf16"), "bf16: cast to bfloat16", "bf16", sectioned(false)});
  register_codec(
      {"cast", 0, dense("cast"), "cast(fp16|bf16): the same as fp16 / bf16", "cast(bf16)", sectioned(false)});
  register_codec({"topk", 4, sparse(SparseKind::kTopK),
                  "topk(k, scope=sample|global, values=fp16|fp32|bf16, index=auto|int32|delta|bitmap): k largest "
                  "|x| (k: fraction like 0.1, or count)",
                  "topk(0.1)", with_knob(sectioned(true), "k", true, 0.001, 1.0)});
  register_codec({"randk", 5, sparse(SparseKind::kRandK),
                  "randk(k, scope=sample|global, rescale=false|true, seed=0, values=fp16, index=auto): k uniform "
                  "random entries",
                  "randk(0.1)", with_knob(sectioned(true), "k", true, 0.001, 1.0)});
  register_codec({"threshold", 6, sparse(SparseKind::kThreshold),
                  "threshold(t, values=fp16, index=auto): entries with |x| > t", "threshold(0.5)", sectioned(true)});
  register_codec({"quant", 7, Quantize::from_spec,
                  "quant(bits=8, scale=tensor|channel|block, dim=auto, block=256, mode=maxabs|minmax, "
                  "round=nearest|stochastic, scales=fp16|fp32|bf16, seed=0): uniform quantisation",
                  "quant(4)", quantiser(/*reduce_scatter=*/true)});
  register_codec({"quantile", 8, QuantileCodec::from_spec,
                  "quantile(bits=8, sample=65536, centers=mean|quantile, codebook=fp32|fp16|bf16): quantile "
                  "codebook quantisation",
                  "quantile(4)", quantiser()});
  register_codec({"powersgd", 9, PowerSgd::from_spec,
                  "powersgd(rank=4, dim=-1, values=fp32|fp16|bf16, seed=0): one PowerSGD step, warm-started Q",
                  "powersgd(2)", with_knob(sectioned(true), "rank", false, 1, 16)});
  register_codec({"hadquant", 11, HadamardQuant::from_spec,
                  "hadquant(bits=4, tile=128, seed=0, scales=fp16|fp32|bf16): randomised Hadamard rotation per "
                  "tile of the last dim, then max-abs quantisation with one scale per tile (TAH-Quant)",
                  "hadquant(4)", quantiser()});
  register_codec({"colsparse", 12, ColumnSparse::from_spec,
                  "colsparse(k=0.1, block=32, values=fp16|fp32|bf16, index=auto|int32|delta|bitmap): per block of "
                  "tokens, the k hidden channels of largest L2 norm (Beyond Top-K)",
                  "colsparse(0.1)", with_knob(sectioned(true), "k", true, 0.01, 1.0)});
}

}  // namespace tl
