#include "compression/codecs/sparse.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "compression/codecs/common.h"
#include "compression/codecs/sparse_kernels.h"

namespace tl {
namespace {
constexpr int64_t kPlain = 0, kShared = 1;
}

SparseCodec::SparseCodec(SparseOptions o) : SectionedCodec("SparseCodec"), o_(std::move(o)) {
  if (o_.kind == SparseKind::kRandK)
    generator_ = BufferedGenerator(at::detail::createCPUGenerator(o_.seed), *this, "generator");
  if (o_.kind == SparseKind::kThreshold) o_.per_sample = false;
}

const char* SparseCodec::codec() const {
  switch (o_.kind) {
    case SparseKind::kTopK:
      return "topk";
    case SparseKind::kRandK:
      return "randk";
    case SparseKind::kThreshold:
      return "threshold";
  }
  return "?";
}

CompressorPtr SparseCodec::from_spec(SparseKind kind, SpecArgs& args) {
  SparseOptions o;
  o.kind = kind;
  if (kind == SparseKind::kThreshold) {
    o.threshold = args.number(0, "t");
    if (!(o.threshold >= 0)) args.fail(0, "t", "a magnitude >= 0 (entries with |x| > t are kept)");
  } else {
    const SpecValue* raw = args.peek(0, "k");
    const double k = args.number(0, "k");
    const bool fraction = raw && (raw->text.find_first_of(".eE") != std::string::npos || k < 1);
    const char* accepted = "a fraction in (0, 1] written with a '.' (0.1, 1.0), or a count >= 1 (100)";
    if (fraction) {
      if (!(k > 0 && k <= 1)) args.fail(0, "k", accepted);
      o.fraction = k;
    } else {
      if (!(k >= 1 && std::floor(k) == k && k < 9e15)) args.fail(0, "k", accepted);
      o.count = static_cast<int64_t>(k);
    }
    o.per_sample = args.word(SpecArgs::kNamedOnly, "scope", {"sample", "global"}, "sample") == "sample";
  }
  o.values = codec::wire_type_from_word(args.word(SpecArgs::kNamedOnly, "values", codec::wire_type_words(), "fp16"));
  o.index = codec::index_format_from_word(
      args.word(SpecArgs::kNamedOnly, "index", {"auto", "int32", "delta", "bitmap"}, "auto"));
  if (kind == SparseKind::kRandK) {
    o.rescale = args.word(SpecArgs::kNamedOnly, "rescale", {"true", "false"}, "false") == "true";
    const int64_t seed = args.integer(SpecArgs::kNamedOnly, "seed", 0);
    if (seed < 0) args.fail(SpecArgs::kNamedOnly, "seed", "an integer >= 0");
    o.seed = static_cast<uint64_t>(seed);
  }
  return std::make_shared<SparseCodec>(o);
}

std::string SparseCodec::spec() const {
  std::string s = std::string(codec()) + "(";
  if (o_.kind == SparseKind::kThreshold)
    s += codec::format_number(o_.threshold);
  else
    s += (o_.fraction > 0 ? codec::format_number(o_.fraction, true) : std::to_string(o_.count)) +
         ", scope=" + (o_.per_sample ? "sample" : "global");
  s += ", values=" + codec::wire_type_word(o_.values) + ", index=" + codec::index_format_word(o_.index);
  if (o_.kind == SparseKind::kRandK)
    s += std::string(", rescale=") + (o_.rescale ? "true" : "false") + ", seed=" + std::to_string(o_.seed);
  return s + ")";
}

int64_t SparseCodec::k_for(int64_t D) const {
  if (o_.fraction > 0) {
    if (D == 0) return 0;
    return std::min<int64_t>(D, std::max<int64_t>(1, std::llround(o_.fraction * static_cast<double>(D))));
  }
  TORCH_CHECK(o_.count <= D, codec(), ": k=", o_.count, " exceeds the ", D, " elements ",
              o_.per_sample ? "per row (scope=sample: one row per index of dim 0)" : "of the tensor");
  return o_.count;
}

std::vector<int64_t> SparseCodec::Layout::section_shape() const {
  return per_sample ? std::vector<int64_t>{rows, k} : std::vector<int64_t>{rows * k};
}

SparseCodec::Layout SparseCodec::layout(const Payload& rest) const {
  const char* name = codec();
  TORCH_CHECK(rest.codec != codec_id(codec()) || rest.params.empty() || rest.params[0] != kShared, name,
              ": this is a shared-mode (backward) payload; decode it with decode_shared and its forward payload");
  codec::check_payload(rest, name, 7);
  TORCH_CHECK(rest.params[0] == kPlain, name, ": corrupt payload: kind ", rest.params[0]);
  Layout l;
  TORCH_CHECK(rest.params[1] == 0 || rest.params[1] == 1, name, ": corrupt payload: scope ", rest.params[1]);
  l.per_sample = rest.params[1] == 1;
  l.rows = rest.params[2];
  l.k = rest.params[3];
  l.numel = rest.numel();
  TORCH_CHECK(l.rows >= 1 && l.numel % l.rows == 0 && (l.per_sample || l.rows == 1), name,
              ": corrupt payload: ", l.rows, " rows for ", l.numel, " elements");
  TORCH_CHECK(l.k >= 0 && l.k <= l.numel / l.rows, name, ": corrupt payload: k=", l.k, " for rows of ",
              l.numel / l.rows);
  l.wire = codec::wire_type_from_param(rest.params[4], name);
  l.format = codec::index_format_from_param(rest.params[5], name);
  l.index_bytes = rest.params[6];
  const int64_t n = l.rows * l.k;
  codec::check_index_bytes(l.format, l.index_bytes, n, l.numel, name);
  return l;
}

double SparseCodec::rescale_factor(const Layout& l) const {
  if (o_.kind != SparseKind::kRandK || !o_.rescale || l.k == 0) return 1.0;
  return static_cast<double>(l.numel / l.rows) / static_cast<double>(l.k);
}

// Drawn on the host from the codec's own CPU generator, whatever the tensor's device: the draws do
// not depend on the data, so nothing is read back from a device.
at::Tensor SparseCodec::randk_mask(int64_t rows, int64_t D, int64_t k) {
  at::Generator& gen = generator_.get();
  at::Tensor mask = at::empty({rows * D}, at::kByte);
  codec::randk_mask_cpu(gen.get<at::CPUGeneratorImpl>(), rows, D, k, mask.data_ptr<uint8_t>());  // locks gen
  generator_.commit();
  return mask;
}

void SparseCodec::select(const at::Tensor& x, int64_t rows, int64_t D, at::Tensor& idx, at::Tensor& vals) {
  const bool cpu = codec::use_cpu_kernel(x);
  at::Tensor flat = x.reshape({-1});
  at::Tensor xf = cpu ? flat.to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor mask;  // portable path: (rows * D) selection mask
  switch (o_.kind) {
    case SparseKind::kTopK: {
      const int64_t k = k_for(D);
      if (cpu) {
        auto cuts = codec::topk_cuts_cpu(xf.data_ptr<float>(), rows, D, k);
        codec::emit_cuts_cpu(xf.data_ptr<float>(), rows, D, cuts, k, idx, vals);
        break;
      }
      at::Tensor a = flat.to(at::kFloat).abs().reshape({rows, D});
      if (k == 0 || k == D) {
        mask = at::full({rows, D}, k == D, a.options().dtype(at::kBool));
      } else {
        // The k-th largest per row, then ties at it taken in index order (as the CPU loop does).
        // Computed unconditionally: testing for ties first would read a value back to the host.
        at::Tensor t = std::get<0>(at::kthvalue(a, D - k + 1, 1, /*keepdim=*/true));  // (rows, 1)
        at::Tensor gt = a > t, eq = a == t;
        at::Tensor need = k - gt.sum(1, /*keepdim=*/true);  // (rows, 1)
        mask = gt | (eq & (eq.to(at::kLong).cumsum(1) <= need));
      }
      break;
    }
    case SparseKind::kRandK: {
      at::Tensor m = randk_mask(rows, D, k_for(D));
      if (cpu) {
        codec::emit_mask_cpu(xf.data_ptr<float>(), m.data_ptr<uint8_t>(), rows, D, k_for(D), idx, vals);
        break;
      }
      // The positions are known on the host already: list them there and upload them.
      const int64_t n = rows * k_for(D);
      at::Tensor host_idx = at::empty({n}, at::kLong);
      const uint8_t* mp = m.data_ptr<uint8_t>();
      int64_t* ip = host_idx.data_ptr<int64_t>();
      for (int64_t i = 0, o = 0; i < rows * D && o < n; ++i)
        if (mp[i]) ip[o++] = i;
      idx = (x.device().is_cpu() ? host_idx : host_idx.pin_memory()).to(x.device(), /*non_blocking=*/true);
      vals = flat.index_select(0, idx);
      return;
    }
    case SparseKind::kThreshold: {
      const float t = static_cast<float>(o_.threshold);
      if (cpu) {
        codec::emit_cuts_cpu(xf.data_ptr<float>(), 1, rows * D, {codec::RowCut{codec::magnitude_key(t), 0}}, -1, idx,
                             vals);
        break;
      }
      mask = flat.to(at::kFloat).abs() > t;
      break;
    }
  }
  if (cpu) {
    vals = vals.to(x.scalar_type());
  } else if (o_.kind == SparseKind::kThreshold) {
    // How many entries pass the threshold depends on the data: this nonzero is the one host
    // synchronisation of threshold's device path (Note [host synchronisation], payload.cpp).
    idx = at::nonzero(mask.reshape({-1})).view(-1);
    vals = flat.index_select(0, idx);
  } else {
    idx = codec::positions_of(mask, rows * k_for(D));  // exactly k per row: no read-back
    vals = flat.index_select(0, idx);
  }
}

Payload SparseCodec::encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) {
  const int64_t N = x.numel();
  int64_t rows = o_.per_sample && x.dim() >= 2 ? x.size(0) : 1;
  if (N == 0) rows = 1;
  const int64_t D = N / rows;
  at::Tensor idx, vals;
  select(x, rows, D, idx, vals);
  const int64_t n = idx.numel();
  const int64_t k = o_.kind == SparseKind::kThreshold ? n : k_for(D);
  TORCH_CHECK(n == rows * k, codec(), ": internal error: selected ", n, " entries, expected ", rows * k);
  codec::EncodedIndex enc = codec::encode_index(idx, N, o_.index);
  Payload p;
  p.codec = codec_id(codec());
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  p.params = {kPlain,
              o_.per_sample ? 1 : 0,
              rows,
              k,
              codec::wire_type_param(o_.values),
              static_cast<int64_t>(enc.format),
              enc.bytes.numel()};
  p.body = enc.bytes;
  Layout l = layout(p);
  const double f = rescale_factor(l);
  values = {(f == 1.0 ? vals : vals * f).view(l.section_shape())};
  return p;
}

