#include "compression/codecs/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include "compression/codecs/common.h"
#include "compression/codecs/lowrank_kernels.h"

namespace tl {
namespace {
constexpr const char* kPowersgdName = "powersgd";
using codec::kPlain;
using codec::kShared;

at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// (rows, cols) of the matrix view with cols = the product of shape[dim:].
std::pair<int64_t, int64_t> matrix_dims(const std::vector<int64_t>& shape, int64_t dim) {
  int64_t rows = 1, cols = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) (i < dim ? rows : cols) *= shape[i];
  return {rows, cols};
}

// The products, by the tiled CPU loops for float32 on the CPU (Note [thin products in tiles],
// lowrank_kernels.cpp), else by ATen. m (rows, cols), q (cols, r), p (rows, r).
bool thin_cpu(const at::Tensor& a, const at::Tensor& b, int64_t r) {
  return codec::use_cpu_kernel(a) && b.device().is_cpu() && a.scalar_type() == at::kFloat &&
         b.scalar_type() == at::kFloat && r >= 1 && r <= codec::kMaxThinRank;
}

at::Tensor product_mq(const at::Tensor& m, const at::Tensor& q) {  // (rows, r) = M Q
  if (!thin_cpu(m, q, q.size(1))) return m.mm(q);
  const at::Tensor mc = m.contiguous(), qc = q.contiguous();
  at::Tensor p = at::empty({m.size(0), q.size(1)}, m.options());
  codec::thin_mq_cpu(mc.data_ptr<float>(), m.size(0), m.size(1), qc.data_ptr<float>(), q.size(1), p.data_ptr<float>());
  return p;
}

// The Q of P's reduced QR (rows, r): on one thread for float32 on the CPU (Note [QR of the thin
// factor], lowrank_kernels.cpp), else at::linalg_qr.
at::Tensor orthonormal(const at::Tensor& p) {
  if (!thin_cpu(p, p, p.size(1))) return std::get<0>(at::linalg_qr(p));
  at::Tensor q = p.contiguous().clone();
  codec::thin_qr_cpu(q.data_ptr<float>(), q.size(0), q.size(1));
  return q;
}

at::Tensor product_mtp(const at::Tensor& m, const at::Tensor& p) {  // (cols, r) = M^T P
  if (!thin_cpu(m, p, p.size(1))) return m.t().mm(p);
  const at::Tensor mc = m.contiguous(), pc = p.contiguous();
  at::Tensor q = at::empty({m.size(1), p.size(1)}, m.options());
  codec::thin_mtp_cpu(mc.data_ptr<float>(), m.size(0), m.size(1), pc.data_ptr<float>(), p.size(1), q.data_ptr<float>());
  return q;
}

at::Tensor product_pqt(const at::Tensor& p, const at::Tensor& q) {  // (rows, cols) = P Q^T
  if (!thin_cpu(p, q, p.size(1))) return p.mm(q.t());
  const at::Tensor pc = p.contiguous(), qc = q.contiguous();
  at::Tensor m = at::empty({p.size(0), q.size(0)}, p.options());
  codec::thin_pqt_cpu(pc.data_ptr<float>(), p.size(0), qc.data_ptr<float>(), q.size(0), p.size(1), m.data_ptr<float>());
  return m;
}
}  // namespace

PowerSgd::PowerSgd(PowerSgdOptions o) : SectionedCodec("PowerSgd"), o_(o) {
  TORCH_CHECK(o_.rank >= 1, kPowersgdName, ": rank=", o_.rank, " is not accepted; accepted: an integer >= 1");
  q_ = register_buffer("q", at::empty({0}));
  mark_resizable("q");
}

CompressorPtr PowerSgd::from_spec(SpecArgs& args) {
  constexpr size_t kNamed = SpecArgs::kNamedOnly;
  PowerSgdOptions o;
  o.rank = args.integer(0, "rank", 4);
  if (o.rank < 1) args.fail(0, "rank", "an integer >= 1");
  o.dim = args.integer(kNamed, "dim", -1);
  o.values = codec::wire_type_from_word(args.word(kNamed, "values", codec::wire_type_words(), std::string("fp32")));
  const int64_t seed = args.integer(kNamed, "seed", 0);
  if (seed < 0) args.fail(kNamed, "seed", "an integer >= 0");
  o.seed = static_cast<uint64_t>(seed);
  return std::make_shared<PowerSgd>(o);
}

