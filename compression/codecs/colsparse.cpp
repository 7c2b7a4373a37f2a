#include "compression/codecs/colsparse.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "compression/codecs/common.h"
#include "compression/codecs/inline_parallel.h"
#include "compression/codecs/sparse_kernels.h"

namespace tl {
namespace {

constexpr const char* kColsparseName = "colsparse";
using codec::kPlain;
using codec::kShared;

// (tokens, hidden) view of a shape: the last dim is hidden; 0-D and 1-D tensors are one token.
void token_view(const std::vector<int64_t>& shape, int64_t& tokens, int64_t& hidden) {
  const int64_t n = codec::shape_numel(shape);
  hidden = shape.size() >= 2 ? shape.back() : n;
  tokens = shape.size() >= 2 ? (hidden > 0 ? n / hidden : 0) : 1;
}

// The block of each token: (tokens) int64, t / block.
at::Tensor token_blocks(int64_t tokens, int64_t block, const at::Device& device) {
  return at::div(at::arange(tokens, at::TensorOptions().dtype(at::kLong).device(device)), block, "floor");
}

// Output of shape `like` holding values (tokens, k) at the channels of each token's block
// (blocks, k), zeros elsewhere.
at::Tensor scatter_channels(const Payload& like, int64_t tokens, int64_t hidden, int64_t block,
                            const at::Tensor& channels, const at::Tensor& values) {
  const auto vt = values.scalar_type();
  if (like.dtype == at::kFloat && codec::use_cpu_kernel(values) && channels.device().is_cpu() &&
      (vt == at::kFloat || vt == at::kHalf || vt == at::kBFloat16)) {
    at::Tensor out = at::empty({tokens, hidden}, values.options().dtype(at::kFloat));  // every element written
    const at::Tensor c = channels.contiguous(), v = values.reshape({tokens, channels.size(1)}).contiguous();  // (T, k)
    // Channels that are not increasing (possible only where the index was not checked) take ATen's scatter.
    if (codec::scatter_rows_cpu(c.data_ptr<int64_t>(), v, tokens, hidden, out.data_ptr<float>(), block))
      return out.view(like.shape);
  }
  at::Tensor out = at::zeros({tokens, hidden}, values.options().dtype(like.dtype));
  const at::Tensor per_token = channels.index_select(0, token_blocks(tokens, block, channels.device()));  // (T, k)
  if (per_token.numel() > 0)
    out.scatter_(1, per_token.to(values.device()), values.reshape({tokens, -1}).to(like.dtype));
  return out.view(like.shape);
}

using codec::body_or_empty;

// (blocks, k): the k channels of largest norm in each block, ascending; norms (blocks, H).
at::Tensor top_channels(const at::Tensor& norms, int64_t k) {
  return std::get<0>(at::sort(std::get<1>(at::topk(norms, k, 1, /*largest=*/true, /*sorted=*/false)), 1));
}

// (blocks * k): channels (blocks, k) as flat indices b * hidden + c into (blocks, H).
at::Tensor flat_channels(const at::Tensor& channels, int64_t hidden) {
  return (channels + at::arange(channels.size(0), channels.options()).unsqueeze(1) * hidden).reshape({-1});
}

}  // namespace

ColumnSparse::ColumnSparse(ColumnSparseOptions o) : SectionedCodec("ColumnSparse"), o_(std::move(o)) {
  TORCH_CHECK(o_.block >= 1, kColsparseName, ": block=", o_.block,
              " is not accepted; accepted: an integer >= 1 (tokens)");
  TORCH_CHECK(o_.fraction > 0 ? o_.fraction <= 1 : o_.count >= 1, kColsparseName,
              ": k must be a fraction in (0, 1] or a ", "count >= 1");
}

CompressorPtr ColumnSparse::from_spec(SpecArgs& args) {
  constexpr size_t kNamed = SpecArgs::kNamedOnly;
  ColumnSparseOptions o;
  const SpecValue* raw = args.peek(0, "k");
  const double k = args.number(0, "k", 0.1);
  const bool fraction = !raw || raw->text.find_first_of(".eE") != std::string::npos || k < 1;
  const char* accepted = "a fraction of hidden in (0, 1] written with a '.' (0.1, 1.0), or a channel count >= 1 (64)";
  if (fraction) {
    if (!(k > 0 && k <= 1)) args.fail(0, "k", accepted);
    o.fraction = k;
  } else {
    if (!(k >= 1 && std::floor(k) == k && k < 9e15)) args.fail(0, "k", accepted);
    o.fraction = 0;
    o.count = static_cast<int64_t>(k);
  }
  o.block = args.integer(kNamed, "block", 32);
  if (o.block < 1) args.fail(kNamed, "block", "an integer >= 1 (tokens per block)");
  o.values = codec::wire_type_from_word(args.word(kNamed, "values", codec::wire_type_words(), "fp16"));
  o.index = codec::index_format_from_word(args.word(kNamed, "index", {"auto", "int32", "delta", "bitmap"}, "auto"));
  return std::make_shared<ColumnSparse>(o);
}

std::string ColumnSparse::spec() const {
  return std::string(kColsparseName) + "(" +
         (o_.fraction > 0 ? codec::format_number(o_.fraction, true) : std::to_string(o_.count)) +
         ", block=" + std::to_string(o_.block) + ", values=" + codec::wire_type_word(o_.values) +
         ", index=" + codec::index_format_word(o_.index) + ")";
}

int64_t ColumnSparse::k_for(int64_t H) const {
  if (H == 0) return 0;
  if (o_.fraction > 0) {
    const double k = std::ceil(o_.fraction * static_cast<double>(H) - 1e-9);
    return std::min<int64_t>(H, std::max<int64_t>(1, static_cast<int64_t>(k)));
  }
  TORCH_CHECK(o_.count <= H, kColsparseName, ": k=", o_.count, " exceeds the ", H, " hidden channels (the last dim)");
  return o_.count;
}

ColumnSparse::Layout ColumnSparse::layout(const Payload& rest) const {
  TORCH_CHECK(rest.codec != codec_id(kColsparseName) || rest.params.empty() || rest.params[0] != kShared,
              kColsparseName,
              ": this is a shared-mode (backward) payload; decode it with decode_shared and its forward payload");
  codec::check_payload(rest, kColsparseName, 6);
  TORCH_CHECK(rest.params[0] == kPlain, kColsparseName, ": corrupt payload: kind ", rest.params[0]);
  Layout l;
  token_view(rest.shape, l.tokens, l.hidden);
  l.block = rest.params[1];
  l.k = rest.params[2];
  TORCH_CHECK(l.block >= 1, kColsparseName, ": corrupt payload: block=", l.block);
  TORCH_CHECK(l.k >= 0 && l.k <= l.hidden && (l.k > 0 || l.hidden == 0 || l.tokens == 0), kColsparseName,
              ": corrupt payload: k=", l.k, " for ", l.hidden, " hidden channels");
  l.blocks = l.tokens == 0 ? 0 : (l.tokens - 1) / l.block + 1;
  l.wire = codec::wire_type_from_param(rest.params[3], kColsparseName);
  l.format = codec::index_format_from_param(rest.params[4], kColsparseName);
  l.index_bytes = rest.params[5];
  codec::check_index_bytes(l.format, l.index_bytes, l.blocks * l.k, l.blocks * l.hidden, kColsparseName);
  return l;
}

Payload ColumnSparse::encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) {
  codec::check_input(x, kColsparseName);
  int64_t tokens, hidden;
  token_view(x.sizes().vec(), tokens, hidden);
  const int64_t k = k_for(hidden);
  const int64_t blocks = tokens == 0 ? 0 : (tokens - 1) / o_.block + 1;
  at::Tensor xt = x.reshape({tokens, hidden});  // (T, H)
  if (codec::use_cpu_kernel(x) && x.scalar_type() == at::kFloat && blocks * k > 0) return encode_cpu(x, values);
  at::Tensor channels;  // (blocks, k) kept channels, ascending
  if (blocks * k == 0) {
    channels = at::empty({blocks, k}, x.options().dtype(at::kLong));
  } else {
    channels = top_channels(block_norms(xt), k);
  }
  at::Tensor flat = flat_channels(channels, hidden);
  codec::EncodedIndex enc = codec::encode_index(flat, blocks * hidden, o_.index);

  Payload p = header(x, k, enc);
  at::Tensor per_token = channels.index_select(0, token_blocks(tokens, o_.block, x.device()));  // (T, k)
  values = {xt.gather(1, per_token)};
  return p;
}

