#include "compression/codecs/compose.h"

#include <c10/util/Exception.h>

#include "compression/codecs/common.h"
#include "compression/registry.h"

namespace tl {
namespace {
constexpr const char* kComposeName = "compose";
using codec::kPlain;
using codec::kShared;
}  // namespace

Composition::Composition(std::shared_ptr<SectionedCodec> outer, CompressorPtr inner)
    : Compressor("Composition"), outer_(std::move(outer)), inner_(std::move(inner)) {
  TORCH_CHECK(outer_ && inner_, "compose: both stages are required");
  register_module("outer", outer_);
  register_module("inner", inner_);
}

std::string Composition::spec() const { return outer_->spec() + " | " + inner_->spec(); }

void Composition::after_optimizer_step() {
  outer_->after_optimizer_step();
  inner_->after_optimizer_step();
}

Payload Composition::pack(int64_t kind, const at::Tensor& like, Payload rest, const std::vector<at::Tensor>& values,
                          const CodecContext& ctx) {
  BodyWriter w;
  w.put_payload(rest);
  for (const auto& v : values) w.put_payload(inner_->encode(v, ctx));
  Payload p;
  p.codec = codec_id(kComposeName);
  p.dtype = like.scalar_type();
  p.shape = like.sizes().vec();
  p.params = {kind, static_cast<int64_t>(codec_id(outer_->codec())), static_cast<int64_t>(values.size())};
  p.body = w.finish();
  p.nested = w.take_nested();  // the decoder reads them here, not back from a device body
  return p;
}

template <class SecsFn>
Composition::Unpacked Composition::unpack(const Payload& p, int64_t kind, const CodecContext& ctx, SecsFn secs_of) {
  codec::check_payload(p, kComposeName, 3);
  TORCH_CHECK(p.params[0] == kind, kComposeName, ": expected a ", kind == kPlain ? "plain" : "shared-mode",
              " payload, got a ",
              p.params[0] == kPlain    ? "plain"
              : p.params[0] == kShared ? "shared-mode"
                                       : "corrupt",
              " one (kind ", p.params[0], ")", kind == kPlain ? "; shared-mode payloads go to decode_shared" : "");
  const uint16_t outer_id = codec_id(outer_->codec());
  TORCH_CHECK(p.params[1] == outer_id, kComposeName, ": payload composes codec id ", p.params[1],
              ", this composition is '", spec(), "' (outer codec id ", outer_id, ")");
  BodyReader r(p, kComposeName);
  Unpacked u;
  u.rest = r.take_payload();
  TORCH_CHECK(u.rest.codec == outer_id, kComposeName, ": nested rest payload was packed by '", codec_name(u.rest.codec),
              "', expected '", outer_->codec(), "'");
  TORCH_CHECK(u.rest.shape == p.shape && u.rest.dtype == p.dtype, kComposeName,
              ": nested rest payload's shape or dtype differs from the composition's");
  const std::vector<SectionedCodec::Section> secs = secs_of(u.rest);
  TORCH_CHECK(static_cast<int64_t>(secs.size()) == p.params[2], kComposeName, ": payload announces ", p.params[2],
              " sections, '", outer_->codec(), "' expects ", secs.size());
  for (const auto& s : secs) {
    at::Tensor v = inner_->decode(r.take_payload(), ctx);
    TORCH_CHECK(v.sizes().equals(s.shape), kComposeName, ": inner stage '", inner_->spec(),
                "' decoded a section of shape ", v.sizes(), ", expected ", c10::IntArrayRef(s.shape));
    u.values.push_back(v);
  }
  r.finish();
  return u;
}

Payload Composition::encode(const at::Tensor& x, const CodecContext& ctx) {
  codec::check_input(x, kComposeName);
  std::vector<at::Tensor> values;
  Payload rest = outer_->encode_parts(x, ctx, values);
  return pack(kPlain, x, std::move(rest), values, ctx);
}

at::Tensor Composition::decode(const Payload& p, const CodecContext& ctx) {
  Unpacked u = unpack(p, kPlain, ctx, [&](const Payload& rest) { return outer_->sections(rest); });
  return outer_->decode_parts(u.rest, u.values, ctx);
}

Payload Composition::encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) {
  if (!supports_shared()) return Compressor::encode_shared(g, fwd, ctx);
  codec::check_input(g, kComposeName);
  Unpacked f = unpack_forward(fwd, ctx);
  std::vector<at::Tensor> values;
  Payload rest = outer_->encode_shared_parts(g, f.rest, f.values, ctx, values);
  return pack(kShared, g, std::move(rest), values, ctx);
}

