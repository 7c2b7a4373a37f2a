// Tensor-parallel splitting of transformer blocks and the f / g collectives
// (Note [tensor-parallel blocks]).
#include "layers/nn/tensor_parallel.h"

#include "layers/nn/transformer.h"

namespace tl {

at::Tensor shard_tensor(const at::Tensor& full, const TensorShard& s, int64_t rank, int64_t size) {
  TORCH_CHECK(s.dim >= 0 && s.dim < full.dim() && s.groups >= 1 && size >= 1 && rank >= 0 && rank < size,
              "shard_tensor: dim ", s.dim, ", groups ", s.groups, ", rank ", rank, " of ", size,
              " for a tensor of shape ", full.sizes());
  const int64_t extent = full.size(s.dim);
  TORCH_CHECK(extent % (s.groups * size) == 0, "shard_tensor: dimension ", s.dim, " of ", full.sizes(), " (", extent,
              ") is not ", s.groups, " block(s) of ", size, " equal parts");
  const int64_t block = extent / s.groups, part = block / size;
  if (s.groups == 1) return full.narrow(s.dim, rank * part, part);
  std::vector<at::Tensor> pieces;  // part `rank` of every block, in block order
  for (int64_t g = 0; g < s.groups; ++g) pieces.push_back(full.narrow(s.dim, g * block + rank * part, part));
  return at::cat(pieces, s.dim);
}

at::Tensor unshard_tensor(const std::vector<at::Tensor>& parts, const TensorShard& s) {
  TORCH_CHECK(!parts.empty(), "unshard_tensor: no parts");
  const int64_t size = static_cast<int64_t>(parts.size());
  for (const auto& p : parts)
    TORCH_CHECK(p.sizes().equals(parts[0].sizes()) && p.size(s.dim) % s.groups == 0, "unshard_tensor: parts of shapes ",
                parts[0].sizes(), " and ", p.sizes(), " do not make ", s.groups, " block(s) along dimension ", s.dim);
  const int64_t piece = parts[0].size(s.dim) / s.groups;
  std::vector<at::Tensor> pieces;  // block g: every rank's piece g, by rank
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t r = 0; r < size; ++r) pieces.push_back(parts[static_cast<size_t>(r)].narrow(s.dim, g * piece, piece));
  return at::cat(pieces, s.dim);
}

// ---- the collectives as ops -----------------------------------------------------------------------

namespace {

// f: identity forward, all-reduce of the gradient backward.
struct TpCopyFn : Function<TpCopyFn> {
  static constexpr const char* name = "tp_copy";
  static constexpr bool kFreshOutputs = false;  // the output is the input
  struct Saved {
    TensorParallelComm* comm = nullptr;
    std::string site;
  };
  static at::Tensor forward(Context&, Saved& s, const at::Tensor& x, TensorParallelComm* comm,
                            const std::string& site) {
    s.comm = comm, s.site = site;
    return x.alias();
  }
  static std::vector<at::Tensor> backward(Context&, const Saved& s, std::vector<at::Tensor> g) {
    return {s.comm->all_reduce(g[0].contiguous(), s.site, TpDirection::Backward)};
  }
};

// g: all-reduce forward, identity backward.
struct TpReduceFn : Function<TpReduceFn> {
  static constexpr const char* name = "tp_reduce";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context&, const at::Tensor& x, TensorParallelComm* comm, const std::string& site) {
    return comm->all_reduce(x.contiguous(), site, TpDirection::Forward);
  }
  static std::vector<at::Tensor> backward(Context&, std::vector<at::Tensor> g) { return {g[0]}; }
};

}  // namespace

TensorParallel::TensorParallel(int64_t rank, int64_t size) : rank_(rank), size_(size) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor parallelism: rank ", rank, " of a group of ", size);
}

TensorParallelComm& TensorParallel::checked_comm(const std::string& site) const {
  TORCH_CHECK(comm_, site, ": this block is split over ", size_,
              " tensor-parallel ranks but no communicator is bound (the ranks have not met)");
  return *comm_;
}

Variable TensorParallel::copy(const Variable& x, const std::string& site) const {
  return TpCopyFn::apply(x, &checked_comm(site), site);
}

Variable TensorParallel::reduce(const Variable& x, const std::string& site) const {
  return TpReduceFn::apply(x, &checked_comm(site), site);
}

// ---- the parallel linear layers --------------------------------------------------------------------

ParallelLinear::ParallelLinear(const char* type_name, int64_t in_features, int64_t out_features, bool bias,
                               const init::Generator& gen)
    : Linear(type_name, in_features, out_features, bias, gen) {}

