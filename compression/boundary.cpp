#include "compression/boundary.h"

#include <ATen/core/ivalue.h>

#include <cctype>

#include "autograd/function.h"
#include "compression/registry.h"
#include "compression/spec.h"

namespace tl {

BackwardMode parse_backward_mode(const std::string& text) {
  if (text == "independent") return BackwardMode::Independent;
  if (text == "shared") return BackwardMode::Shared;
  if (text == "straight-through" || text == "straight_through" || text == "ste") return BackwardMode::StraightThrough;
  if (text == "none") return BackwardMode::None;
  TORCH_CHECK(false, "unknown backward mode '", text, "'; accepted: independent, shared, straight-through, none");
}

std::string to_string(BackwardMode mode) {
  switch (mode) {
    case BackwardMode::Independent:
      return "independent";
    case BackwardMode::Shared:
      return "shared";
    case BackwardMode::StraightThrough:
      return "straight-through";
    case BackwardMode::None:
      return "none";
  }
  return "?";
}

int64_t identity_payload_bytes(const at::Tensor& t) {
  Payload p;  // the identity codec's header: shape, no parameters
  p.shape = t.sizes().vec();
  return static_cast<int64_t>(p.header_bytes()) + t.numel() * static_cast<int64_t>(t.element_size());
}

namespace {

bool is_identity_spec(const std::string& s) {
  std::string t;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  return t.empty() || t == "none" || t == "identity" || t == "identity()" || t == "none()";
}

CompressorPtr build(const std::string& boundary, const char* which, const std::string& spec) {
  try {
    return parse_compressor(is_identity_spec(spec) ? "identity" : spec);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "boundary '", boundary, "': ", which, " codec spec '", spec, "': ", e.what_without_backtrace());
  }
}

at::Tensor rel_error(const at::Tensor& x, const at::Tensor& xhat) {
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor xf = x.to(acc);
  return ((xf - xhat.to(acc)).norm() / xf.norm().clamp_min(1e-30)).to(at::kDouble);
}

at::Tensor density(const at::Tensor& t) {
  return t.ne(0).sum().to(at::kDouble) / static_cast<double>(std::max<int64_t>(t.numel(), 1));
}

// The state a WireFn node keeps for its backward: the boundary (checked alive), the context of
// its micro-batch (sample ids for per-sample codecs) and, in shared mode, the forward payload.
// It is the node's typed state (Function<T>'s `Saved`): a plain member of the node, no IValue
// capsule, no separate allocation.
struct WireCall {
  std::weak_ptr<Module> owner;
  Boundary* boundary = nullptr;
  CodecContext ctx;
  int64_t raw_bytes = 0;
  Payload forward_payload;
};

struct WireFn : Function<WireFn> {
  static constexpr const char* name = "boundary_wire";
  static constexpr bool kSplitBackward = false;  // its backward encodes (codec state): run once
  using Saved = WireCall;
  static at::Tensor forward(Context& ctx, Saved& saved, const at::Tensor& z, WireCall&& call) {
    saved = std::move(call);
    const bool keep = saved.boundary->mode() == BackwardMode::Shared;
    return saved.boundary->wire_forward(z, saved.ctx, saved.raw_bytes, keep ? &saved.forward_payload : nullptr);
  }
  static std::vector<at::Tensor> backward(Context& ctx, Saved& saved, std::vector<at::Tensor> grads) {
    auto alive = saved.owner.lock();
    TORCH_CHECK(alive, "boundary wire: the Boundary was destroyed before the backward of its forward");
    return {saved.boundary->wire_backward(grads[0], saved.ctx, saved.raw_bytes, &saved.forward_payload)};
  }
};

}  // namespace

// ---- construction ---------------------------------------------------------------------------------

Boundary::Boundary(std::string name, const std::string& forward_spec, const std::string& backward_spec,
                   BackwardMode mode, bool active_at_inference)
    : Boundary(name, build(name, "forward", forward_spec), build(name, "backward", backward_spec), mode,
               active_at_inference) {}

