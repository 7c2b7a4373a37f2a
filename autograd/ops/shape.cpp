// Shape, slicing and indexing ops. Forwards return ATen views where ATen does (reshape, permute,
// narrow, ...): no copies. Backwards route the gradient back to where each output element came
// from: a reshape/permute of the gradient, a scatter into zeros, or a sum over broadcast dims.
#include "autograd/ops/common.h"

namespace tl {
namespace {
using ops::sum_to_shape;
using tensor_list = std::vector<at::Tensor>;

// The input's shape (for backwards that route the gradient back into it).
struct InputShape {
  Shape shape;
};

// Ops that keep the elements in order and only change the shape: grad_x = grad_y reshaped back.
template <class Derived>
struct ShapeOnlyFn : Function<Derived> {
  using Saved = InputShape;
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) { return {g[0].reshape(s.shape)}; }
};

struct ReshapeFn : ShapeOnlyFn<ReshapeFn> {
  static constexpr const char* name = "reshape";
  static at::Tensor forward(Context& ctx, InputShape& s, const at::Tensor& x, at::IntArrayRef shape) {
    s.shape = shape_of(x.sizes());
    return x.reshape(shape);
  }
};

struct ViewFn : ShapeOnlyFn<ViewFn> {
  static constexpr const char* name = "view";
  static at::Tensor forward(Context& ctx, InputShape& s, const at::Tensor& x, at::IntArrayRef shape) {
    s.shape = shape_of(x.sizes());
    return x.view(shape);
  }
};

struct FlattenFn : ShapeOnlyFn<FlattenFn> {
  static constexpr const char* name = "flatten";
  static at::Tensor forward(Context& ctx, InputShape& s, const at::Tensor& x, int64_t start_dim, int64_t end_dim) {
    s.shape = shape_of(x.sizes());
    return x.flatten(start_dim, end_dim);
  }
};

struct SqueezeFn : ShapeOnlyFn<SqueezeFn> {
  static constexpr const char* name = "squeeze";
  // A no-op when the dim's size is not 1 (as ATen).
  static at::Tensor forward(Context& ctx, InputShape& s, const at::Tensor& x, int64_t dim) {
    s.shape = shape_of(x.sizes());
    return x.squeeze(dim);
  }
};

struct UnsqueezeFn : ShapeOnlyFn<UnsqueezeFn> {
  static constexpr const char* name = "unsqueeze";
  static at::Tensor forward(Context& ctx, InputShape& s, const at::Tensor& x, int64_t dim) {
    s.shape = shape_of(x.sizes());
    return x.unsqueeze(dim);
  }
};

struct PermuteFn : Function<PermuteFn> {
  static constexpr const char* name = "permute";
  struct Saved {
    ops::IntList inverse;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, at::IntArrayRef dims) {
    at::Tensor y = x.permute(dims);  // ATen checks that dims is a permutation of x's dims
    // Output dim i is input dim dims[i]; so input dim dims[i] comes from output dim i.
    s.inverse.resize(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) s.inverse[at::maybe_wrap_dim(dims[i], x.dim())] = static_cast<int64_t>(i);
    return y;
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) { return {g[0].permute(s.inverse)}; }
};

struct TransposeFn : Function<TransposeFn> {
  static constexpr const char* name = "transpose";
  struct Saved {
    int64_t dim0 = 0, dim1 = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim0, int64_t dim1) {
    s.dim0 = dim0;
    s.dim1 = dim1;
    return x.transpose(dim0, dim1);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) { return {g[0].transpose(s.dim0, s.dim1)}; }
};

struct ExpandFn : Function<ExpandFn> {
  static constexpr const char* name = "expand";
  using Saved = InputShape;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, at::IntArrayRef sizes) {
    s.shape = shape_of(x.sizes());
    return x.expand(sizes);
  }
  // Every broadcast copy contributed to the loss: sum them.
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) { return {sum_to_shape(g[0], s.shape)}; }
};

