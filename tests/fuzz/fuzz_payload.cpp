// Payloads from a peer or a file: Payload::deserialize, then the decode of one codec (picked by
// the first byte). Accepted payloads decode to a tensor of the shape their header declares.
#include <ATen/ATen.h>

#include "compression/spec.h"
#include "tests/fuzz/fuzz.h"

namespace {
const std::vector<std::string>& codecs() {
  static const std::vector<std::string> all = {"identity",
                                               "fp16",
                                               "bf16",
                                               "topk(0.1)",
                                               "topk(0.1, index=int32)",
                                               "topk(0.1, index=delta)",
                                               "topk(0.1, index=bitmap)",
                                               "topk(0.1, scope=global, values=fp32)",
                                               "randk(0.1)",
                                               "randk(0.1, rescale=true)",
                                               "threshold(0.5)",
                                               "quant(8)",
                                               "quant(4)",
                                               "quant(bits=2, scale=channel)",
                                               "quant(bits=3, scale=block, block=16)",
                                               "quant(bits=4, mode=minmax, scales=fp32)",
                                               "quantile(bits=4)",
                                               "quantile(bits=2, codebook=fp16)",
                                               "powersgd(rank=2)",
                                               "powersgd(rank=1, values=fp16)",
                                               "topk(0.1) | quant(4)",
                                               "powersgd(rank=2) | quant(8)",
                                               "ef(topk(0.1))",
                                               "ef21(topk(0.1))",
                                               "aqsgd(quant(4), warmup=0)",
                                               "lazy(powersgd(rank=2))",
                                               "hadquant(4, tile=64)",
                                               "colsparse(2, block=2, index=int32)",
                                               "colsparse(0.25, block=2) | quant(4)"};
  return all;
}
}  // namespace

TL_FUZZ_TARGET(payload) {
  // Decoders allocate the declared shape: bound it below the fuzzer's 1 GiB allocation limit.
  static const bool limited = (tl::set_max_payload_elements(int64_t(1) << 22), true);
  (void)limited;
  tl::fuzz::Reader in(data, size);
  const std::string& spec = codecs()[in.byte() % codecs().size()];
  static std::map<std::string, tl::CompressorPtr> built;  // receivers keep state across messages
  tl::CompressorPtr& c = built[spec];
  if (!c) c = tl::parse_compressor(spec);
  tl::Payload p = tl::Payload::deserialize(in.ptr(), in.left());
  TL_FUZZ_CHECK(p.from_wire, "deserialize did not mark the payload as from the wire");
  tl::CodecContext ctx;
  ctx.sample_ids = at::arange(p.shape.empty() ? 1 : std::max<int64_t>(1, std::min<int64_t>(p.shape[0], 64)), at::kLong);
  const at::Tensor y = c->decode(p, ctx);
  TL_FUZZ_CHECK(y.sizes() == at::IntArrayRef(p.shape), spec + " decoded to a shape other than the header's");
}
