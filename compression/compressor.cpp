#include "compression/compressor.h"

#include <c10/util/Exception.h>

namespace tl {

Payload Compressor::encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) {
  TORCH_CHECK(false, "compressor '", spec(), "' does not support backward mode 'shared' (it has no sparsity mask or ",
              "basis to reuse); codecs that do: topk, randk, threshold, powersgd and compositions that start with ",
              "one of them. Use backward mode 'independent', 'straight-through' or 'none'.");
}

at::Tensor Compressor::decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) {
  TORCH_CHECK(false, "compressor '", spec(), "' does not support backward mode 'shared' (it has no sparsity mask or ",
              "basis to reuse); codecs that do: topk, randk, threshold, powersgd and compositions that start with ",
              "one of them.");
}

const char* PayloadSize::word(Kind k) {
  switch (k) {
    case Kind::Exact:
      return "exact";
    case Kind::WorstCase:
      return "worst case";
    case Kind::Given:
      return "given";
  }
  return "?";
}

PayloadSize Compressor::payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  TORCH_CHECK(false, "the planner cannot size codec '", spec(), "': it declares no payload size for a shape ",
              "(Note [sizing a payload]); codecs it sizes: identity, fp16, bf16, cast, quant, hadquant, topk, randk, ",
              "threshold (worst case), powersgd, compositions of these, ef and ef21 around them; or give the bytes ",
              "per message with plan.forward_bytes / plan.backward_bytes");
}

PayloadSize Compressor::shared_payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  TORCH_CHECK(false, "the planner cannot size codec '", spec(), "' in backward mode 'shared' (Note [sizing a ",
              "payload]); give the bytes per message with plan.backward_bytes");
}

}  // namespace tl