void ParallelLinear::keep_part(const TensorParallelPtr& tp, const std::string& site, TensorShard shard,
                               bool split_bias) {
  TORCH_CHECK(tp, site, ": ", type_name(), "::split without a group");
  TORCH_CHECK(!tp_, site, ": ", type_name(), " is already split over tensor-parallel ranks");
  NoGradGuard no_grad;
  // Each part in a tensor of its own size: a narrowed view would keep the whole tensor alive.
  auto part = [&](const at::Tensor& whole) {
    return shard_tensor(whole, shard, tp->rank(), tp->size()).clone(at::MemoryFormat::Contiguous);
  };
  weight_.set_data(part(weight_.data()));  // (out / T, in) or (out, in / T)
  mark_sharded("weight", shard);
  if (split_bias && bias_.defined()) {
    bias_.set_data(part(bias_.data()));
    mark_sharded("bias", shard);
  }
  out_features_ = weight_.size(0), in_features_ = weight_.size(1);
  tp_ = tp, site_ = site;
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                           const init::Generator& gen, int64_t groups)
    : ParallelLinear("ColumnParallelLinear", in_features, out_features, bias, gen), groups_(groups) {
  TORCH_CHECK(groups >= 1 && out_features % groups == 0, "ColumnParallelLinear: out_features (", out_features,
              ") must be ", groups, " equal block(s)");
}

Variable ColumnParallelLinear::copy_input(const Variable& x) const { return tp_ ? tp_->copy(x, site_) : x; }

Variable ColumnParallelLinear::forward_copied(const Variable& x) const {
  check_input(x);
  return linear(x, weight_, bias_);
}

void ColumnParallelLinear::split(const TensorParallelPtr& tp, const std::string& site) {
  keep_part(tp, site, {0, groups_}, /*split_bias=*/true);
}

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, const init::Generator& gen)
    : ParallelLinear("RowParallelLinear", in_features, out_features, bias, gen) {}

Variable RowParallelLinear::forward(const Variable& x) {
  check_input(x);
  if (!tp_) return linear(x, weight_, bias_);
  const Variable y = tp_->reduce(linear(x, weight_), site_);  // g: the partial products summed
  return bias_.defined() ? y + bias_ : y;                     // the bias once
}

void RowParallelLinear::split(const TensorParallelPtr& tp, const std::string& site) {
  keep_part(tp, site, {1, 1}, /*split_bias=*/false);
}

// ---- splitting a model ----------------------------------------------------------------------------

std::string tensor_parallel_problem(Module& model, int64_t size) {
  if (size == 1) return "";
  int64_t blocks = 0;
  for (const auto& [path, m] : model.named_modules()) {
    if (const auto* a = dynamic_cast<const MultiHeadAttention*>(m.get())) {
      ++blocks;
      const int64_t heads = a->options().num_heads_;
      if (heads % size != 0)
        return path + ": " + std::to_string(heads) + " attention heads do not split evenly over " +
               std::to_string(size) + " tensor-parallel ranks (parallel.tp must divide the heads)";
    } else if (const auto* mlp = dynamic_cast<const MLP*>(m.get())) {
      const int64_t hidden = mlp->fc()->out_features();
      if (hidden % size != 0)
        return path + ": the MLP's " + std::to_string(hidden) + " hidden units do not split evenly over " +
               std::to_string(size) + " tensor-parallel ranks (parallel.tp must divide them)";
    }
  }
  if (blocks == 0)
    return "the model has no attention or MLP layers to split (tensor parallelism splits transformer blocks: "
           "gpt2-* and minilm; ResNets run with parallel.tp = 1)";
  return "";
}

void shard_tensor_parallel(Module& model, const TensorParallelPtr& tp, const std::string& what) {
  TORCH_CHECK(tp, what, ": shard_tensor_parallel without a group");
  if (tp->size() == 1) return;
  // Checked on the whole model before splitting anything (a skeleton rank has no blocks: fine).
  for (const auto& [path, m] : model.named_modules()) {
    if (auto a = std::dynamic_pointer_cast<MultiHeadAttention>(m)) {
      const std::string p = tensor_parallel_problem(*a, tp->size());
      TORCH_CHECK(p.empty(), what, ": parallel.tp = ", tp->size(), ": ", path, ": ", p);
      a->shard(tp, path);
    } else if (auto mlp = std::dynamic_pointer_cast<MLP>(m)) {
      const int64_t hidden = mlp->fc()->out_features();
      TORCH_CHECK(hidden % tp->size() == 0, what, ": parallel.tp = ", tp->size(), ": ", path, ": the MLP's ", hidden,
                  " hidden units do not split evenly over ", tp->size(), " tensor-parallel ranks");
      mlp->shard(tp, path);
    }
  }
}

}  // namespace tl
