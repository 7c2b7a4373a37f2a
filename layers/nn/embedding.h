#pragma once
// Embedding: a lookup table of rows.

#include "layers/module.h"
#include "layers/nn/init.h"

namespace tl {

class Embedding : public Module {
 public:
  /// weight (num, dim) ~ N(0, 1); the row at padding_idx (if >= 0) is zero and gets no gradient.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1,
            const init::Generator& gen = std::nullopt);
  /// ids (...) int64 -> (..., dim). The Variable carries the index tensor (no gradient).
  Variable forward(const Variable& ids) override;
  Variable forward(const at::Tensor& ids);

  const Variable& weight() const { return weight_; }
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

 private:
  int64_t num_embeddings_, embedding_dim_, padding_idx_;
  Variable weight_;  // (num, dim)
};

}  // namespace tl
