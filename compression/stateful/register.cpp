// The records of the stateful and learned codecs (compression/registry.h), with their spec
// factories; register_stateful_codecs() is called once by the registry. Syntax and formulas:
// docs/COMPRESSION.md.
#include "compression/stateful/adaptive.h"
#include "compression/stateful/aqsgd.h"
#include "compression/stateful/autoencoder.h"
#include "compression/stateful/error_feedback.h"
#include "compression/stateful/subspace.h"

namespace tl {

namespace {

at::ScalarType cache_dtype(SpecArgs& a) {
  const std::string w = a.word(SpecArgs::kNamedOnly, "cache", {"fp32", "fp16", "bf16"}, std::string("fp32"));
  return w == "fp16" ? at::kHalf : w == "bf16" ? at::kBFloat16 : at::kFloat;
}

int64_t non_negative(SpecArgs& a, size_t pos, const std::string& key, int64_t fallback, const char* what) {
  const int64_t v = a.integer(pos, key, fallback);
  if (v < 0) a.fail(pos, key, what);
  return v;
}

CompressorPtr optional_wire(SpecArgs& a) {
  auto call = a.spec(SpecArgs::kNamedOnly, "wire", /*required=*/false);
  return call ? build_compressor(*call) : nullptr;
}

CompressorPtr make_ef(SpecArgs& a) {
  CompressorPtr inner = stateful::build_inner(a, 0, "inner", "ef");
  ErrorFeedback::Options o;
  o.per = a.word(SpecArgs::kNamedOnly, "per", {"boundary", "sample"}, std::string("boundary")) == "sample"
              ? ErrorFeedback::Per::Sample
              : ErrorFeedback::Per::Boundary;
  o.cache.capacity =
      non_negative(a, SpecArgs::kNamedOnly, "capacity", 0, "an integer >= 0 (0: grow as sample ids appear)");
  if (o.per == ErrorFeedback::Per::Boundary && o.cache.capacity > 0)
    a.fail(SpecArgs::kNamedOnly, "capacity",
           "capacity only with per=sample (the per-boundary buffer has the message's shape)");
  a.done();
  return std::make_shared<ErrorFeedback>(inner, o);
}

CompressorPtr make_lazy(SpecArgs& a) {
  CompressorPtr inner = stateful::build_inner(a, 0, "inner", "lazy");
  ErrorFeedback::Options o;
  o.lazy = true;
  o.carry = a.word(SpecArgs::kNamedOnly, "carry", {"steps", "microbatches"}, std::string("steps")) == "microbatches"
                ? ErrorFeedback::Carry::MicroBatches
                : ErrorFeedback::Carry::Steps;
  a.done();
  return std::make_shared<ErrorFeedback>(inner, o);
}

CompressorPtr make_ef21(SpecArgs& a) {
  CompressorPtr inner = stateful::build_inner(a, 0, "inner", "ef21");
  a.done();
  return std::make_shared<EF21>(inner);
}

CompressorPtr make_aqsgd(SpecArgs& a) {
  CompressorPtr inner = stateful::build_inner(a, 0, "inner", "aqsgd");
  AqSgd::Options o;
  o.warmup_epochs = non_negative(a, SpecArgs::kNamedOnly, "warmup", 1, "an integer >= 0 (epochs sent uncompressed)");
  o.cache.capacity =
      non_negative(a, SpecArgs::kNamedOnly, "capacity", 0, "an integer >= 0 (0: grow as sample ids appear)");
  o.cache.dtype = cache_dtype(a);
  // A file name is a bare word (letters, digits, '_', '-', '.'; relative to the working directory);
  // other paths are given through AqSgd::Options.
  o.cache.file = a.word(SpecArgs::kNamedOnly, "file", {}, std::string());
  a.done();
  return std::make_shared<AqSgd>(inner, o);
}

CompressorPtr make_ae(SpecArgs& a) {
  Autoencoder::Options o;
  o.d_code = a.integer(0, "d_code");
  if (o.d_code < 1) a.fail(0, "d_code", "an integer >= 1 (the code width)");
  o.d = non_negative(a, SpecArgs::kNamedOnly, "d", 0, "an integer >= 0 (input width; 0: from the first input)");
  const std::string layout = a.word(SpecArgs::kNamedOnly, "layout", {"auto", "last", "channel"}, std::string("auto"));
  o.layout = layout == "last"      ? Autoencoder::Layout::Last
             : layout == "channel" ? Autoencoder::Layout::Channel
                                   : Autoencoder::Layout::Auto;
  o.seed = static_cast<uint64_t>(non_negative(a, SpecArgs::kNamedOnly, "seed", 0, "an integer >= 0"));
  o.wire = optional_wire(a);
  a.done();
  return std::make_shared<Autoencoder>(o);
}

CompressorPtr make_subspace(SpecArgs& a) {
  Subspace::Options o;
  o.k = a.integer(0, "k");
  if (o.k < 1) a.fail(0, "k", "an integer >= 1 (the subspace dimension)");
  o.d = non_negative(a, SpecArgs::kNamedOnly, "d", 0, "an integer >= 0 (hidden width; 0: from the first input)");
  o.vocab =
      non_negative(a, SpecArgs::kNamedOnly, "vocab", 0, "an integer >= 0 (vocabulary size; 0: no token embedding)");
  o.seed = static_cast<uint64_t>(non_negative(a, SpecArgs::kNamedOnly, "seed", 0, "an integer >= 0"));
  o.token_std = a.number(SpecArgs::kNamedOnly, "token_std", 0.02);
  if (!(o.token_std > 0)) a.fail(SpecArgs::kNamedOnly, "token_std", "a number > 0");
  o.wire = optional_wire(a);
  a.done();
  return std::make_shared<Subspace>(o);
}

// Traits of a codec around others: shared mode and receiver state as the codecs it wraps.
CodecTraits wrapper() {
  CodecTraits t;
  t.shared = t.decode_state = Capability::kInner;
  return t;
}
// Keeps receiver state of its own: a data-parallel all-gather would need one copy per replica.
CodecTraits receiver_state() {
  CodecTraits t = wrapper();
  t.decode_state = Capability::kYes;
  t.dp = MessageUse::kNoDecoderState;
  return t;
}
// Learned or projecting: a boundary's forward codec only.
CodecTraits transform() {
  CodecTraits t;
  t.dp = t.tp = MessageUse::kNoTransform;
  return t;
}

}  // namespace

void register_stateful_codecs() {
  register_codec({"ef", 32, make_ef, "ef(C, per=boundary|sample, capacity=N): error feedback x+=e; c=C(x); e=x-c",
                  "ef({})", wrapper()});
  register_codec({"lazy", 35, make_lazy,
                  "lazy(C, carry=steps|microbatches): Optimus-CC lazy error propagation, one buffer per boundary",
                  "lazy({})", wrapper()});
  register_codec({"ef21", 33, make_ef21, "ef21(C): EF21, both ends keep A; send C(x - A); A += C(x - A)", "ef21({})",
                  receiver_state()});
  CodecTraits aqsgd = receiver_state();
  aqsgd.tp = MessageUse::kNoSampleIds;
  register_codec(
      {"aqsgd", 34, make_aqsgd,
       "aqsgd(C, warmup=1, capacity=N, cache=fp32|fp16|bf16, file=PATH): AQ-SGD per-sample delta compression",
       "aqsgd({})", aqsgd});
  register_codec({"ae", 36, make_ae,
                  "ae(d_code, d=0, layout=auto|last|channel, wire=SPEC, seed=0): learned linear autoencoder", "ae(8)",
                  transform()});
  register_codec({"subspace", 37, make_subspace,
                  "subspace(k, d=0, vocab=0, seed=0, token_std=0.02, wire=SPEC): Protocol Models subspace projection",
                  "subspace(4)", transform()});
  register_codec({"schedule", 38, ScheduledCodec::from_spec,
                  "schedule(C0, p1, C1, ...): C0 while the training progress is below p1, then C1, ...",
                  "schedule({}, 0.5, {})", wrapper()});
  register_codec({"adaptive", 39, Adaptive::from_spec,
                  "adaptive(C, error=E, arg=NAME, from=A, to=B): C's level (topk k, quant bits, powersgd rank, "
                  "...) picked per message so that ||x - x^|| / ||x|| <= E",
                  "adaptive({}, error=0.1)", wrapper()});
  register_codec({"budget", 40, Budget::from_spec,
                  "budget(C0, C1, ..., error=E): per message, the candidate of fewest bytes with relative error "
                  "<= E (else the most accurate)",
                  "budget({}, {}, error=0.1)", wrapper()});
}

}  // namespace tl
