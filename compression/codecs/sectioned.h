#pragma once
// SectionedCodec: a codec whose payload is a "rest" (sparse indices, flags; may be empty) plus
// dense value sections (TopK's kept values, PowerSGD's P and Q, a cast tensor). Alone, its wire
// body is [rest body][section 0][section 1]..., each section in its wire type. In a composition
// `a | b` the sections of `a` are instead encoded by `b` (compose.h), which is how
// `topk(0.1) | quant(4)` quantises the kept values. Sections are laid out after the rest, so the
// sizes of both follow from the header alone.

#include <ATen/ATen.h>

#include <vector>

#include "compression/compressor.h"

namespace tl {

class SectionedCodec : public Compressor {
 public:
  using Compressor::Compressor;

  struct Section {
    std::vector<int64_t> shape;
    at::ScalarType wire_type;
    int64_t numel() const;
  };
  struct Parts {
    Payload rest;                    // the header, with the rest of the body only
    std::vector<at::Tensor> values;  // one tensor per section, of the section's shape
  };

  /// Name in the codec table (payload.cpp).
  virtual const char* codec() const = 0;

  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  /// May return a view of the payload body (a cast or identity payload decodes without a copy).
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  Payload encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) override;
  at::Tensor decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) override;

  // ---- the parts, used by encode/decode above and by compositions ----
  /// Packs x: returns the rest payload and fills `values` with the sections, in x's dtype (the
  /// wire type is applied by whoever writes them).
  virtual Payload encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) = 0;
  /// The sections a rest payload announces (validates its params).
  virtual std::vector<Section> sections(const Payload& rest) const = 0;
  /// Unpacks; `values` may be in the wire type or in the original dtype.
  virtual at::Tensor decode_parts(const Payload& rest, const std::vector<at::Tensor>& values,
                                  const CodecContext& ctx) = 0;

  /// Backward mode `shared`: the gradient's sections on the forward payload's support or basis.
  /// `fwd_values` are the forward sections as the receiver decoded them (only passed when
  /// shared_uses_forward_values(), empty otherwise).
  virtual Payload encode_shared_parts(const at::Tensor& g, const Payload& fwd_rest,
                                      const std::vector<at::Tensor>& fwd_values, const CodecContext& ctx,
                                      std::vector<at::Tensor>& values);
  virtual std::vector<Section> shared_sections(const Payload& rest, const Payload& fwd_rest) const;
  virtual at::Tensor decode_shared_parts(const Payload& rest, const Payload& fwd_rest,
                                         const std::vector<at::Tensor>& fwd_values,
                                         const std::vector<at::Tensor>& values, const CodecContext& ctx);
  /// Sizing (Note [sizing a payload] in compressor.h): the rest's bytes (header and rest body),
  /// and the sections with the dtype encode_parts gives each, for a tensor of `shape` and
  /// `dtype`. The defaults refuse, naming the codec.
  struct SizedParts {
    int64_t rest_bytes = 0;
    std::vector<Section> sections;
    std::vector<at::ScalarType> value_types;  // per section: the dtype of encode_parts' values
    PayloadSize::Kind kind = PayloadSize::Kind::Exact;
  };
  virtual SizedParts size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const;
  virtual SizedParts size_shared_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const;
  /// The rest plus each section in its wire type.
  PayloadSize payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;
  PayloadSize shared_payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;

  /// PowerSGD needs the forward P; sparse codecs need only the forward indices.
  virtual bool shared_uses_forward_values() const { return false; }

  /// Splits a payload of this codec (plain, or shared given the forward rest) into rest and
  /// sections; a body too short or too long for the sections its header announces is an error.
  Parts split(const Payload& p) const;
  Parts split_shared(const Payload& p, const Payload& fwd_rest) const;

 protected:
  /// Error unless p was packed by this codec.
  void check_payload_codec(const Payload& p) const;
  /// The plain payload of a rest and its sections (what encode returns after encode_parts).
  Payload join_parts(Payload rest, const std::vector<at::Tensor>& values) const;

 private:
  Parts split_with(const Payload& p, const std::vector<Section>& secs) const;
  Payload join(Payload rest, const std::vector<at::Tensor>& values, const std::vector<Section>& secs) const;
};

}  // namespace tl

// The overrides a sectioned codec declares, written once for all of them (dense, sparse, colsparse,
// powersgd): the parts of a plain payload, and those of backward mode 'shared' for a codec that has
// one (the gradient on the forward payload's support or basis; the record's traits say
// shared = kYes, compression/registry.h).
#define TL_SECTIONED_CODEC_PARTS                                                                                \
  Payload encode_parts(const at::Tensor& x, const CodecContext& ctx, std::vector<at::Tensor>& values) override; \
  std::vector<Section> sections(const Payload& rest) const override;                                            \
  at::Tensor decode_parts(const Payload& rest, const std::vector<at::Tensor>& values, const CodecContext& ctx) override

#define TL_SECTIONED_CODEC_SHARED_PARTS                                                                                \
  bool supports_shared() const override { return true; }                                                               \
  Payload encode_shared_parts(const at::Tensor& g, const Payload& fwd_rest, const std::vector<at::Tensor>& fwd_values, \
                              const CodecContext& ctx, std::vector<at::Tensor>& values) override;                      \
  std::vector<Section> shared_sections(const Payload& rest, const Payload& fwd_rest) const override;                   \
  at::Tensor decode_shared_parts(const Payload& rest, const Payload& fwd_rest,                                         \
                                 const std::vector<at::Tensor>& fwd_values, const std::vector<at::Tensor>& values,     \
                                 const CodecContext& ctx) override
