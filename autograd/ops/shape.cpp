// Shape, slicing and indexing ops. Forwards return ATen views where ATen does (reshape, permute,
// narrow, ...): no copies. Backwards route the gradient back to where each output element came
// from: a reshape/permute of the gradient, a scatter into zeros, or a sum over broadcast dims.
#include "autograd/ops/common.h"

namespace tl {
namespace {
using ops::sum_to_shape;
using tensor_list = std::vector<at::Tensor>;

void save_shape(Context& ctx, const at::Tensor& x) { ctx.saved_data["shape"] = x.sizes().vec(); }
std::vector<int64_t> saved_shape(const Context& ctx) { return ops::int_vec(ctx, "shape"); }

// Ops that keep the elements in order and only change the shape: grad_x = grad_y reshaped back.
template <class Derived>
struct ShapeOnlyFn : Function<Derived> {
  static tensor_list backward(Context& ctx, tensor_list g) { return {g[0].reshape(saved_shape(ctx))}; }
};

struct ReshapeFn : ShapeOnlyFn<ReshapeFn> {
  static constexpr const char* name = "reshape";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, at::IntArrayRef shape) {
    save_shape(ctx, x);
    return x.reshape(shape);
  }
};

struct ViewFn : ShapeOnlyFn<ViewFn> {
  static constexpr const char* name = "view";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, at::IntArrayRef shape) {
    save_shape(ctx, x);
    return x.view(shape);
  }
};

struct FlattenFn : ShapeOnlyFn<FlattenFn> {
  static constexpr const char* name = "flatten";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t start_dim, int64_t end_dim) {
    save_shape(ctx, x);
    return x.flatten(start_dim, end_dim);
  }
};

struct SqueezeFn : ShapeOnlyFn<SqueezeFn> {
  static constexpr const char* name = "squeeze";
  // A no-op when the dim's size is not 1 (as ATen).
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t dim) {
    save_shape(ctx, x);
    return x.squeeze(dim);
  }
};

struct UnsqueezeFn : ShapeOnlyFn<UnsqueezeFn> {
  static constexpr const char* name = "unsqueeze";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t dim) {
    save_shape(ctx, x);
    return x.unsqueeze(dim);
  }
};

struct PermuteFn : Function<PermuteFn> {
  static constexpr const char* name = "permute";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, at::IntArrayRef dims) {
    at::Tensor y = x.permute(dims);  // ATen checks that dims is a permutation of x's dims
    // Output dim i is input dim dims[i]; so input dim dims[i] comes from output dim i.
    std::vector<int64_t> inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inverse[at::maybe_wrap_dim(dims[i], x.dim())] = static_cast<int64_t>(i);
    ctx.saved_data["inverse"] = inverse;
    return y;
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {g[0].permute(ops::int_vec(ctx, "inverse"))}; }
};

struct TransposeFn : Function<TransposeFn> {
  static constexpr const char* name = "transpose";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t dim0, int64_t dim1) {
    ctx.saved_data["dim0"] = dim0;
    ctx.saved_data["dim1"] = dim1;
    return x.transpose(dim0, dim1);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    return {g[0].transpose(ctx.saved_data.at("dim0").toInt(), ctx.saved_data.at("dim1").toInt())};
  }
};

struct ExpandFn : Function<ExpandFn> {
  static constexpr const char* name = "expand";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, at::IntArrayRef sizes) {
    save_shape(ctx, x);
    return x.expand(sizes);
  }
  // Every broadcast copy contributed to the loss: sum them.
  static tensor_list backward(Context& ctx, tensor_list g) { return {sum_to_shape(g[0], saved_shape(ctx))}; }
};

// narrow and slice: the gradient is zeros with grad_y written into the selected positions.
struct SliceFn : Function<SliceFn> {
  static constexpr const char* name = "slice";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
    TORCH_CHECK(step > 0, "slice: step must be positive, got ", step);
    save_shape(ctx, x);
    ctx.saved_data["args"] = std::vector<int64_t>{dim, start, end, step};
    return x.slice(dim, start, end, step);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto a = ops::int_vec(ctx, "args");
    return {at::slice_backward(g[0], saved_shape(ctx), a[0], a[1], a[2], a[3])};
  }
};

struct NarrowFn : Function<NarrowFn> {
  static constexpr const char* name = "narrow";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t dim, int64_t start, int64_t length) {
    at::Tensor y = x.narrow(dim, start, length);  // ATen checks the range
    dim = at::maybe_wrap_dim(dim, x.dim());
    if (start < 0) start += x.size(dim);
    save_shape(ctx, x);
    ctx.saved_data["args"] = std::vector<int64_t>{dim, start, start + length};
    return y;
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto a = ops::int_vec(ctx, "args");
    return {at::slice_backward(g[0], saved_shape(ctx), a[0], a[1], a[2], /*step=*/1)};
  }
};