at::Tensor Composition::decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) {
  if (!supports_shared()) return Compressor::decode_shared(p, fwd, ctx);
  Unpacked f = unpack_forward(fwd, ctx);
  Unpacked u = unpack(p, kShared, ctx, [&](const Payload& rest) { return outer_->shared_sections(rest, f.rest); });
  return outer_->decode_shared_parts(u.rest, f.rest, f.values, u.values, ctx);
}

Composition::Unpacked Composition::unpack_forward(const Payload& fwd, const CodecContext& ctx) {
  if (outer_->shared_uses_forward_values())
    return unpack(fwd, kPlain, ctx, [&](const Payload& rest) { return outer_->sections(rest); });
  // Only the forward rest (the support) is needed: skip decoding the forward values.
  codec::check_payload(fwd, kComposeName, 3);
  TORCH_CHECK(fwd.params[0] == kPlain, kComposeName,
              ": the forward payload of backward mode 'shared' must be a plain one");
  BodyReader r(fwd, kComposeName);
  Unpacked u;
  u.rest = r.take_payload();
  TORCH_CHECK(u.rest.codec == codec_id(outer_->codec()), kComposeName, ": forward payload's rest was packed by '",
              codec_name(u.rest.codec), "', expected '", outer_->codec(), "'");
  return u;
}

std::shared_ptr<SectionedCodec> require_sectioned(const CompressorPtr& outer, const std::string& next) {
  auto sectioned = std::dynamic_pointer_cast<SectionedCodec>(outer);
  TORCH_CHECK(sectioned, "compose: '", outer ? outer->spec() : "?", "' cannot be followed by '| ", next,
              "': it has no value sections to pass on; stages that can: ",
              codec_names([](const CodecRecord& r) { return r.traits.sectioned; }));
  return sectioned;
}

CompressorPtr make_composition(CompressorPtr outer, CompressorPtr inner) {
  auto sectioned = require_sectioned(outer, inner ? inner->spec() : "?");
  TORCH_CHECK(!inner || !inner->has_transform(), "compose: '", outer->spec(), " | ", inner->spec(),
              "': the last stage is a learned or projecting transform (ae, subspace), which encodes a boundary's "
              "activations, not another codec's value sections; use it alone, with its own wire= codec");
  return std::make_shared<Composition>(std::move(sectioned), std::move(inner));
}

// ---- sizing (Note [sizing a payload] in compressor.h) ------------------------------------------

namespace {
PayloadSize nest(const std::vector<int64_t>& shape, const SectionedCodec::SizedParts& parts, const Compressor& inner) {
  PayloadSize out{payload_header_bytes(static_cast<int64_t>(shape.size()), 3) + parts.rest_bytes, parts.kind};
  for (size_t i = 0; i < parts.sections.size(); ++i) {
    const PayloadSize s = inner.payload_size(parts.sections[i].shape, parts.value_types[i]);
    out.bytes += s.bytes;
    out.kind = PayloadSize::weaker(out.kind, s.kind);
  }
  return out;
}
}  // namespace

PayloadSize Composition::payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  return nest(shape, outer_->size_parts(shape, dtype), *inner_);
}

PayloadSize Composition::shared_payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  if (!supports_shared()) return Compressor::shared_payload_size(shape, dtype);
  return nest(shape, outer_->size_shared_parts(shape, dtype), *inner_);
}

}  // namespace tl
