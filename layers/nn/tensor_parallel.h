#pragma once
// Tensor parallelism inside transformer blocks (Megatron-LM's column/row split), as the layers see
// it: the split of the weights, the two differentiable collectives, and the two linear layers that
// own them (ColumnParallelLinear, RowParallelLinear). The collectives themselves (over the
// transport, compressed or not) are parallel/ranks/tensor_parallel.h's.
//
// Note [tensor-parallel blocks]. With T ranks in a tensor-parallel group, rank t holds of every
// transformer block:
//   attention: the heads [t H / T, (t + 1) H / T): their rows of query, key and value (of each third
//              of a fused qkv), column-parallel, and the matching input columns of the output
//              projection, row-parallel;
//   MLP:       the rows [t F / T, (t + 1) F / T) of fc (column-parallel) and the matching input
//              columns of proj (row-parallel);
//   whole on every rank (replicated): the row-parallel layers' biases, the LayerNorms, the
//              embeddings, heads and poolers.
// Each sublayer then reads
//   x_t = copy(x)                 f: identity forward; backward, the gradient is all-reduced
//   h_t = column-parallel(x_t)    (B, T, C / T) this rank's heads, or (B, T, F / T) its hidden units
//   y   = reduce(h_t W_t^T) + b   g: all-reduce forward; backward, the identity
// ColumnParallelLinear holds a rank's rows of W (and of its bias) and applies f to its input;
// RowParallelLinear holds its input columns, applies g to its partial product, and adds its whole
// bias once, after the sum (added on every rank before the sum it would count T times).
// and sum_t h_t W_t^T = h W^T is the unsplit layer, to the order of the sum. The communicator gives
// every rank of the group the same bits (compressed or not), so the residual stream, and the
// gradients of every replicated parameter, are equal on all T ranks without any other exchange.
// A site is one sublayer ("h.3.attn", "h.3.mlp"): its forward all-reduce (g) and its backward one
// (f) may be compressed independently (config tp.forward, tp.backward).
//
// Attention dropout: each rank draws the masks of its own heads from its attention stream, forked
// by tensor rank when the block is split, so heads of different ranks do not share masks (as
// Megatron's model-parallel RNG). The masks therefore differ from the unsplit model's: runs that
// compare T against T = 1 use dropout 0.

#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"
#include "layers/nn/linear.h"

namespace tl {

/// Rank `rank` of `size`'s part of `full` (a view; Note [tensor-parallel blocks]). Error if the
/// split extent is not groups x size equal parts.
at::Tensor shard_tensor(const at::Tensor& full, const TensorShard& shard, int64_t rank, int64_t size);
/// The whole tensor from every rank's part, by rank (the inverse of shard_tensor).
at::Tensor unshard_tensor(const std::vector<at::Tensor>& parts, const TensorShard& shard);

/// Which all-reduce of a site: the forward one of a row-parallel output (g), or the backward one
/// of a column-parallel input's gradient (f).
enum class TpDirection { Forward, Backward };

/// The group's all-reduce, implemented by the runtime.
class TensorParallelComm {
 public:
  virtual ~TensorParallelComm() = default;
  /// The sum of `x` over the group's ranks, the same bits on every rank. Every rank calls it with
  /// the same sites in the same order.
  virtual at::Tensor all_reduce(const at::Tensor& x, const std::string& site, TpDirection direction) = 0;
};

/// One tensor-parallel group as the layers see it: this rank's place in it, the sites split, and
/// the communicator (bound once the ranks have met).
class TensorParallel {
 public:
  TensorParallel(int64_t rank, int64_t size);
  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }

  void bind(std::shared_ptr<TensorParallelComm> comm) { comm_ = std::move(comm); }
  const std::shared_ptr<TensorParallelComm>& comm() const { return comm_; }

  /// f: x forward; its gradient all-reduced over the group backward.
  Variable copy(const Variable& x, const std::string& site) const;
  /// g: x all-reduced over the group forward; the gradient passed through backward.
  Variable reduce(const Variable& x, const std::string& site) const;

  /// The sites split so far, in model order.
  const std::vector<std::string>& sites() const { return sites_; }
  void add_site(const std::string& site) { sites_.push_back(site); }

 private:
  TensorParallelComm& checked_comm(const std::string& site) const;
  int64_t rank_, size_;
  std::shared_ptr<TensorParallelComm> comm_;
  std::vector<std::string> sites_;
};
using TensorParallelPtr = std::shared_ptr<TensorParallel>;

/// A Linear that split() cuts over a tensor-parallel group, keeping one rank's part of its weight
/// in a tensor of the part's size (the whole one, initialised as the unsplit layer's from the
/// same generator, is freed: a rank's numbers are the whole layer's, Note [initialisation by
/// name]). Before split() it is exactly a Linear. Its split parameters are marked sharded
/// (Module::mark_sharded), so checkpoints reassemble the whole tensor.
class ParallelLinear : public Linear {
 public:
  bool is_split() const { return tp_ != nullptr; }

 protected:
  ParallelLinear(const char* type_name, int64_t in_features, int64_t out_features, bool bias,
                 const init::Generator& gen);
  /// Keeps tp's rank's part of the weight along `shard` (and of the bias with `split_bias`);
  /// `site` names the sublayer's all-reduces.
  void keep_part(const TensorParallelPtr& tp, const std::string& site, TensorShard shard, bool split_bias);

  TensorParallelPtr tp_;  // null: unsplit
  std::string site_;
};

/// Column-parallel: rank t computes its rows of the output features (Note [tensor-parallel blocks]).
class ColumnParallelLinear : public ParallelLinear {
 public:
  /// `groups`: the output features are that many equal blocks, each split alike (a fused
  /// [q; k; v] projection: 3).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias = true,
                       const init::Generator& gen = std::nullopt, int64_t groups = 1);
  /// f, then this rank's outputs: x (..., in) -> (..., out / T).
  Variable forward(const Variable& x) override { return forward_copied(copy_input(x)); }
  /// f alone (the identity unsplit). Column-parallel layers that read one input share one f, so
  /// its gradient is all-reduced once (BERT's query, key and value).
  Variable copy_input(const Variable& x) const;
  /// This rank's outputs of an input that went through copy_input: (..., in) -> (..., out / T).
  Variable forward_copied(const Variable& x) const;

  /// Keeps tp's rank's output features (of each group), the bias alike.
  void split(const TensorParallelPtr& tp, const std::string& site);

 private:
  int64_t groups_;
};

/// Row-parallel: rank t holds the input columns matching a column-parallel layer's outputs; the
/// partial products are summed over the group (g) and the bias, whole on every rank, added once.
class RowParallelLinear : public ParallelLinear {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias = true,
                    const init::Generator& gen = std::nullopt);
  /// This rank's inputs (..., in / T) -> g(x W_t^T) + b (..., out); unsplit, x W^T + b.
  Variable forward(const Variable& x) override;

  /// Keeps tp's rank's input columns; the bias stays whole.
  void split(const TensorParallelPtr& tp, const std::string& site);
};

/// Splits every attention and MLP of `model` over tp's group (Note [tensor-parallel blocks]); its
/// built blocks only (a rank's stages). `what` names the model in errors. Errors: a model without
/// attention or MLP (ResNets), or a size that does not divide the heads or the hidden units.
void shard_tensor_parallel(Module& model, const TensorParallelPtr& tp, const std::string& what);

/// Why `model` cannot be split over `size` tensor-parallel ranks ("" if it can): no transformer
/// blocks, or heads / hidden units that `size` does not divide. Works on a skeleton model.
std::string tensor_parallel_problem(Module& model, int64_t size);

}  // namespace tl
