#include "compression/codecs/dense.h"

#include <c10/util/Exception.h>

#include "compression/codecs/common.h"

namespace tl {

DenseCodec::DenseCodec(const std::string& name) : SectionedCodec("DenseCodec"), name_(name) {
  if (name == "fp16")
    wire_ = at::kHalf;
  else if (name == "bf16")
    wire_ = at::kBFloat16;
  else
    TORCH_CHECK(name == "identity", "dense codec '", name, "' is not known; accepted: identity, fp16, bf16");
}

CompressorPtr DenseCodec::from_spec(const std::string& name, SpecArgs& args) {
  if (name == "cast") return std::make_shared<DenseCodec>(args.word(0, "to", {"fp16", "bf16"}));
  return std::make_shared<DenseCodec>(name);
}

Payload DenseCodec::encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) {
  Payload p;
  p.codec = codec_id(name_);
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  values = {x};
  return p;
}

std::vector<SectionedCodec::Section> DenseCodec::sections(const Payload& rest) const {
  codec::check_payload(rest, name_.c_str(), 0);
  return {Section{rest.shape, wire_ ? *wire_ : rest.dtype}};
}

at::Tensor DenseCodec::decode_parts(const Payload& rest, const std::vector<at::Tensor>& values,
                                    const CodecContext& ctx) {
  TORCH_CHECK(rest.body_bytes() == 0, name_, ": corrupt payload: ", rest.body_bytes(),
              " bytes besides the value section");
  TORCH_CHECK(values.size() == 1, name_, ": expected one value section, got ", values.size());
  return values[0].to(rest.dtype).view(rest.shape);
}

SectionedCodec::SizedParts DenseCodec::size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  SizedParts out;
  out.rest_bytes = payload_header_bytes(static_cast<int64_t>(shape.size()), 0);
  out.sections = {Section{shape, wire_ ? *wire_ : dtype}};
  out.value_types = {dtype};
  return out;
}

}  // namespace tl
