#pragma once
// Sparsifying codecs: TopK by magnitude, RandK and threshold sparsification. The payload keeps
// the selected entries: their flat indices (the rest, in the cheapest form of sparse_index.h) and
// their values (one section, fp16 by default as in Bian et al.).
//
// Scope: `sample` selects k per row of dim 0 (each sample of the micro-batch on its own; 0-D and
// 1-D tensors are one row), `global` selects k over the whole flattened micro-batch. k is a
// fraction of the elements in scope when written with a '.' or below 1 (topk(0.1), topk(1.0)),
// else a count (topk(100)); a fraction keeps round(fraction * D) elements, at least 1.
//
// Plain payload:  params = {0, scope (1 sample, 0 global), rows, k per row, value type,
//                           index format, index bytes}
//                 body   = [index bytes][rows * k values]; section shape (rows, k) or (k).
// Shared payload (backward mode `shared`: the gradient at the forward's indices):
//                 params = {1, value type}, body = [n values].
//
// RandK draws k distinct positions per row, uniformly, from its own generator whose state is a
// registered buffer (`generator`), so checkpoints carry it; the draws happen on the CPU and
// the mask is moved to the tensor's device, so CPU and CUDA select the same positions. With
// rescale=true the kept values are multiplied by D/k, making E[decode(encode(x))] = x (and in
// shared mode the gradient likewise, as the chain rule of that scaling requires).

#include <optional>

#include "compression/codecs/sectioned.h"
#include "compression/codecs/sparse_index.h"
#include "compression/spec.h"
#include "layers/nn/rng.h"

namespace tl {

enum class SparseKind { kTopK, kRandK, kThreshold };

struct SparseOptions {
  SparseKind kind = SparseKind::kTopK;
  double fraction = 0;  // k as a fraction (used when > 0) ...
  int64_t count = 0;    // ... else as a count per row
  bool per_sample = true;
  bool rescale = false;  // randk
  uint64_t seed = 0;     // randk
  double threshold = 0;  // threshold: keep |x| > threshold
  at::ScalarType values = at::kHalf;
  std::optional<codec::IndexFormat> index;  // none: the cheapest per payload
};

class SparseCodec : public SectionedCodec {
 public:
  explicit SparseCodec(SparseOptions o);
  static CompressorPtr from_spec(SparseKind kind, SpecArgs& args);

  const char* codec() const override;
  std::string spec() const override;
  const SparseOptions& options() const { return o_; }
  /// Elements kept in a row of D (topk, randk); error if a count exceeds D.
  int64_t k_for(int64_t D) const;

  /// Float32 tensors on CUDA take the fused packing kernels (Note [fused sparse packing]).
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;

  TL_SECTIONED_CODEC_PARTS;

  TL_SECTIONED_CODEC_SHARED_PARTS;
  /// Exact for topk and randk with index=int32 or bitmap; index=auto takes the cheaper of those
  /// two (delta, chosen on the host when it is cheaper still, only shrinks it) and index=delta a
  /// bound of varint bytes per index: worst cases. threshold: every entry kept, a worst case.
  SizedParts size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;
  SizedParts size_shared_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;

 private:
  struct Layout {
    bool per_sample;
    int64_t rows, k, numel;
    at::ScalarType wire;
    codec::IndexFormat format;
    int64_t index_bytes;
    std::vector<int64_t> section_shape() const;
  };
  Layout layout(const Payload& rest) const;  // validated plain params
  // Selected flat indices ((n) int64, sorted) and their values ((n), x's dtype) of x viewed as
  // (rows, D). Without `values`, vals may stay undefined (device paths skip the gather).
  void select(const at::Tensor& x, int64_t rows, int64_t D, at::Tensor& idx, at::Tensor& vals, bool values = true);
  struct Selection {
    int64_t rows, k;
    at::Tensor idx, vals;  // (rows * k) int64, and values as select gives them
  };
  Selection select_rows(const at::Tensor& x, bool values);
  // The plain payload's header (no body); with pack_rest, the index bytes as its body and the value
  // section.
  Payload plain_header(const at::Tensor& x, const Selection& s, codec::IndexFormat format, int64_t index_bytes) const;
  Payload pack_rest(const at::Tensor& x, const Selection& s, const codec::EncodedIndex& enc,
                    std::vector<at::Tensor>& values) const;
  bool fused_encode(const at::Tensor& x) const;
  bool fused_decode(const Payload& p) const;
  at::Tensor randk_mask(int64_t rows, int64_t D, int64_t k);
  double rescale_factor(const Layout& l) const;

  SparseOptions o_;
  BufferedGenerator generator_;  // randk: a CPU generator, its state the buffer "generator" (uint8)
};

}  // namespace tl