Boundary::Boundary(std::string name, CompressorPtr forward_codec, CompressorPtr backward_codec, BackwardMode mode,
                   bool active_at_inference)
    : Module("Boundary"),
      name_(std::move(name)),
      fwd_(forward_codec ? std::move(forward_codec) : parse_compressor("identity")),
      bwd_(backward_codec ? std::move(backward_codec) : parse_compressor("identity")),
      mode_(mode),
      active_at_inference_(active_at_inference) {
  TORCH_CHECK(fwd_ != bwd_, "boundary '", name_, "': the forward and backward codecs must be distinct objects");
  fwd_identity_ = fwd_->spec() == "identity";
  bwd_identity_ = bwd_->spec() == "identity";
  validate();
  register_module("forward", fwd_);
  register_module("backward", bwd_);
}

void Boundary::validate() {
  TORCH_CHECK(!bwd_->has_transform(), "boundary '", name_, "': the backward codec '", bwd_->spec(),
              "' has a learned/projecting transform; ae and subspace are forward codecs (their gradient is already ",
              "narrow: it crosses the wire as wide as the code)");
  switch (mode_) {
    case BackwardMode::Shared:
      TORCH_CHECK(fwd_->supports_shared(), "boundary '", name_, "': backward mode 'shared' reuses the forward ",
                  "codec's mask or basis, but forward codec '", fwd_->spec(), "' has none; codecs that support it: ",
                  codec_names([](const CodecRecord& r) { return r.traits.shared == Capability::kYes; }),
                  " (and wrappers of them); otherwise use independent, straight-through or none");
      TORCH_CHECK(bwd_identity_, "boundary '", name_, "': backward mode 'shared' sends the gradient with the ",
                  "forward codec; leave the backward spec empty (got '", bwd_->spec(), "')");
      break;
    case BackwardMode::StraightThrough:
    case BackwardMode::None:
      TORCH_CHECK(bwd_identity_, "boundary '", name_, "': backward mode '", to_string(mode_),
                  "' uses no backward codec, but '", bwd_->spec(), "' was given; use mode independent to compress ",
                  "the gradient");
      break;
    case BackwardMode::Independent:
      break;
  }
}

std::string Boundary::describe() const {
  std::string s = "boundary '" + name_ + "': forward=" + fwd_->spec() + " backward=" + bwd_->spec() +
                  " mode=" + to_string(mode_) + " inference=" + (active_at_inference_ ? "on" : "off");
  if (epilogue_only_) s += epilogue_rule_ == EpilogueRule::CriticalPath ? " epilogue-only (critical path)" : " epilogue-only";
  return s;
}

bool Boundary::active() const { return is_training() || active_at_inference_; }

CodecContext Boundary::with_mode(const CodecContext& ctx) const {
  CodecContext c = ctx;
  c.training = is_training();
  return c;
}

void Boundary::after_optimizer_step() {
  fwd_->after_optimizer_step();
  bwd_->after_optimizer_step();
}

// ---- in-process forward -------------------------------------------------------------------------

Variable Boundary::forward(const Variable& h) { return forward(h, context_); }

Variable Boundary::forward(const Variable& h, const CodecContext& ctx) {
  TORCH_CHECK(h.defined(), "boundary '", name_, "': undefined input");
  if (!active()) return h;
  const CodecContext c = with_mode(ctx);
  const bool transform = fwd_->has_transform();
  Variable z = transform ? fwd_->pre(h, c) : h;
  if (GradMode::is_enabled() && z.requires_grad()) {
    TORCH_CHECK(!weak_from_this().expired(), "boundary '", name_,
                "': must be owned by a std::shared_ptr (std::make_shared<Boundary>(...)) so that a pending backward "
                "can refer to it");
  }
  WireCall call;
  call.owner = weak_from_this();
  call.boundary = this;
  call.ctx = c;
  call.raw_bytes = raw_size(h.data());
  Variable zhat = WireFn::apply(z, std::move(call));
  Variable out = transform ? fwd_->post(zhat, c) : zhat;
  if (measure_error_) {
    NoGradGuard no_grad;
    fwd_stats_.add_measure(rel_error(h.data(), out.data()), density(zhat.data()));
  }
  return out;
}

at::Tensor Boundary::wire_forward(const at::Tensor& z, const CodecContext& ctx, int64_t raw_bytes, Payload* keep) {
  NoGradGuard no_grad;
  if (fwd_identity_) {
    fwd_stats_.add_bytes(identity_payload_bytes(z), raw_bytes);
    return z;
  }
  Payload p = fwd_->encode(z, ctx);
  at::Tensor zhat = fwd_->decode(p, ctx);
  fwd_stats_.add_bytes(static_cast<int64_t>(p.nbytes()), raw_bytes);
  if (keep) *keep = std::move(p);
  return zhat;
}

