#include "compression/codecs/sparse.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "compression/codecs/common.h"
#include "compression/codecs/sparse_kernels.h"
#include "compression/cuda/sparse_cuda.h"
#include "compression/cuda/topk_cuda.h"

namespace tl {
namespace {
using codec::kPlain;
using codec::kShared;
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

namespace {
// TopK's selection by the radix kernels (Note [radix top-k on a device] in
// compression/cuda/topk_logic.h), or their logic on the host under HostEmulationGuard: (rows * k)
// int64 flat indices, increasing, the same as the CPU loop's and the ATen path's.
at::Tensor radix_topk(const at::Tensor& flat, const codec::gpu::TopkShape& s) {
  at::Tensor xf = flat.to(at::kFloat).contiguous();  // (rows * D)
  const auto bytes = xf.options().dtype(at::kByte);
  at::Tensor zeroed = at::zeros({codec::gpu::topk_zeroed_bytes(s)}, bytes);
  at::Tensor rest = at::empty({codec::gpu::topk_rest_bytes(s)}, bytes);
  at::Tensor idx = at::empty({s.rows * s.k}, xf.options().dtype(at::kLong));
  if (xf.is_cuda())
    codec::gpu::topk_select_cuda(xf.get_device(), xf.data_ptr<float>(), s, zeroed.data_ptr<uint8_t>(),
                                 rest.data_ptr<uint8_t>(), idx.data_ptr<int64_t>());
  else
    codec::gpu::topk_select_host(xf.data_ptr<float>(), s, zeroed.data_ptr<uint8_t>(), rest.data_ptr<uint8_t>(),
                                 idx.data_ptr<int64_t>());
  return idx;
}
}  // namespace

void SparseCodec::select(const at::Tensor& x, int64_t rows, int64_t D, at::Tensor& idx, at::Tensor& vals, bool values) {
  const bool cpu = codec::use_cpu_kernel(x);
  at::Tensor flat = x.reshape({-1});
  at::Tensor xf = cpu ? flat.to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor mask;  // portable path: (rows * D) selection mask
  switch (o_.kind) {
    case SparseKind::kTopK: {
      const int64_t k = k_for(D);
      const codec::gpu::TopkShape shape{rows, D, k};
      if (codec::use_fused_kernel(x) && codec::gpu::topk_fits_radix(shape)) {
        idx = radix_topk(flat, shape);
        if (values) vals = flat.index_select(0, idx);
        return;
      }
      if (cpu) {
        codec::topk_select_cpu(xf.data_ptr<float>(), rows, D, k, idx, vals);
        break;
      }
      at::Tensor a = flat.to(at::kFloat).abs().reshape({rows, D});
      if (k == 0 || k == D) {
        mask = at::full({rows, D}, k == D, a.options().dtype(at::kBool));
      } else {
        // The k-th largest per row, then ties at it taken in index order (as the CPU loop does).
        // Computed unconditionally: testing for ties first would read a value back to the host.
        // The smallest of the k largest is that value; CUDA's topk selects it with many blocks
        // per row where kthvalue runs one block per row: on an H200, 0.29 ms against 1.8 ms for
        // (64, 262144) and 0.35 ms against 121 ms for one row of 16M (scope=global).
        at::Tensor t = std::get<0>(at::topk(a, k, 1, /*largest=*/true, /*sorted=*/false)).amin(1, true);  // (rows, 1)
        at::Tensor gt = a > t, eq = a == t;
        at::Tensor need = k - gt.sum(1, /*keepdim=*/true);  // (rows, 1)
        mask = gt | (eq & (eq.to(at::kLong).cumsum(1) <= need));
      }
      break;
    }
    case SparseKind::kRandK: {
      at::Tensor m = randk_mask(rows, D, k_for(D));
      if (cpu) {
        codec::mask_select_cpu(xf.data_ptr<float>(), m.data_ptr<uint8_t>(), rows * D, rows * k_for(D), idx, vals);
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
      if (values) vals = flat.index_select(0, idx);
      return;
    }
    case SparseKind::kThreshold: {
      const float t = static_cast<float>(o_.threshold);
      if (cpu) {
        codec::threshold_select_cpu(xf.data_ptr<float>(), rows * D, codec::magnitude_key(t), idx, vals);
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
    if (values) vals = flat.index_select(0, idx);
  } else {
    idx = codec::positions_of(mask, rows * k_for(D));  // exactly k per row: no read-back
    if (values) vals = flat.index_select(0, idx);
  }
}

SparseCodec::Selection SparseCodec::select_rows(const at::Tensor& x, bool values) {
  const int64_t N = x.numel();
  Selection s;
  s.rows = o_.per_sample && x.dim() >= 2 ? x.size(0) : 1;
  if (N == 0) s.rows = 1;
  const int64_t D = N / s.rows;
  select(x, s.rows, D, s.idx, s.vals, values);
  const int64_t n = s.idx.numel();
  s.k = o_.kind == SparseKind::kThreshold ? n : k_for(D);
  TORCH_CHECK(n == s.rows * s.k, codec(), ": internal error: selected ", n, " entries, expected ", s.rows * s.k);
  return s;
}

Payload SparseCodec::plain_header(const at::Tensor& x, const Selection& s, codec::IndexFormat format,
                                  int64_t index_bytes) const {
  Payload p;
  p.codec = codec_id(codec());
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  const int64_t scope = o_.per_sample ? 1 : 0, wire = codec::wire_type_param(o_.values);
  p.params = {kPlain, scope, s.rows, s.k, wire, static_cast<int64_t>(format), index_bytes};
  layout(p);  // validates
  return p;
}

Payload SparseCodec::pack_rest(const at::Tensor& x, const Selection& s, const codec::EncodedIndex& enc,
                               std::vector<at::Tensor>& values) const {
  Payload p = plain_header(x, s, enc.format, enc.bytes.numel());
  p.body = enc.bytes;
  Layout l = layout(p);
  const double f = rescale_factor(l);
  values = {(f == 1.0 ? s.vals : s.vals * f).view(l.section_shape())};
  return p;
}

Payload SparseCodec::encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) {
  Selection s = select_rows(x, /*values=*/true);
  return pack_rest(x, s, codec::encode_index(s.idx, x.numel(), o_.index), values);
}

// Note [fused sparse packing]. On a CUDA float32 tensor, the ATen path packs a selection in
// several passes: the gather of the kept values (index_select), the fp16 clamp, the cast, the
// cast of the indices (or a zeroed mask, index_fill and pack_bits for a bitmap) and the copies
// into the body; decoding runs the inverse plus a zeros and an index_put. The fused kernels
// (compression/cuda/sparse_*) write the body in one pass over the selection and decode it in one
// (two for a bitmap: its popcounts, then a cumsum, then the scatter). TopK's selection has its own
// kernels (compression/cuda/topk_*: Note [radix top-k on a device]), used by every TopK on a
// device, packed here or not, in rows that fit them (topk_fits_radix: else ATen's topk, the tie
// mask and positions_of). What stays ATen:
//   - RandK's and threshold's selection (RandK's mask is drawn on the host, threshold's nonzero);
//   - delta indices: varints make the body's size and each index's offset a prefix sum over the
//     data (and knowing the size reads it back to the host), so `index=delta` stays on the ATen
//     path; auto never picks delta on a device (pick_index_format);
//   - RandK with rescale=true (values times D/k: the ATen product is kept), other dtypes than
//     float32, shared (backward) mode and compositions (`topk | quant`: the values go to quant);
//   - decoding bytes that must be checked first: received from another process, or with their
//     host copy (decode_index checks them and names the corruption; the kernels only stay in
//     bounds). Under HostEmulationGuard (CPU tests) the checks run first, then the kernels' logic.
// Payload bytes are the ATen path's and the CPU path's, bit for bit (tests/compression/
// sparse_cuda_test.cpp).
namespace {
codec::gpu::SparseLayout kernel_layout(int64_t n, int64_t universe, codec::IndexFormat f, int64_t index_bytes,
                                       at::ScalarType wire) {
  return {n,
          universe,
          f == codec::IndexFormat::kBitmap,
          static_cast<int>(codec::index_int_width(universe)),
          index_bytes,
          codec::kernel_wire_type(wire)};
}
}  // namespace

bool SparseCodec::fused_encode(const at::Tensor& x) const {
  return x.scalar_type() == at::kFloat && codec::use_fused_kernel(x) && o_.index != codec::IndexFormat::kDelta &&
         !(o_.kind == SparseKind::kRandK && o_.rescale);
}

Payload SparseCodec::encode(const at::Tensor& x, const CodecContext& ctx) {
  if (!fused_encode(x)) return SectionedCodec::encode(x, ctx);
  codec::check_input(x, codec());
  const int64_t N = x.numel();
  Selection s = select_rows(x, /*values=*/x.device().is_cpu());
  const codec::IndexFormat f = codec::pick_index_format(s.idx, N, o_.index);
  if (f == codec::IndexFormat::kDelta) {  // auto on the host only (host emulation): the CPU path's bytes
    std::vector<at::Tensor> values;
    Payload rest = pack_rest(x, s, codec::encode_index(s.idx, N, f), values);
    return join_parts(std::move(rest), values);
  }
  const int64_t n = s.idx.numel();
  const int64_t index_bytes =
      f == codec::IndexFormat::kBitmap ? codec::index_bitmap_bytes(N) : codec::index_int_bytes(n, N);
  const codec::gpu::SparseLayout kl = kernel_layout(n, N, f, index_bytes, o_.values);
  at::Tensor xf = x.contiguous(), idx = s.idx.contiguous();  // (N) float32, (n) int64
  at::Tensor body = at::empty({index_bytes + n * codec::gpu::wire_size(kl.wire)}, x.options().dtype(at::kByte));
  if (x.is_cuda())
    codec::gpu::sparse_pack_cuda(x.get_device(), xf.data_ptr<float>(), idx.data_ptr<int64_t>(), kl,
                                 body.data_ptr<uint8_t>());
  else
    codec::gpu::sparse_pack_host(xf.data_ptr<float>(), idx.data_ptr<int64_t>(), kl, body.data_ptr<uint8_t>());
  Payload p = plain_header(x, s, f, index_bytes);
  p.body = body;
  return p;
}

std::vector<SectionedCodec::Section> SparseCodec::sections(const Payload& rest) const {
  Layout l = layout(rest);
  return {Section{l.section_shape(), l.wire}};
}

namespace {
at::Tensor scatter(const Payload& shape_of, int64_t numel, const at::Tensor& idx, const at::Tensor& values) {
  const auto vt = values.scalar_type();
  if (shape_of.dtype == at::kFloat && codec::use_cpu_kernel(values) && idx.device().is_cpu() &&
      (vt == at::kFloat || vt == at::kHalf || vt == at::kBFloat16)) {
    at::Tensor out = at::empty({numel}, values.options().dtype(at::kFloat));  // every element written
    const at::Tensor i = idx.contiguous(), v = values.reshape({-1}).contiguous();
    // Unsorted int indices (a corrupt payload) take the ATen path below.
    if (codec::scatter_sorted_cpu(i.data_ptr<int64_t>(), v, numel, out.data_ptr<float>()))
      return out.view(shape_of.shape);
  }
  at::Tensor out = at::zeros({numel}, values.options().dtype(shape_of.dtype));
  if (idx.numel() > 0) out.index_put_({idx.to(values.device())}, values.reshape({-1}).to(shape_of.dtype));
  return out.view(shape_of.shape);
}
using codec::body_or_empty;
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

bool SparseCodec::fused_decode(const Payload& p) const {
  if (p.dtype != at::kFloat || !p.body.defined() || !codec::use_fused_kernel(p.body)) return false;
  // Anything unusual takes the ATen path, which names what is wrong with it.
  if (p.codec != codec_id(codec()) || p.params.size() != 7 || p.params[0] != kPlain) return false;
  const int64_t format = p.params[5];
  if (format != int64_t(codec::IndexFormat::kInt) && format != int64_t(codec::IndexFormat::kBitmap)) return false;
  // Device bytes that decode_index would check first (Note [fused sparse packing]).
  return p.body.device().is_cpu() || (!p.from_wire && !p.host_body.defined());
}

at::Tensor SparseCodec::decode(const Payload& p, const CodecContext& ctx) {
  if (!fused_decode(p)) return SectionedCodec::decode(p, ctx);
  Layout l = layout(p);
  const int64_t n = l.rows * l.k;
  const int64_t want = l.index_bytes + n * static_cast<int64_t>(c10::elementSize(l.wire));
  TORCH_CHECK(static_cast<int64_t>(p.body_bytes()) == want, codec(), ": corrupt payload: body of ", p.body_bytes(),
              " bytes, its header announces ", want);
  at::Tensor body = p.body.contiguous();  // (want) uint8
  // Host emulation: the ATen path's checks of the index first.
  if (body.device().is_cpu())
    codec::decode_index(l.format, body.narrow(0, 0, l.index_bytes), n, l.numel, codec(), source_of(p));
  const codec::gpu::SparseLayout kl = kernel_layout(n, l.numel, l.format, l.index_bytes, l.wire);
  at::Tensor out = kl.bitmap ? at::empty({l.numel}, body.options().dtype(at::kFloat))  // (N) every one written
                             : at::zeros({l.numel}, body.options().dtype(at::kFloat));
  // (bitmap chunks) set bits, then their prefix sums (Note [bitmap ranks by chunks], sparse_logic.h)
  const int64_t chunks = kl.bitmap ? codec::gpu::bitmap_chunks(l.index_bytes) : 0;
  at::Tensor ranks = at::empty({chunks}, body.options().dtype(at::kLong));
  const uint8_t* in = body.data_ptr<uint8_t>();
  if (body.is_cuda()) {
    const int device = body.get_device();
    if (kl.bitmap) codec::gpu::bitmap_counts_cuda(device, in, l.index_bytes, ranks.data_ptr<int64_t>());
    ranks = ranks.cumsum(0);  // inclusive ranks
    codec::gpu::sparse_unpack_cuda(device, in, ranks.data_ptr<int64_t>(), kl, out.data_ptr<float>());
  } else {
    if (kl.bitmap) codec::gpu::bitmap_counts_host(in, l.index_bytes, ranks.data_ptr<int64_t>());
    ranks = ranks.cumsum(0);
    codec::gpu::sparse_unpack_host(in, ranks.data_ptr<int64_t>(), kl, out.data_ptr<float>());
  }
  return out.view(p.shape);
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

// ---- sizing (Note [sizing a payload] in compressor.h) ------------------------------------------

namespace {
int64_t varint_bytes(uint64_t v) {
  int64_t n = 1;
  for (; v >= 0x80; v >>= 7) ++n;
  return n;
}
}  // namespace

SectionedCodec::SizedParts SparseCodec::size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  const int64_t N = codec::shape_numel(shape);
  const int64_t rows = N == 0 ? 1 : (o_.per_sample && shape.size() >= 2 ? shape[0] : 1);
  const int64_t D = N / rows;
  SizedParts out;
  const bool threshold = o_.kind == SparseKind::kThreshold;
  const int64_t n = threshold ? N : rows * k_for(D);  // threshold: as many as pass, at most all
  if (threshold) out.kind = PayloadSize::Kind::WorstCase;
  int64_t index = 0;
  if (o_.index == codec::IndexFormat::kInt) {
    index = codec::index_int_bytes(n, N);
  } else if (o_.index == codec::IndexFormat::kBitmap) {
    index = codec::index_bitmap_bytes(N);
  } else if (o_.index == codec::IndexFormat::kDelta) {  // every gap is at most N - n
    index = n * varint_bytes(static_cast<uint64_t>(std::max<int64_t>(N - n, 0)));
    out.kind = PayloadSize::Kind::WorstCase;
  } else {  // auto: int or bitmap (ties: int), or delta where it is cheaper on the host
    index = std::min(codec::index_int_bytes(n, N), codec::index_bitmap_bytes(N));
    out.kind = PayloadSize::Kind::WorstCase;
  }
  out.rest_bytes = payload_header_bytes(static_cast<int64_t>(shape.size()), 7) + index;
  out.sections = {Section{o_.per_sample ? std::vector<int64_t>{rows, n / rows} : std::vector<int64_t>{n}, o_.values}};
  out.value_types = {dtype};
  return out;
}

SectionedCodec::SizedParts SparseCodec::size_shared_parts(const std::vector<int64_t>& shape,
                                                          at::ScalarType dtype) const {
  const SizedParts fwd = size_parts(shape, dtype);  // the gradient travels at the forward's n entries
  SizedParts out;
  out.kind = o_.kind == SparseKind::kThreshold ? PayloadSize::Kind::WorstCase : PayloadSize::Kind::Exact;
  out.rest_bytes = payload_header_bytes(static_cast<int64_t>(shape.size()), 2);
  out.sections = {Section{{fwd.sections[0].numel()}, o_.values}};
  out.value_types = {dtype};
  return out;
}

}  // namespace tl
