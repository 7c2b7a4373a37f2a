#pragma once
// Structured column sparsification ("Beyond Top-K"): the input is viewed as (tokens, hidden)
// (the last dim is hidden; 0-D and 1-D tensors are one token). Per block of `block` consecutive
// tokens (the last block may be shorter), the k hidden channels with the largest L2 norm over the
// block are kept for every token of the block and the others are zeroed; the k channel indices
// are sent once per block, the kept values per token.
//
// k is a fraction of hidden when written with a '.' or below 1 (k = ceil(fraction * hidden), at
// least 1; the product is taken 1e-9 below itself so that 0.1 * 30 gives 3), else a count.
// Within a block, channels of equal norm are cut as at::topk does; the indices are then sorted.
//
// Note [colsparse index set]. The kept (block, channel) pairs are sent as one sorted index set
// b * hidden + c over a universe of blocks * hidden, in the cheapest form of sparse_index.h
// (int32: 4 bytes an index; delta: LEB128 gaps; bitmap: one bit per (block, channel)), exactly
// as TopK's indices; `index=` forces one form. Each block holds exactly k of them: the receiver
// checks that on the host (a corrupt set is an error, not a misplaced scatter).
//
// Plain payload:  params = {0, block, k, value type, index format, index bytes}
//                 body   = [index bytes][tokens * k values]; the values are one section of shape
//                 (tokens, k) (row t: the kept channels of t's block, ascending), so
//                 `colsparse(0.1) | quant(4)` quantises them.
// Shared payload (backward mode `shared`: the gradient at the forward's kept channels):
//                 params = {1, value type}, body = [tokens * k values].

#include <optional>

#include "compression/codecs/sectioned.h"
#include "compression/codecs/sparse_index.h"
#include "compression/spec.h"

namespace tl {

struct ColumnSparseOptions {
  double fraction = 0.1;  // k as a fraction of hidden (used when > 0) ...
  int64_t count = 0;      // ... else as a count
  int64_t block = 32;     // tokens per block
  at::ScalarType values = at::kHalf;
  std::optional<codec::IndexFormat> index;  // none: the cheapest per payload
};

class ColumnSparse : public SectionedCodec {
 public:
  explicit ColumnSparse(ColumnSparseOptions o);
  static CompressorPtr from_spec(SpecArgs& args);

  const char* codec() const override { return "colsparse"; }
  std::string spec() const override;
  const ColumnSparseOptions& options() const { return o_; }
  /// Channels kept per block for a hidden size H; error if a count exceeds H.
  int64_t k_for(int64_t H) const;

  TL_SECTIONED_CODEC_PARTS;

  TL_SECTIONED_CODEC_SHARED_PARTS;

 private:
  struct Layout {
    int64_t tokens, hidden, block, blocks, k;
    at::ScalarType wire;
    codec::IndexFormat format;
    int64_t index_bytes;
  };
  Layout layout(const Payload& rest) const;                                  // validated plain params
  Payload encode_cpu(const at::Tensor& x, std::vector<at::Tensor>& values);  // float32 on the CPU
  Payload header(const at::Tensor& x, int64_t k, const codec::EncodedIndex& enc) const;
  at::Tensor block_norms(const at::Tensor& xt) const;  // (blocks, H) of xt (T, H)
  // (blocks, k) int64: the kept channels of each block, ascending, from a plain rest payload.
  at::Tensor block_channels(const Payload& rest, const Layout& l) const;
  // (tokens, k) int64: the kept channels of each token's block.
  at::Tensor token_channels(const Payload& rest, const Layout& l) const;

  ColumnSparseOptions o_;
};

}  // namespace tl
