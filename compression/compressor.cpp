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

}  // namespace tl