// The CPU path of encode_parts for float32 (Note [two paths]): the norms as the ATen path makes
// them (at::sum's order of additions, which a loop of ours would not match bit for bit: it depends
// on the column's place in ATen's vector groups), the k largest of each block's by TopK's selection
// (the flat indices come out ascending, as the index wants them), the values gathered with each
// token's block's channels: no (T, k) index tensor, and no at::topk, sort and index_select. A block
// whose k-th largest norm ties with one left out (zero channels), or a NaN norm, takes at::topk as
// the ATen path does, for the same choice.
Payload ColumnSparse::encode_cpu(const at::Tensor& x, std::vector<at::Tensor>& values) {
  int64_t tokens, hidden;
  token_view(x.sizes().vec(), tokens, hidden);
  const int64_t k = k_for(hidden);
  const int64_t blocks = (tokens - 1) / o_.block + 1;
  const at::Tensor xc = x.contiguous();                             // (T, H)
  const at::Tensor norms = block_norms(xc.view({tokens, hidden}));  // (blocks, H)
  at::Tensor flat, kept;  // (blocks * k) ascending flat indices into (blocks, H), their norms
  bool ambiguous = false;
  codec::topk_select_cpu(norms.data_ptr<float>(), blocks, hidden, k, flat, kept, &ambiguous);
  const float* kp = kept.data_ptr<float>();
  for (int64_t i = 0; i < blocks * k && !ambiguous; ++i) ambiguous = kp[i] != kp[i];  // a NaN is always kept
  if (ambiguous) flat = flat_channels(top_channels(norms, k), hidden);
  at::Tensor channels = at::empty({blocks, k}, flat.options());  // (blocks, k)
  const int64_t* fp = flat.data_ptr<int64_t>();
  int64_t* cp = channels.data_ptr<int64_t>();
  for (int64_t i = 0; i < blocks * k; ++i) cp[i] = fp[i] - i / k * hidden;
  codec::EncodedIndex enc = codec::encode_index(flat, blocks * hidden, o_.index);
  at::Tensor v = at::empty({tokens, k}, x.options());  // (T, k)
  codec::gather_rows_cpu(xc.data_ptr<float>(), tokens, hidden, cp, k, v.data_ptr<float>(), o_.block);
  values = {v};
  return header(x, k, enc);
}