// narrow and slice: the gradient is zeros with grad_y written into the selected positions.
// The input's shape and the selected range (dim, start, end, step).
struct SliceSaved {
  Shape shape;
  int64_t dim = 0, start = 0, end = 0, step = 1;
};

struct SliceFn : Function<SliceFn> {
  static constexpr const char* name = "slice";
  using Saved = SliceSaved;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim, int64_t start, int64_t end,
                            int64_t step) {
    TORCH_CHECK(step > 0, "slice: step must be positive, got ", step);
    s = {shape_of(x.sizes()), dim, start, end, step};
    return x.slice(dim, start, end, step);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {at::slice_backward(g[0], s.shape, s.dim, s.start, s.end, s.step)};
  }
};

struct NarrowFn : Function<NarrowFn> {
  static constexpr const char* name = "narrow";
  using Saved = SliceSaved;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim, int64_t start, int64_t length) {
    at::Tensor y = x.narrow(dim, start, length);  // ATen checks the range
    dim = at::maybe_wrap_dim(dim, x.dim());
    if (start < 0) start += x.size(dim);
    s = {shape_of(x.sizes()), dim, start, start + length, /*step=*/1};
    return y;
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {at::slice_backward(g[0], s.shape, s.dim, s.start, s.end, s.step)};
  }
};

// cat: input i's gradient is its own stretch of grad_y along dim.
struct CatFn : Function<CatFn> {
  static constexpr const char* name = "cat";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    ops::IntList sizes;  // each input's extent along dim (-1: a skipped 1-D empty input)
    int64_t dim = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const tensor_list& xs, int64_t dim) {
    at::Tensor y = at::cat(xs, dim);
    dim = at::maybe_wrap_dim(dim, y.dim());
    // Legacy rule shared with ATen: 1-D empty inputs are skipped when the others are not 1-D;
    // they get an empty gradient (-1 marks them).
    for (const auto& x : xs) s.sizes.push_back(x.dim() == 1 && x.numel() == 0 && y.dim() != 1 ? -1 : x.size(dim));
    s.dim = dim;
    return y;
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const auto& sizes = s.sizes;
    const int64_t dim = s.dim;
    tensor_list grads(sizes.size());
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < 0) {
        if (ctx.needs_input_grad(i)) grads[i] = at::zeros({0}, g[0].options());
        continue;
      }
      if (ctx.needs_input_grad(i)) grads[i] = g[0].narrow(dim, offset, sizes[i]);
      offset += sizes[i];
    }
    return grads;
  }
};

// split and chunk: several outputs, each a view of a stretch of x along dim; the gradient is the
// concatenation of the output gradients (the engine passes zeros for outputs that got none).
struct DimSaved {
  int64_t dim = 0;
};

struct SplitFn : Function<SplitFn> {
  static constexpr const char* name = "split";
  using Saved = DimSaved;
  static tensor_list forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t split_size, int64_t dim) {
    s.dim = dim;
    return x.split(split_size, dim);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) { return {at::cat(g, s.dim)}; }
};

struct ChunkFn : Function<ChunkFn> {
  static constexpr const char* name = "chunk";
  using Saved = DimSaved;
  static tensor_list forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t chunks, int64_t dim) {
    s.dim = dim;
    return x.chunk(chunks, dim);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) { return {at::cat(g, s.dim)}; }
};

// The input's shape and the dim an index op works along.
struct ShapeDimSaved {
  Shape shape;
  int64_t dim = 0;
};

// Note [ops on the meta device]. The planner runs steps on meta tensors (shapes only;
// tasks/runner/plan.h). The few ATen ops without a meta kernel in C++ (index_select, embedding
// and their backwards) make their outputs' shapes here instead; costs are charged as always.

