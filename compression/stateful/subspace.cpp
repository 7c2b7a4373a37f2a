#include "compression/stateful/subspace.h"

#include <ATen/CPUGeneratorImpl.h>

#include "autograd/ops.h"
#include "compression/codecs/common.h"
#include "compression/stateful/common.h"

namespace tl {

Subspace::Subspace(Options opt) : Compressor("Subspace"), opt_(std::move(opt)) {
  TORCH_CHECK(opt_.k >= 1, "subspace: k must be >= 1, got ", opt_.k);
  TORCH_CHECK(opt_.d >= 0 && opt_.vocab >= 0,
              "subspace: d and vocab must be >= 0 (0: from the input / no token "
              "embedding), got d=",
              opt_.d, ", vocab=", opt_.vocab);
  TORCH_CHECK(opt_.token_std > 0, "subspace: token_std must be > 0, got ", opt_.token_std);
  TORCH_CHECK(opt_.k <= stateful::kMaxWidth && opt_.d <= stateful::kMaxWidth && opt_.vocab <= stateful::kMaxVocab,
              "subspace: k=", opt_.k, ", d=", opt_.d, ", vocab=", opt_.vocab, " is too large; accepted: k and d up to ",
              stateful::kMaxWidth, ", vocab up to ", stateful::kMaxVocab);
  wire_ = opt_.wire ? opt_.wire : parse_compressor("identity");
  TORCH_CHECK(!wire_->has_transform(), "subspace: the wire codec '", wire_->spec(),
              "' cannot itself be ae or subspace");
  register_module("wire", wire_);
  basis_ = register_buffer("basis", at::zeros({0, opt_.k}));
  tokens_ = register_buffer("token_embedding", at::zeros({opt_.vocab, 0}));
  mark_resizable("basis");
  mark_resizable("token_embedding");
  if (opt_.d > 0) check_width(opt_.d);  // generated on first use: see Note [subspace tables are lazy]
}

std::string Subspace::spec() const {
  std::string s = "subspace(k=" + std::to_string(opt_.k);
  if (opt_.d > 0) s += ", d=" + std::to_string(opt_.d);
  if (opt_.vocab > 0) s += ", vocab=" + std::to_string(opt_.vocab);
  if (opt_.seed != 0) s += ", seed=" + std::to_string(opt_.seed);
  if (opt_.token_std != 0.02) s += ", token_std=" + codec::format_number(opt_.token_std);
  if (opt_.wire) s += ", wire=" + opt_.wire->spec();
  return s + ")";
}

// Note [subspace tables are lazy]
// U (d x k) and T (V x d) are generated when first needed (a forward, add_token_embedding, the
// model's input_token_embedding, project_weight, the accessors), not when the spec is parsed: a
// spec costs nothing until a model uses it (T can be 2^26 floats; the spec fuzzer parses
// thousands a second), and a checkpoint loaded before first use replaces them without generating.
// The sizes are checked at parse time all the same, so a bad spec fails where it is written.
void Subspace::check_width(int64_t d) const {
  TORCH_CHECK(opt_.d == 0 || opt_.d == d, "subspace: declared d=", opt_.d, " but the input has width ", d);
  TORCH_CHECK(opt_.k <= d, "subspace: k=", opt_.k, " exceeds the width d=", d);
  TORCH_CHECK(d <= stateful::kMaxWidth && opt_.vocab * d <= stateful::kMaxTableElements &&
                  opt_.k * d <= stateful::kMaxTableElements,
              "subspace: width d=", d, " with k=", opt_.k, " and vocab=", opt_.vocab,
              " is too large; accepted: d up to ", stateful::kMaxWidth, ", a basis of d x k and a token embedding",
              " of vocab x d up to ", stateful::kMaxTableElements, " elements each");
}

void Subspace::materialize(int64_t d) {
  if (basis_.data().size(0) == d) return;
  TORCH_CHECK(basis_.data().size(0) == 0, "subspace: the basis was made for width ", basis_.data().size(0),
              " but the input now has width ", d);
  check_width(d);
  // Generated on the CPU in float64 for a well-conditioned QR, then stored as float32.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt_.seed);
  at::Tensor g = at::randn({d, opt_.k}, gen, at::TensorOptions().dtype(at::kDouble));
  at::Tensor u = std::get<0>(at::linalg_qr(g));  // (d, k), orthonormal columns
  const at::Device dev = basis_.device();
  basis_.set_data(u.to(dev, at::kFloat));
  if (opt_.vocab > 0) {
    at::Tensor t = at::randn({opt_.vocab, d}, gen, at::TensorOptions().dtype(at::kFloat)) * opt_.token_std;
    tokens_.set_data(t.to(dev));
  }
}

void Subspace::require_materialized(const char* where) {
  materialize_declared();
  TORCH_CHECK(basis_.data().size(0) > 0, "subspace: ", where,
              " needs the basis, whose width d is not known yet: give d=... in the spec or run a forward first");
}

at::Tensor Subspace::token_rows(const at::Tensor& token_ids, const Variable& like, const char* where) {
  TORCH_CHECK(token_ids.defined(), "subspace (vocab=", opt_.vocab, "): ", where,
              " needs the token ids of the micro-batch (CodecContext::token_ids, shaped like the activation without "
              "its last dim); none were given");
  TORCH_CHECK(token_ids.scalar_type() == at::kLong || token_ids.scalar_type() == at::kInt,
              "subspace: token ids must be int64 or int32, got ", token_ids.scalar_type());
  TORCH_CHECK(like.dim() >= 1 && token_ids.sizes().equals(like.sizes().slice(0, like.dim() - 1)), "subspace: ", where,
              ": token ids of shape ", token_ids.sizes(), " do not match the activation of shape ", like.sizes(),
              " (expected its shape without the last dim)");
  const at::Tensor& t = tokens_.data();
  at::Tensor idx = token_ids.to(t.device(), at::kLong).reshape({-1});
  at::Tensor rows = t.index_select(0, idx);  // (N, d)
  std::vector<int64_t> shape = token_ids.sizes().vec();
  shape.push_back(t.size(1));
  return rows.view(shape).to(like.device(), like.scalar_type());  // (..., d)
}

Variable Subspace::pre(const Variable& h, const CodecContext& ctx) {
  TORCH_CHECK(h.dim() >= 1, "subspace: cannot project a scalar");
  materialize(h.size(-1));
  Variable r = h;
  if (opt_.vocab > 0) r = sub(h, Variable(token_rows(ctx.token_ids, h, "pre")));  // h - T[tok]
  Variable ut(basis_.data().t().to(h.device(), h.scalar_type()));                 // (k, d)
  return linear(r, ut);                                                           // (..., k) = U^T (h - T)
}

Variable Subspace::post(const Variable& c, const CodecContext& ctx) {
  require_materialized("post");
  Variable u(basis_.data().to(c.device(), c.scalar_type()));  // (d, k)
  Variable h = linear(c, u);                                  // (..., d) = U c
  if (opt_.vocab > 0) h = add(h, Variable(token_rows(ctx.token_ids, c, "post")));
  return h;
}

Payload Subspace::encode(const at::Tensor& c, const CodecContext& ctx) {
  TORCH_CHECK(c.dim() >= 1 && c.size(-1) == opt_.k, "subspace: encode() sends the coordinates (last dim ", opt_.k,
              "), got shape ", c.sizes(), "; use subspace as a Boundary's forward codec, which projects (pre) first");
  return wire_->encode(c, ctx);
}

at::Tensor Subspace::decode(const Payload& p, const CodecContext& ctx) { return wire_->decode(p, ctx); }

Variable Subspace::add_token_embedding(const Variable& h, const at::Tensor& token_ids) {
  TORCH_CHECK(opt_.vocab > 0, "subspace: add_token_embedding needs vocab=V in the spec");
  TORCH_CHECK(h.dim() >= 1, "subspace: add_token_embedding expects (..., d) activations");
  materialize(h.size(-1));
  return add(h, Variable(token_rows(token_ids, h, "add_token_embedding")));
}

void Subspace::project_weight(const Variable& w, int64_t dim) {
  require_materialized("project_weight");
  const int64_t d = basis_.data().size(0);
  TORCH_CHECK(w.defined() && w.dim() >= 1, "subspace: project_weight needs a defined weight with >= 1 dim");
  dim = dim < 0 ? dim + w.dim() : dim;
  TORCH_CHECK(dim >= 0 && dim < w.dim() && w.size(dim) == d, "subspace: cannot project dim ", dim,
              " of a weight of shape ", w.sizes(), ": it must have size d=", d);
  NoGradGuard no_grad;
  Variable handle = w;
  at::Tensor& data = handle.mutable_data();
  at::Tensor u = basis_.data().to(data.device(), at::kFloat);  // (d, k)
  at::Tensor moved = data.transpose(0, dim);                   // d first
  at::Tensor flat = moved.reshape({d, -1}).to(at::kFloat);     // (d, n)
  at::Tensor proj = at::matmul(u, at::matmul(u.t(), flat));    // U U^T W
  moved.copy_(proj.view(moved.sizes()));                       // writes through the transpose view
}

void Subspace::project_weights(const std::vector<Variable>& weights) {
  require_materialized("project_weights");
  const int64_t d = basis_.data().size(0);
  for (const Variable& w : weights) {
    TORCH_CHECK(w.defined() && w.dim() >= 1 && w.dim() <= 2, "subspace: project_weights takes 1-D or 2-D weights");
    if (w.size(0) == d) {
      project_weight(w, 0);
    } else {
      TORCH_CHECK(w.dim() == 2 && w.size(1) == d, "subspace: weight of shape ", w.sizes(),
                  " has no dimension of size d=", d, " to project");
      project_weight(w, 1);
    }
  }
}

void Subspace::designate(const std::vector<Variable>& weights) {
  project_weights(weights);
  const int64_t d = basis_.data().size(0);
  for (const Variable& w : weights) designated_.emplace_back(w, w.size(0) == d ? 0 : 1);
}

at::Tensor Subspace::input_token_embedding(int64_t d) {
  if (opt_.vocab <= 0) return {};
  materialize(d);
  return tokens_.data();
}

void Subspace::constrain_residual_writers(const std::vector<std::pair<Variable, int64_t>>& weights) {
  for (const auto& [w, dim] : weights) {
    project_weight(w, dim);
    designated_.emplace_back(w, dim);
  }
}

void Subspace::after_optimizer_step() {
  for (auto& [w, dim] : designated_) project_weight(w, dim);
}

}  // namespace tl