// Squared L2 norm of each channel over each block of tokens, (blocks, H), of xt (T, H); the short
// last block is padded with zero tokens, which add nothing. A block longer than the message is one
// block of all its tokens, not padded to `block` (block=444444444408 asked for terabytes: the spec
// fuzzer).
at::Tensor ColumnSparse::block_norms(const at::Tensor& xt) const {
  const int64_t tokens = xt.size(0), hidden = xt.size(1);
  const int64_t blocks = (tokens - 1) / o_.block + 1, span = std::min(o_.block, tokens);
  // ATen's ops on the calling thread below two codec tasks (Note [ATen's ops on the calling thread])
  codec::SerialScope serial(xt.numel() * int64_t(sizeof(float)) < 2 * codec::task_bytes());
  at::Tensor sq = xt.to(at::kFloat).square();
  const int64_t pad = blocks * span - tokens;
  if (pad > 0) sq = at::constant_pad_nd(sq, {0, 0, 0, pad}, 0);
  return sq.view({blocks, span, hidden}).sum(1);
}

Payload ColumnSparse::header(const at::Tensor& x, int64_t k, const codec::EncodedIndex& enc) const {
  Payload p;
  p.codec = codec_id(kColsparseName);
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  p.params = {kPlain,           o_.block, k, codec::wire_type_param(o_.values), static_cast<int64_t>(enc.format),
              enc.bytes.numel()};
  p.body = enc.bytes;
  return p;
}

std::vector<SectionedCodec::Section> ColumnSparse::sections(const Payload& rest) const {
  const Layout l = layout(rest);
  return {Section{{l.tokens, l.k}, l.wire}};
}