// index_select: rows picked (possibly repeatedly) along dim; their gradients are added back.
struct IndexSelectFn : Function<IndexSelectFn> {
  static constexpr const char* name = "index_select";
  static constexpr bool kFreshOutputs = true;
  using Saved = ShapeDimSaved;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim, const at::Tensor& index) {
    ctx.save_for_backward({index});
    s = {shape_of(x.sizes()), dim};
    if (x.is_meta()) {  // Note [ops on the meta device]
      std::vector<int64_t> out = x.sizes().vec();
      out[static_cast<size_t>(at::maybe_wrap_dim(dim, x.dim()))] = index.numel();
      return at::empty(out, x.options());
    }
    return at::index_select(x, dim, index);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    if (g[0].is_meta()) return {at::empty(s.shape, g[0].options())};
    return {at::index_select_backward(g[0], s.shape, s.dim, ctx.saved()[0])};
  }
};

// gather: y[i][j] = x[index[i][j]][j] (dim 0); the backward scatter-adds grad_y at the same places.
// (at::gather_backward would need x itself only for its shape, so it is not kept alive for it.)
struct GatherFn : Function<GatherFn> {
  static constexpr const char* name = "gather";
  static constexpr bool kFreshOutputs = true;
  using Saved = ShapeDimSaved;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim, const at::Tensor& index) {
    ctx.save_for_backward({index});
    s = {shape_of(x.sizes()), dim};
    return at::gather(x, dim, index);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {at::zeros(s.shape, g[0].options()).scatter_add_(s.dim, ctx.saved()[0], g[0])};
  }
};

// embedding: weight (V, D), indices (...) -> (..., D). Row gradients are summed per index; the
// row at padding_idx gets none (ATen's embedding backward, dense).
struct EmbeddingFn : Function<EmbeddingFn> {
  static constexpr const char* name = "embedding";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    int64_t num_weights = 0, padding_idx = -1;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& weight, const at::Tensor& indices,
                            int64_t padding_idx) {
    ctx.save_for_backward({indices});
    s.num_weights = weight.size(0);
    s.padding_idx = padding_idx;
    if (weight.is_meta()) {  // Note [ops on the meta device]
      std::vector<int64_t> out = indices.sizes().vec();
      out.push_back(weight.size(1));
      return at::empty(out, weight.options());
    }
    return at::embedding(weight, indices, padding_idx);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    if (g[0].is_meta()) return {at::empty({s.num_weights, g[0].size(-1)}, g[0].options())};
    return {at::embedding_backward(g[0], ctx.saved()[0], s.num_weights, s.padding_idx, /*scale_grad_by_freq=*/false,
                                   /*sparse=*/false)};
  }
};

// masked_fill: y = x where !mask, value where mask (broadcast together, as ATen's out-of-place
// masked_fill); filled positions get no gradient.
struct MaskedFillFn : Function<MaskedFillFn> {
  static constexpr const char* name = "masked_fill";
  static constexpr bool kFreshOutputs = true;
  using Saved = InputShape;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, const at::Tensor& mask, double value) {
    ctx.save_for_backward({mask});
    s.shape = shape_of(x.sizes());
    return at::masked_fill(x, mask, value);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {sum_to_shape(g[0].masked_fill(ctx.saved()[0], 0), s.shape)};
  }
};

struct WhereFn : Function<WhereFn> {
  static constexpr const char* name = "where";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape sa, sb;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& condition, const at::Tensor& a,
                            const at::Tensor& b) {
    ctx.save_for_backward({condition});
    s.sa = shape_of(a.sizes());
    s.sb = shape_of(b.sizes());
    return at::where(condition, a, b);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const at::Tensor& condition = ctx.saved()[0];
    at::Tensor grad_a, grad_b;
    if (ctx.needs_input_grad(0)) grad_a = sum_to_shape(g[0].masked_fill(condition.logical_not(), 0), s.sa);
    if (ctx.needs_input_grad(1)) grad_b = sum_to_shape(g[0].masked_fill(condition, 0), s.sb);
    return {grad_a, grad_b};
  }
};