at::Tensor Boundary::pass_uncompressed(const at::Tensor& g, const CodecContext& ctx, Accumulator& acc,
                                       int64_t raw_bytes) {
  at::Tensor out = g;
  // An error-feedback backward codec delivers its pending residual with the lossless message.
  if (mode_ == BackwardMode::Independent) out = bwd_->deliver_residual(g, ctx);
  acc.add_bytes(identity_payload_bytes(out), raw_bytes);
  return out;
}

at::Tensor Boundary::wire_backward(const at::Tensor& g, const CodecContext& ctx, int64_t raw_bytes,
                                   const Payload* fwd) {
  NoGradGuard no_grad;
  at::Tensor ghat;
  switch (mode_) {
    case BackwardMode::None:
      bwd_stats_.add_bytes(0, raw_bytes);
      return at::zeros_like(g);
    case BackwardMode::StraightThrough:
      ghat = pass_uncompressed(g, ctx, bwd_stats_, raw_bytes);
      break;
    case BackwardMode::Shared: {
      if (!backward_enabled_) {
        ghat = pass_uncompressed(g, ctx, bwd_stats_, raw_bytes);
        break;
      }
      TORCH_CHECK(fwd && fwd->body.defined(), "boundary '", name_,
                  "': backward mode 'shared' found no forward payload for this micro-batch");
      Payload p = fwd_->encode_shared(g, *fwd, ctx);
      ghat = fwd_->decode_shared(p, *fwd, ctx);
      bwd_stats_.add_bytes(static_cast<int64_t>(p.nbytes()), raw_bytes);
      break;
    }
    case BackwardMode::Independent: {
      if (bwd_identity_ || !backward_enabled_) {
        ghat = pass_uncompressed(g, ctx, bwd_stats_, raw_bytes);
        break;
      }
      Payload p = bwd_->encode(g, ctx);
      ghat = bwd_->decode(p, ctx);
      bwd_stats_.add_bytes(static_cast<int64_t>(p.nbytes()), raw_bytes);
      break;
    }
  }
  if (measure_error_) bwd_stats_.add_measure(rel_error(g, ghat), density(ghat));
  return ghat;
}

// ---- sender / receiver halves ---------------------------------------------------------------------

Variable Boundary::sender_transform(const Variable& h, const CodecContext& ctx) {
  return active() && fwd_->has_transform() ? fwd_->pre(h, with_mode(ctx)) : h;
}

Variable Boundary::receiver_transform(const Variable& z, const CodecContext& ctx) {
  return active() && fwd_->has_transform() ? fwd_->post(z, with_mode(ctx)) : z;
}

// Note [codec cost]
// What a codec's work on a message costs on the timeline's device model (Note [op costs] in
// autograd/cost.h), charged to the thread's CostMeter: the codecs run ATen directly, not ops of
// the tape, so their cost is modelled from the bytes they touch. An encode reads the message twice
// (a pass for its statistics: scales, norms, a top-k selection; a pass to pack) and writes the
// payload, about 4 FLOPs and 2 kernels per pass; a decode reads the payload and writes the
// message, one pass. An uncompressed message (identity) costs nothing: a transport sends the
// tensor's memory as it is. Learned codecs' layers (ae) are ops of the engine and counted as such.
namespace {
void charge_codec(const Payload& p, int64_t raw_bytes, bool encode) {
  if (!CostMeter::current() || p.codec == codec_id("identity")) return;
  const double raw = static_cast<double>(raw_bytes), sent = static_cast<double>(p.nbytes());
  const double elements = raw / 4.0;
  if (encode)
    charge(OpCost{8.0 * elements, 2.0 * raw + sent, 4});
  else
    charge(OpCost{2.0 * elements, raw + sent, 2});
}
}  // namespace