std::vector<SectionedCodec::Section> SparseCodec::sections(const Payload& rest) const {
  Layout l = layout(rest);
  return {Section{l.section_shape(), l.wire}};
}

namespace {
at::Tensor scatter(const Payload& shape_of, int64_t numel, const at::Tensor& idx, const at::Tensor& values) {
  at::Tensor out = at::zeros({numel}, values.options().dtype(shape_of.dtype));
  if (idx.numel() > 0) out.index_put_({idx.to(values.device())}, values.reshape({-1}).to(shape_of.dtype));
  return out.view(shape_of.shape);
}
at::Tensor body_or_empty(const Payload& p) { return p.body.defined() ? p.body : at::empty({0}, at::kByte); }
codec::IndexSource source_of(const Payload& p) { return codec::IndexSource{p.host_body, p.from_wire}; }
}  // namespace

at::Tensor SparseCodec::decode_parts(const Payload& rest, const std::vector<at::Tensor>& values,
                                     const CodecContext& ctx) {
  Layout l = layout(rest);
  TORCH_CHECK(static_cast<int64_t>(rest.body_bytes()) == l.index_bytes, codec(), ": corrupt payload: the index takes ",
              rest.body_bytes(), " bytes, the header announces ", l.index_bytes);
  TORCH_CHECK(values.size() == 1, codec(), ": expected one value section, got ", values.size());
  at::Tensor idx = codec::decode_index(l.format, body_or_empty(rest), l.rows * l.k, l.numel, codec(), source_of(rest));
  return scatter(rest, l.numel, idx, values[0]);
}