at::Tensor ColumnSparse::block_channels(const Payload& rest, const Layout& l) const {
  at::Tensor idx =
      codec::decode_index(l.format, body_or_empty(rest), l.blocks * l.k, l.blocks * l.hidden, kColsparseName,
                          codec::IndexSource{rest.host_body, rest.from_wire});  // (blocks * k)
  if (codec::use_cpu_kernel(idx) && idx.numel() > 0) {
    // Note [colsparse index set], checked by one loop, which also makes the channels.
    at::Tensor channels = at::empty({l.blocks, l.k}, idx.options());  // (blocks, k)
    const at::Tensor ic = idx.contiguous();
    const int64_t* ip = ic.data_ptr<int64_t>();
    int64_t* cp = channels.data_ptr<int64_t>();
    bool ok = true;
    for (int64_t i = 0; i < l.blocks * l.k; ++i) {
      const int64_t base = i / l.k * l.hidden;
      ok &= ip[i] >= base && ip[i] < base + l.hidden && (i % l.k == 0 || ip[i] > ip[i - 1]);
      cp[i] = ip[i] - base;
    }
    TORCH_CHECK(ok, kColsparseName, ": corrupt payload: the index set does not hold exactly ", l.k,
                " distinct channels in each block");
    return channels;
  }
  if (!codec::on_device(idx) && idx.numel() > 0) {
    // Note [colsparse index set]: exactly k distinct channels in each block (checked where it
    // costs no device synchronisation).
    at::Tensor block_of = at::div(idx, l.hidden, "floor");
    at::Tensor expected = at::div(at::arange(idx.numel(), idx.options()), l.k, "floor");
    TORCH_CHECK(
        block_of.equal(expected) && (idx.numel() < 2 || (idx.slice(0, 1) > idx.slice(0, 0, -1)).all().item<bool>()),
        kColsparseName, ": corrupt payload: the index set does not hold exactly ", l.k,
        " distinct channels in each block");
  }
  return idx.remainder(l.hidden).view({l.blocks, l.k});
}

at::Tensor ColumnSparse::token_channels(const Payload& rest, const Layout& l) const {
  return block_channels(rest, l).index_select(0, token_blocks(l.tokens, l.block, body_or_empty(rest).device()));
}

at::Tensor ColumnSparse::decode_parts(const Payload& rest, const std::vector<at::Tensor>& values,
                                      const CodecContext& ctx) {
  const Layout l = layout(rest);
  TORCH_CHECK(static_cast<int64_t>(rest.body_bytes()) == l.index_bytes, kColsparseName,
              ": corrupt payload: the index takes ", rest.body_bytes(), " bytes, the header announces ", l.index_bytes);
  TORCH_CHECK(values.size() == 1, kColsparseName, ": expected one value section, got ", values.size());
  return scatter_channels(rest, l.tokens, l.hidden, l.block, block_channels(rest, l), values[0]);
}

Payload ColumnSparse::encode_shared_parts(const at::Tensor& g, const Payload& fwd_rest,
                                          const std::vector<at::Tensor>& fwd_values, const CodecContext& ctx,
                                          std::vector<at::Tensor>& values) {
  const Layout l = layout(fwd_rest);
  TORCH_CHECK(g.sizes().equals(fwd_rest.shape), kColsparseName, ": shared mode: gradient of shape ", g.sizes(),
              " for a forward payload of shape ", c10::IntArrayRef(fwd_rest.shape));
  at::Tensor channels = token_channels(fwd_rest, l).to(g.device());
  values = {g.reshape({l.tokens, l.hidden}).gather(1, channels)};  // (T, k)
  Payload p;
  p.codec = codec_id(kColsparseName);
  p.dtype = g.scalar_type();
  p.shape = g.sizes().vec();
  p.params = {kShared, codec::wire_type_param(o_.values)};
  return p;
}

std::vector<SectionedCodec::Section> ColumnSparse::shared_sections(const Payload& rest, const Payload& fwd_rest) const {
  codec::check_payload(rest, kColsparseName, 2);
  TORCH_CHECK(rest.params[0] == kShared, kColsparseName, ": not a shared-mode payload (kind ", rest.params[0], ")");
  const at::ScalarType wire = codec::wire_type_from_param(rest.params[1], kColsparseName);
  const Layout l = layout(fwd_rest);
  TORCH_CHECK(rest.shape == fwd_rest.shape, kColsparseName, ": shared-mode payload of shape ",
              c10::IntArrayRef(rest.shape), " for a forward payload of shape ", c10::IntArrayRef(fwd_rest.shape));
  return {Section{{l.tokens, l.k}, wire}};
}

at::Tensor ColumnSparse::decode_shared_parts(const Payload& rest, const Payload& fwd_rest,
                                             const std::vector<at::Tensor>& fwd_values,
                                             const std::vector<at::Tensor>& values, const CodecContext& ctx) {
  TORCH_CHECK(rest.body_bytes() == 0, kColsparseName, ": corrupt shared-mode payload: ", rest.body_bytes(),
              " bytes besides the values");
  TORCH_CHECK(values.size() == 1, kColsparseName, ": expected one value section, got ", values.size());
  const Layout l = layout(fwd_rest);
  return scatter_channels(rest, l.tokens, l.hidden, l.block, block_channels(fwd_rest, l), values[0]);
}

}  // namespace tl