// cat: input i's gradient is its own stretch of grad_y along dim.
struct CatFn : Function<CatFn> {
  static constexpr const char* name = "cat";
  static at::Tensor forward(Context& ctx, const tensor_list& xs, int64_t dim) {
    at::Tensor y = at::cat(xs, dim);
    dim = at::maybe_wrap_dim(dim, y.dim());
    // Legacy rule shared with ATen: 1-D empty inputs are skipped when the others are not 1-D;
    // they get an empty gradient (-1 marks them).
    std::vector<int64_t> sizes;
    for (const auto& x : xs) sizes.push_back(x.dim() == 1 && x.numel() == 0 && y.dim() != 1 ? -1 : x.size(dim));
    ctx.saved_data["sizes"] = sizes;
    ctx.saved_data["dim"] = dim;
    return y;
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto sizes = ops::int_vec(ctx, "sizes");
    const int64_t dim = ctx.saved_data.at("dim").toInt();
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
struct SplitFn : Function<SplitFn> {
  static constexpr const char* name = "split";
  static tensor_list forward(Context& ctx, const at::Tensor& x, int64_t split_size, int64_t dim) {
    ctx.saved_data["dim"] = dim;
    return x.split(split_size, dim);
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {at::cat(g, ctx.saved_data.at("dim").toInt())}; }
};

struct ChunkFn : Function<ChunkFn> {
  static constexpr const char* name = "chunk";
  static tensor_list forward(Context& ctx, const at::Tensor& x, int64_t chunks, int64_t dim) {
    ctx.saved_data["dim"] = dim;
    return x.chunk(chunks, dim);
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {at::cat(g, ctx.saved_data.at("dim").toInt())}; }
};

// index_select: rows picked (possibly repeatedly) along dim; their gradients are added back.
struct IndexSelectFn : Function<IndexSelectFn> {
  static constexpr const char* name = "index_select";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t dim, const at::Tensor& index) {
    ctx.save_for_backward({index});
    save_shape(ctx, x);
    ctx.saved_data["dim"] = dim;
    return at::index_select(x, dim, index);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    return {at::index_select_backward(g[0], saved_shape(ctx), ctx.saved_data.at("dim").toInt(), ctx.saved()[0])};
  }
};

// gather: y[i][j] = x[index[i][j]][j] (dim 0); the backward scatter-adds grad_y at the same places.
// (at::gather_backward would need x itself only for its shape, so it is not kept alive for it.)
struct GatherFn : Function<GatherFn> {
  static constexpr const char* name = "gather";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, int64_t dim, const at::Tensor& index) {
    ctx.save_for_backward({index});
    save_shape(ctx, x);
    ctx.saved_data["dim"] = dim;
    return at::gather(x, dim, index);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    return {at::zeros(saved_shape(ctx), g[0].options())
                .scatter_add_(ctx.saved_data.at("dim").toInt(), ctx.saved()[0], g[0])};
  }
};

// embedding: weight (V, D), indices (...) -> (..., D). Row gradients are summed per index; the
// row at padding_idx gets none (ATen's embedding backward, dense).
struct EmbeddingFn : Function<EmbeddingFn> {
  static constexpr const char* name = "embedding";
  static at::Tensor forward(Context& ctx, const at::Tensor& weight, const at::Tensor& indices, int64_t padding_idx) {
    ctx.save_for_backward({indices});
    ctx.saved_data["num_weights"] = weight.size(0);
    ctx.saved_data["padding_idx"] = padding_idx;
    return at::embedding(weight, indices, padding_idx);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    return {at::embedding_backward(g[0], ctx.saved()[0], ctx.saved_data.at("num_weights").toInt(),
                                   ctx.saved_data.at("padding_idx").toInt(), /*scale_grad_by_freq=*/false,
                                   /*sparse=*/false)};
  }
};

// masked_fill: y = x where !mask, value where mask (broadcast together, as ATen's out-of-place
// masked_fill); filled positions get no gradient.
struct MaskedFillFn : Function<MaskedFillFn> {
  static constexpr const char* name = "masked_fill";
  static at::Tensor forward(Context& ctx, const at::Tensor& x, const at::Tensor& mask, double value) {
    ctx.save_for_backward({mask});
    save_shape(ctx, x);
    return at::masked_fill(x, mask, value);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    return {sum_to_shape(g[0].masked_fill(ctx.saved()[0], 0), saved_shape(ctx))};
  }
};

struct WhereFn : Function<WhereFn> {
  static constexpr const char* name = "where";
  static at::Tensor forward(Context& ctx, const at::Tensor& condition, const at::Tensor& a, const at::Tensor& b) {
    ctx.save_for_backward({condition});
    ctx.saved_data["sa"] = a.sizes().vec();
    ctx.saved_data["sb"] = b.sizes().vec();
    return at::where(condition, a, b);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const at::Tensor& condition = ctx.saved()[0];
    at::Tensor grad_a, grad_b;
    if (ctx.needs_input_grad(0))
      grad_a = sum_to_shape(g[0].masked_fill(condition.logical_not(), 0), ops::int_vec(ctx, "sa"));
    if (ctx.needs_input_grad(1)) grad_b = sum_to_shape(g[0].masked_fill(condition, 0), ops::int_vec(ctx, "sb"));
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
