#pragma once
// Dense codecs: identity (the tensor as is) and the fp16 / bf16 casts. One value section: the
// whole tensor in the wire type. params = {}; body = numel * sizeof(wire type) bytes.

#include "compression/codecs/sectioned.h"
#include "compression/spec.h"

namespace tl {

class DenseCodec : public SectionedCodec {
 public:
  /// name: "identity" (wire type = the tensor's own), "fp16" or "bf16".
  explicit DenseCodec(const std::string& name);
  static CompressorPtr from_spec(const std::string& name, SpecArgs& args);

  const char* codec() const override { return name_.c_str(); }
  std::string spec() const override { return name_; }

  TL_SECTIONED_CODEC_PARTS;
  /// params = {}: the header and one section of the tensor in the wire type.
  SizedParts size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;

 private:
  std::string name_;
  std::optional<at::ScalarType> wire_;  // none: identity
};

}  // namespace tl