void check_index(const at::Tensor& index, const char* op, const char* what) {
  TORCH_CHECK(index.defined(), op, ": ", what, " is undefined");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, op, ": ", what,
              " must be an int64 (or int32) tensor, got ", index.scalar_type());
}

void check_mask(const at::Tensor& mask, const char* op, const char* what) {
  TORCH_CHECK(mask.defined(), op, ": ", what, " is undefined");
  TORCH_CHECK(mask.scalar_type() == at::kBool, op, ": ", what, " must be a bool tensor, got ", mask.scalar_type());
}

}  // namespace

Variable reshape(const Variable& x, at::IntArrayRef shape) { return ReshapeFn::apply(x, shape); }
Variable view(const Variable& x, at::IntArrayRef shape) { return ViewFn::apply(x, shape); }
Variable permute(const Variable& x, at::IntArrayRef dims) { return PermuteFn::apply(x, dims); }
Variable transpose(const Variable& x, int64_t dim0, int64_t dim1) { return TransposeFn::apply(x, dim0, dim1); }
Variable flatten(const Variable& x, int64_t start_dim, int64_t end_dim) {
  return FlattenFn::apply(x, start_dim, end_dim);
}
Variable squeeze(const Variable& x, int64_t dim) { return SqueezeFn::apply(x, dim); }
Variable unsqueeze(const Variable& x, int64_t dim) { return UnsqueezeFn::apply(x, dim); }
Variable expand(const Variable& x, at::IntArrayRef sizes) { return ExpandFn::apply(x, sizes); }
Variable narrow(const Variable& x, int64_t dim, int64_t start, int64_t length) {
  return NarrowFn::apply(x, dim, start, length);
}
Variable slice(const Variable& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return SliceFn::apply(x, dim, start, end, step);
}

// cat takes a list of Variables, which Function<T>::apply does not unpack (it collects only
// Variable arguments), so the node is built here the same way apply builds it.
Variable cat(const variable_list& xs, int64_t dim) {
  TORCH_CHECK(!xs.empty(), "cat: expected a non-empty list of variables");
  for (size_t i = 0; i < xs.size(); ++i) TORCH_CHECK(xs[i].defined(), "cat: variable ", i, " of the list is undefined");
  return CatFn::apply(xs, dim);
}

variable_list split(const Variable& x, int64_t split_size, int64_t dim) { return SplitFn::apply(x, split_size, dim); }
variable_list chunk(const Variable& x, int64_t chunks, int64_t dim) { return ChunkFn::apply(x, chunks, dim); }

Variable index_select(const Variable& x, int64_t dim, const at::Tensor& index) {
  check_index(index, "index_select", "index");
  return IndexSelectFn::apply(x, dim, index);
}
Variable gather(const Variable& x, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK(index.defined() && index.scalar_type() == at::kLong, "gather: index must be an int64 tensor, got ",
              index.defined() ? c10::toString(index.scalar_type()) : "an undefined tensor");
  return GatherFn::apply(x, dim, index);
}
Variable embedding(const Variable& weight, const at::Tensor& indices, int64_t padding_idx) {
  TORCH_CHECK(weight.defined() && weight.dim() == 2, "embedding: weight must be 2-D (num_embeddings, dim), got ",
              weight.defined() ? c10::str(weight.sizes()) : std::string("an undefined variable"));
  check_index(indices, "embedding", "indices");
  TORCH_CHECK(padding_idx >= -1 && padding_idx < weight.size(0), "embedding: padding_idx ", padding_idx,
              " is out of range; accepted: -1 (no padding) or [0, ", weight.size(0), ")");
  return EmbeddingFn::apply(weight, indices, padding_idx);
}
Variable masked_fill(const Variable& x, const at::Tensor& mask, double value) {
  check_mask(mask, "masked_fill", "mask");
  return MaskedFillFn::apply(x, mask, value);
}
Variable where(const at::Tensor& condition, const Variable& a, const Variable& b) {
  check_mask(condition, "where", "condition");
  return WhereFn::apply(condition, a, b);
}

}  // namespace tl