// Note [sized messages]. A tensor on the meta device (the planner's step, tasks/runner/plan.h) has
// a shape and no data: no codec can pack it. Its message is then a payload whose header carries
// the shape and dtype and whose body is a meta tensor of the bytes the codec would send (Note
// [sizing a payload] in compressor.h), or of the bytes the user gave; the receiver decodes it to a
// meta tensor of that shape. Bytes, statistics, the codec's charge on the timeline and the link
// see the same numbers as for a real message; codec state is not touched.
// The payload's codec id is the codec family's (the spec's name: what charge_codec tells identity
// by), or that of a composition for a codec without an id of its own (ef(...)).
Payload Boundary::sized(const Compressor& codec, const at::Tensor& x, int64_t given, PayloadSize::Kind& kind) const {
  PayloadSize size = given >= 0 ? PayloadSize{given, PayloadSize::Kind::Given}
                                : codec.payload_size(x.sizes().vec(), x.scalar_type());
  kind = PayloadSize::weaker(kind, size.kind);
  const std::string spec = codec.spec();
  Payload p;
  try {
    p.codec = codec_id(spec.substr(0, spec.find_first_of("( |")));
  } catch (const c10::Error&) {
    p.codec = codec_id("compose");
  }
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  const int64_t body = std::max<int64_t>(0, size.bytes - static_cast<int64_t>(p.header_bytes()));
  p.body = at::empty({body}, at::TensorOptions().dtype(at::kByte).device(at::kMeta));
  return p;
}

Payload Boundary::send_forward(const at::Tensor& z, const CodecContext& ctx, int64_t raw_bytes) {
  NoGradGuard no_grad;
  if (z.is_meta()) {
    PayloadSize::Kind unused = PayloadSize::Kind::Exact;
    if (!active()) return sized(*identity_codec(), z, -1, unused);
    Payload p = sized(*fwd_, z, given_fwd_, fwd_kind_);
    charge_codec(p, raw_size(z), true);
    fwd_stats_.add_bytes(static_cast<int64_t>(p.nbytes()), raw_bytes >= 0 ? raw_bytes : raw_size(z));
    return p;
  }
  if (!active()) return identity_codec()->encode(z, ctx);
  const CodecContext c = with_mode(ctx);
  Payload p = fwd_->encode(z, c);
  charge_codec(p, raw_size(z), true);
  fwd_stats_.add_bytes(static_cast<int64_t>(p.nbytes()), raw_bytes >= 0 ? raw_bytes : raw_size(z));
  if (mode_ == BackwardMode::Shared && c.training) sent_forward_[ctx.micro_batch] = p;
  return p;
}

at::Tensor Boundary::receive_forward(const Payload& p, const CodecContext& ctx) {
  NoGradGuard no_grad;
  if (is_sized(p)) {
    at::Tensor z = at::empty(p.shape, at::TensorOptions().dtype(p.dtype).device(at::kMeta));
    if (active()) charge_codec(p, raw_size(z), false);
    return z;
  }
  if (!active()) return identity_codec()->decode(p, ctx);
  const CodecContext c = with_mode(ctx);
  at::Tensor z = fwd_->decode(p, c);
  charge_codec(p, raw_size(z), false);
  if (mode_ == BackwardMode::Shared && c.training) received_forward_[ctx.micro_batch] = p;
  return z;
}

Payload Boundary::send_backward(const at::Tensor& grad, const CodecContext& ctx, int64_t raw_bytes,
                                GradSendPlace place) {
  NoGradGuard no_grad;
  TORCH_CHECK(sends_gradient(), "boundary '", name_, "': backward mode 'none' sends no gradient (check ",
              "sends_gradient() and use a zero gradient on the sender)");
  const CodecContext c = with_mode(ctx);
  const int64_t raw = raw_bytes >= 0 ? raw_bytes : raw_size(grad);
  const bool compress = backward_enabled_ && compresses_backward_at(place) && mode_ != BackwardMode::StraightThrough &&
                        !(mode_ == BackwardMode::Independent && bwd_identity_);
  Payload p;
  if (grad.is_meta()) {
    if (compress && mode_ == BackwardMode::Shared) {
      p = sized(*fwd_, grad, given_bwd_, bwd_kind_);  // the forward codec's family, its shared size
      if (given_bwd_ < 0) {
        const PayloadSize s = fwd_->shared_payload_size(grad.sizes().vec(), grad.scalar_type());
        p.body = at::empty({std::max<int64_t>(0, s.bytes - static_cast<int64_t>(p.header_bytes()))}, p.body.options());
      }
    } else {
      p = sized(compress ? *bwd_ : *identity_codec(), grad, compress ? given_bwd_ : -1, bwd_kind_);
    }
    bwd_stats_.add_bytes(static_cast<int64_t>(p.nbytes()), raw);
    charge_codec(p, raw_size(grad), true);
    return p;
  }
  if (!compress) {
    Accumulator scratch;  // bytes are counted below from the actual payload
    p = identity_codec()->encode(pass_uncompressed(grad, c, scratch, raw), c);
  } else if (mode_ == BackwardMode::Shared) {
    auto it = received_forward_.find(ctx.micro_batch);
    TORCH_CHECK(it != received_forward_.end(), "boundary '", name_, "': backward mode 'shared' has no forward ",
                "payload received for micro-batch ", ctx.micro_batch);
    p = fwd_->encode_shared(grad, it->second, c);
  } else {
    p = bwd_->encode(grad, c);
  }
  if (mode_ == BackwardMode::Shared) received_forward_.erase(ctx.micro_batch);
  bwd_stats_.add_bytes(static_cast<int64_t>(p.nbytes()), raw);
  charge_codec(p, raw_size(grad), true);
  return p;
}