Payload SparseCodec::encode_shared_parts(const at::Tensor& g, const Payload& fwd_rest,
                                         const std::vector<at::Tensor>& fwd_values, const CodecContext& ctx,
                                         std::vector<at::Tensor>& values) {
  Layout l = layout(fwd_rest);
  TORCH_CHECK(g.sizes().equals(fwd_rest.shape), codec(), ": shared mode: gradient of shape ", g.sizes(),
              " for a forward payload of shape ", c10::IntArrayRef(fwd_rest.shape));
  at::Tensor idx =
      codec::decode_index(l.format, body_or_empty(fwd_rest), l.rows * l.k, l.numel, codec(), source_of(fwd_rest));
  at::Tensor vals = g.reshape({-1}).index_select(0, idx.to(g.device()));
  const double f = rescale_factor(l);
  values = {(f == 1.0 ? vals : vals * f).view(l.section_shape())};
  Payload p;
  p.codec = codec_id(codec());
  p.dtype = g.scalar_type();
  p.shape = g.sizes().vec();
  p.params = {kShared, codec::wire_type_param(o_.values)};
  return p;
}

std::vector<SectionedCodec::Section> SparseCodec::shared_sections(const Payload& rest, const Payload& fwd_rest) const {
  codec::check_payload(rest, codec(), 2);
  TORCH_CHECK(rest.params[0] == kShared, codec(), ": not a shared-mode payload (kind ", rest.params[0], ")");
  const at::ScalarType wire = codec::wire_type_from_param(rest.params[1], codec());
  Layout l = layout(fwd_rest);
  TORCH_CHECK(rest.shape == fwd_rest.shape, codec(), ": shared-mode payload of shape ", c10::IntArrayRef(rest.shape),
              " for a forward payload of shape ", c10::IntArrayRef(fwd_rest.shape));
  return {Section{l.section_shape(), wire}};
}

at::Tensor SparseCodec::decode_shared_parts(const Payload& rest, const Payload& fwd_rest,
                                            const std::vector<at::Tensor>& fwd_values,
                                            const std::vector<at::Tensor>& values, const CodecContext& ctx) {
  TORCH_CHECK(rest.body_bytes() == 0, codec(), ": corrupt shared-mode payload: ", rest.body_bytes(),
              " bytes besides the values");
  TORCH_CHECK(values.size() == 1, codec(), ": expected one value section, got ", values.size());
  Layout l = layout(fwd_rest);
  at::Tensor idx =
      codec::decode_index(l.format, body_or_empty(fwd_rest), l.rows * l.k, l.numel, codec(), source_of(fwd_rest));
  return scatter(rest, l.numel, idx, values[0]);
}

}  // namespace tl