std::string PowerSgd::spec() const {
  return "powersgd(" + std::to_string(o_.rank) + ", dim=" + std::to_string(o_.dim) +
         ", values=" + codec::wire_type_word(o_.values) + ", seed=" + std::to_string(o_.seed) + ")";
}

Payload PowerSgd::encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) {
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK(o_.dim >= -ndim && o_.dim < ndim, kPowersgdName, ": dim=", o_.dim, " is out of range for a tensor of ",
              x.dim(), " dims");
  const int64_t dim = x.dim() == 0 ? 0 : (o_.dim < 0 ? o_.dim + ndim : o_.dim);
  const auto [rows, cols] = matrix_dims(x.sizes().vec(), dim);
  const int64_t r = std::max<int64_t>(0, std::min({o_.rank, rows, cols}));
  const at::ScalarType ct = compute_type(x.scalar_type());
  at::Tensor m = x.reshape({rows, cols}).to(ct);  // (rows, cols)

  at::Tensor q = q_.data();
  if (!(q.dim() == 2 && q.size(0) == cols && q.size(1) == r)) {
    // First call, or the message's width changed: a fresh seeded start.
    at::Generator gen = at::detail::createCPUGenerator(o_.seed);
    q = at::randn({cols, r}, gen, at::TensorOptions().dtype(ct));
  }
  q = q.to(m.device(), ct);
  at::Tensor p, q_new;
  if (r > 0) {
    p = orthonormal(product_mq(m, q));  // (rows, r) orthonormal columns
    q_new = product_mtp(m, p);          // (cols, r)
  } else {
    p = at::zeros({rows, 0}, m.options());
    q_new = at::zeros({cols, 0}, m.options());
  }
  // A fresh tensor, never written in place afterwards: the buffer keeps it without a copy (a copy
  // was one more parallel region a call, of cols x r floats).
  q_.set_data(q_new);
  values = {p, q_new};

  Payload out;
  out.codec = codec_id(kPowersgdName);
  out.dtype = x.scalar_type();
  out.shape = x.sizes().vec();
  out.params = {kPlain, r, rows, cols, dim, codec::wire_type_param(o_.values)};
  return out;
}

PowerSgd::Layout PowerSgd::layout(const Payload& rest) const {
  TORCH_CHECK(rest.codec != codec_id(codec()) || rest.params.empty() || rest.params[0] != kShared, kPowersgdName,
              ": this is a shared-mode (backward) payload; decode it with decode_shared and its forward payload");
  codec::check_payload(rest, kPowersgdName, 6);
  TORCH_CHECK(rest.params[0] == kPlain, kPowersgdName, ": corrupt payload: kind ", rest.params[0]);
  Layout l{rest.params[1], rest.params[2], rest.params[3], rest.params[4], at::kFloat};
  TORCH_CHECK(l.dim >= 0 && l.dim <= std::max<int64_t>(static_cast<int64_t>(rest.shape.size()) - 1, 0), kPowersgdName,
              ": corrupt payload: dim ", l.dim, " for ", rest.shape.size(), " dims");
  const auto [rows, cols] = matrix_dims(rest.shape, l.dim);
  TORCH_CHECK(l.rows == rows && l.cols == cols && l.r >= 0 && l.r <= std::min(rows, cols), kPowersgdName,
              ": corrupt payload: rank ", l.r, " and a ", l.rows, " x ", l.cols, " matrix for shape ",
              c10::IntArrayRef(rest.shape));
  l.wire = codec::wire_type_from_param(rest.params[5], kPowersgdName);
  return l;
}

std::vector<SectionedCodec::Section> PowerSgd::sections(const Payload& rest) const {
  Layout l = layout(rest);
  return {Section{{l.rows, l.r}, l.wire}, Section{{l.cols, l.r}, l.wire}};
}

at::Tensor PowerSgd::decode_parts(const Payload& rest, const std::vector<at::Tensor>& values, const CodecContext& ctx) {
  layout(rest);  // validates the header
  TORCH_CHECK(rest.body_bytes() == 0, kPowersgdName, ": corrupt payload: ", rest.body_bytes(),
              " bytes besides P and Q");
  TORCH_CHECK(values.size() == 2, kPowersgdName, ": expected sections P and Q, got ", values.size());
  const at::ScalarType ct = compute_type(rest.dtype);
  at::Tensor m = product_pqt(values[0].to(ct), values[1].to(ct));  // (rows, cols)
  return m.to(rest.dtype).view(rest.shape);
}