at::Tensor Boundary::receive_backward(const Payload& p, const CodecContext& ctx) {
  NoGradGuard no_grad;
  TORCH_CHECK(sends_gradient(), "boundary '", name_, "': backward mode 'none' receives no gradient");
  if (is_sized(p)) {  // charged as the real decodes are: shared and straight-through ones are not
    at::Tensor g = at::empty(p.shape, at::TensorOptions().dtype(p.dtype).device(at::kMeta));
    if (mode_ != BackwardMode::Shared && mode_ != BackwardMode::StraightThrough) charge_codec(p, raw_size(g), false);
    return g;
  }
  const CodecContext c = with_mode(ctx);
  const bool raw = p.codec == codec_id("identity");
  if (mode_ == BackwardMode::Shared) {
    auto it = sent_forward_.find(ctx.micro_batch);
    TORCH_CHECK(raw || it != sent_forward_.end(), "boundary '", name_, "': backward mode 'shared' has no forward ",
                "payload sent for micro-batch ", ctx.micro_batch);
    at::Tensor g = raw ? identity_codec()->decode(p, c) : fwd_->decode_shared(p, it->second, c);
    if (it != sent_forward_.end()) sent_forward_.erase(it);
    return g;
  }
  if (raw || mode_ == BackwardMode::StraightThrough) return identity_codec()->decode(p, c);
  at::Tensor g = bwd_->decode(p, c);
  charge_codec(p, raw_size(g), false);
  return g;
}

const CompressorPtr& Boundary::identity_codec() {
  if (!identity_) identity_ = parse_compressor("identity");
  return identity_;
}

// ---- statistics ------------------------------------------------------------------------------------

void Boundary::Accumulator::add_bytes(int64_t sent, int64_t raw) {
  ++messages;
  bytes += sent;
  raw_bytes += raw;
  last_bytes = sent;
  last_raw_bytes = raw;
}

void Boundary::Accumulator::add_measure(const at::Tensor& err, const at::Tensor& dens) {
  ++measured;
  err_sum = err_sum.defined() ? err_sum + err : err.clone();
  dens_sum = dens_sum.defined() ? dens_sum + dens : dens.clone();
  err_last = err;
  dens_last = dens;
}

DirectionStats Boundary::Accumulator::snapshot() const {
  DirectionStats s;
  s.messages = messages;
  s.bytes = bytes;
  s.raw_bytes = raw_bytes;
  s.last_bytes = last_bytes;
  s.last_raw_bytes = last_raw_bytes;
  s.measured = measured;
  if (measured > 0) {
    s.rel_error_mean = err_sum.item<double>() / measured;
    s.rel_error_last = err_last.item<double>();
    s.density_mean = dens_sum.item<double>() / measured;
    s.density_last = dens_last.item<double>();
  }
  return s;
}

void Boundary::measure_forward(const at::Tensor& h, const at::Tensor& out, const at::Tensor& zhat) {
  if (!measure_error_) return;
  NoGradGuard no_grad;
  fwd_stats_.add_measure(rel_error(h, out), density(zhat));
}

void Boundary::measure_backward(const at::Tensor& g, const at::Tensor& ghat) {
  if (!measure_error_) return;
  NoGradGuard no_grad;
  bwd_stats_.add_measure(rel_error(g, ghat), density(ghat));
}

BoundaryStats Boundary::stats() const { return {fwd_stats_.snapshot(), bwd_stats_.snapshot()}; }

void Boundary::reset_stats() {
  fwd_stats_ = Accumulator();
  bwd_stats_ = Accumulator();
}

}  // namespace tl
