#pragma once
// Composition `a | b`: the value sections of `a` (a SectionedCodec: TopK's kept values,
// PowerSGD's P and Q, ...) are each encoded by `b` instead of being written raw. So
// `topk(0.1) | quant(4)` sends TopK's indices and 4-bit codes of the kept values, and
// `a | b | c` is `a | (b | c)`.
//
// Wire body: [nested payload: a's rest][nested payload: b's encoding of section 0][...], each
// nested payload with its own header (payload.h), so the byte count stays exact.
// params = {kind (0 plain, 1 shared), codec id of a, number of sections}.

#include "compression/codecs/sectioned.h"

namespace tl {

class Composition : public Compressor {
 public:
  Composition(std::shared_ptr<SectionedCodec> outer, CompressorPtr inner);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;

  /// Shared mode reuses the outer stage's support or basis; the gradient's sections go through
  /// the inner stage's plain encode.
  bool supports_shared() const override { return outer_->supports_shared(); }
  Payload encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) override;
  at::Tensor decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) override;

  /// The outer codec's rest and, per section, the inner codec's size of it, each a nested payload.
  PayloadSize payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;
  PayloadSize shared_payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;
  bool has_transform() const override { return outer_->has_transform(); }
  Variable pre(const Variable& h, const CodecContext& ctx) override { return outer_->pre(h, ctx); }
  Variable post(const Variable& z, const CodecContext& ctx) override { return outer_->post(z, ctx); }
  void after_optimizer_step() override;
  /// The outer stage's level, else the inner's (`topk(0.1) | adaptive(quant, error=0.1)`).
  std::optional<CodecLevel> level() const override {
    auto l = outer_->level();
    return l ? l : inner_->level();
  }

  const std::shared_ptr<SectionedCodec>& outer() const { return outer_; }
  const CompressorPtr& inner() const { return inner_; }

 private:
  struct Unpacked {
    Payload rest;
    std::vector<at::Tensor> values;
  };
  Payload pack(int64_t kind, const at::Tensor& like, Payload rest, const std::vector<at::Tensor>& values,
               const CodecContext& ctx);
  // Reads a composition payload of `kind`; the sections are checked against `secs_of(rest)`.
  template <class SecsFn>
  Unpacked unpack(const Payload& p, int64_t kind, const CodecContext& ctx, SecsFn secs_of);
  // The forward payload of shared mode: its rest, and its decoded sections if the outer stage
  // needs them (PowerSGD's P).
  Unpacked unpack_forward(const Payload& fwd, const CodecContext& ctx);

  std::shared_ptr<SectionedCodec> outer_;
  CompressorPtr inner_;
};

/// Builds `outer | inner`; error if outer has no value sections to pass on, or if inner is a
/// learned or projecting transform (ae, subspace: a boundary's forward codec on its own).
CompressorPtr make_composition(CompressorPtr outer, CompressorPtr inner);
/// make_composition's check of the outer stage alone, naming the rest of the pipeline (`next`):
/// the parser calls it before building the rest. Returns outer as a SectionedCodec.
std::shared_ptr<SectionedCodec> require_sectioned(const CompressorPtr& outer, const std::string& next);

}  // namespace tl