Payload PowerSgd::encode_shared_parts(const at::Tensor& g, const Payload& fwd_rest,
                                      const std::vector<at::Tensor>& fwd_values, const CodecContext& ctx,
                                      std::vector<at::Tensor>& values) {
  Layout l = layout(fwd_rest);
  TORCH_CHECK(g.sizes().equals(fwd_rest.shape), kPowersgdName, ": shared mode: gradient of shape ", g.sizes(),
              " for a forward payload of shape ", c10::IntArrayRef(fwd_rest.shape));
  TORCH_CHECK(fwd_values.size() == 2, kPowersgdName, ": shared mode needs the forward P and Q");
  const at::ScalarType ct = compute_type(g.scalar_type());
  at::Tensor p = fwd_values[0].to(g.device(), ct);                // (rows, r)
  values = {product_mtp(g.reshape({l.rows, l.cols}).to(ct), p)};  // (cols, r) = G^T P
  Payload out;
  out.codec = codec_id(kPowersgdName);
  out.dtype = g.scalar_type();
  out.shape = g.sizes().vec();
  out.params = {kShared, codec::wire_type_param(o_.values)};
  return out;
}

std::vector<SectionedCodec::Section> PowerSgd::shared_sections(const Payload& rest, const Payload& fwd_rest) const {
  codec::check_payload(rest, kPowersgdName, 2);
  TORCH_CHECK(rest.params[0] == kShared, kPowersgdName, ": not a shared-mode payload (kind ", rest.params[0], ")");
  const at::ScalarType wire = codec::wire_type_from_param(rest.params[1], kPowersgdName);
  Layout l = layout(fwd_rest);
  TORCH_CHECK(rest.shape == fwd_rest.shape, kPowersgdName, ": shared-mode payload of shape ",
              c10::IntArrayRef(rest.shape), " for a forward payload of shape ", c10::IntArrayRef(fwd_rest.shape));
  return {Section{{l.cols, l.r}, wire}};
}

at::Tensor PowerSgd::decode_shared_parts(const Payload& rest, const Payload& fwd_rest,
                                         const std::vector<at::Tensor>& fwd_values,
                                         const std::vector<at::Tensor>& values, const CodecContext& ctx) {
  TORCH_CHECK(rest.body_bytes() == 0, kPowersgdName, ": corrupt shared-mode payload: ", rest.body_bytes(),
              " bytes besides Q_g");
  TORCH_CHECK(fwd_values.size() == 2 && values.size() == 1, kPowersgdName, ": shared mode needs the forward P and Q_g");
  const at::ScalarType ct = compute_type(rest.dtype);
  at::Tensor m = product_pqt(fwd_values[0].to(ct), values[0].to(fwd_values[0].device(), ct));
  return m.to(rest.dtype).view(rest.shape);
}

// ---- sizing (Note [sizing a payload] in compressor.h) ------------------------------------------

SectionedCodec::SizedParts PowerSgd::size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  const int64_t ndim = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
  TORCH_CHECK(o_.dim >= -ndim && o_.dim < ndim, kPowersgdName, ": dim=", o_.dim, " is out of range for a tensor of ",
              shape.size(), " dims");
  const int64_t dim = shape.empty() ? 0 : (o_.dim < 0 ? o_.dim + ndim : o_.dim);
  const auto [rows, cols] = matrix_dims(shape, dim);
  const int64_t r = std::max<int64_t>(0, std::min({o_.rank, rows, cols}));
  SizedParts out;
  out.rest_bytes = payload_header_bytes(static_cast<int64_t>(shape.size()), 6);
  out.sections = {Section{{rows, r}, o_.values}, Section{{cols, r}, o_.values}};
  out.value_types = {compute_type(dtype), compute_type(dtype)};
  return out;
}

SectionedCodec::SizedParts PowerSgd::size_shared_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  SizedParts fwd = size_parts(shape, dtype), out;
  out.rest_bytes = payload_header_bytes(static_cast<int64_t>(shape.size()), 2);
  out.sections = {fwd.sections[1]};
  out.value_types = {compute_type(dtype)};
  return out;
}

}  // namespace tl
