#include "compression/stateful/adaptive.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "compression/codecs/common.h"
#include "compression/registry.h"

namespace tl {

// Note [adaptive search]. adaptive(C, error=e) must keep every message's relative error
// ||x - x^|| / ||x|| at most e, with as few bytes as it can, and cheaply. Its candidates are C at
// the values L_0, L_1, ..., L_{n-1} of one argument, most compressed first, so the error e_i(x) of
// a message falls (and its bytes grow) with i. Three ways to pick i:
//  - a controller that moves i between messages from the error it measured last: one trial per
//    message, but the message after a change in the statistics misses the target;
//  - a bisection over the ladder for every message: the cheapest level meeting the target for
//    every message, at log2(n) trials each;
//  - what is done here, a search warm-started at the level c of the previous training message
//    (the `level` buffer): try c; if e_c > e, climb c+1, c+2, ... to the first level that meets
//    the target (the top, the most accurate, when none does); if e_c <= e, try c-1 and send it if
//    it meets the target too, else send c. Every message meets the target (whenever the top does),
//    a steady stream costs two trials (encode + decode) per message, and the level follows a
//    change of the statistics at once upwards and one level per message downwards, which damps
//    flapping between neighbours. The first message starts at the top of the ladder: it meets
//    the target and walks down from there.
// A trial reads one number (the error) on the host: one device synchronisation per trial on a GPU.
// Evaluation messages search the same way from the training level without moving it.

namespace {

constexpr size_t kMaxLevels = 64;

/// The error target of adaptive/budget: a number in (0, 1).
double error_target(SpecArgs& a) {
  const double e = a.number(SpecArgs::kNamedOnly, "error");
  if (!(e > 0 && e < 1))
    a.fail(SpecArgs::kNamedOnly, "error", "a relative error target ||x - x^|| / ||x|| in (0, 1), e.g. error=0.1");
  return e;
}

/// A call (and the pipeline after it) written back as a spec.
std::string render(const SpecCall& call) {
  std::string args;
  for (const auto& v : call.positional) args += (args.empty() ? "" : ", ") + v.text;
  for (const auto& [k, v] : call.named) args += (args.empty() ? "" : ", ") + k + "=" + v.text;
  std::string s = args.empty() ? call.name : call.name + "(" + args + ")";
  return call.next ? s + " | " + render(*call.next) : s;
}

/// Error unless `c` (candidate `index`, from 1, of selector `codec`) can be chosen between.
void check_candidate(const std::string& codec, size_t index, const CompressorPtr& c) {
  TORCH_CHECK(c, codec, ": candidate ", index, " is null");
  TORCH_CHECK(!c->has_transform(), codec, ": cannot choose between codecs with a learned or ",
              "projecting transform ('", c->spec(), "'): ae and subspace are a boundary's forward ",
              "codec; give them wire=", codec, "(...) instead");
}

/// The nested codec at positional argument `pos` of a selector's spec, built and checked at once
/// (a spec then makes at most one autoencoder's weights before it fails); errors name it.
CompressorPtr candidate_at(SpecArgs& a, size_t pos) {
  CompressorPtr c = build_compressor(*a.spec(pos, "codec" + std::to_string(pos + 1)));
  check_candidate(a.call().name, pos + 1, c);
  return c;
}

}  // namespace

// ---- CandidateSelector ---------------------------------------------------------------------------

CandidateSelector::CandidateSelector(std::string type_name, std::string codec, std::vector<CompressorPtr> candidates)
    : Compressor(std::move(type_name)), codec_(std::move(codec)), candidates_(std::move(candidates)) {
  TORCH_CHECK(candidates_.size() >= 2, codec_, ": needs at least two candidate codecs, got ", candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i) check_candidate(codec_, i + 1, candidates_[i]);
  auto list = std::make_shared<Module>("Candidates");
  for (size_t i = 0; i < candidates_.size(); ++i) list->register_module(std::to_string(i), candidates_[i]);
  register_module("candidates", list);
  level_ = register_buffer("level", at::zeros({}, at::kLong));
}

size_t CandidateSelector::current() const {
  const int64_t i = level_.data().item<int64_t>();
  TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(size()), codec_, ": the `level` state holds ", i, ", outside 0..",
              size() - 1, " (a checkpoint of another spec?)");
  return static_cast<size_t>(i);
}

void CandidateSelector::set_current(size_t i) { level_.mutable_data().fill_(static_cast<int64_t>(i)); }

CodecLevel CandidateSelector::level_of(size_t i) const { return {static_cast<double>(i), candidates_.at(i)->spec()}; }

Payload CandidateSelector::wrap(size_t i, const Payload& inner) const {
  BodyWriter w;
  w.put_payload(inner);
  Payload p;
  p.codec = codec_id(codec_);
  p.dtype = inner.dtype;
  p.shape = inner.shape;
  p.params = {static_cast<int64_t>(i)};
  p.body = w.finish();
  p.nested = w.take_nested();  // the in-process decoder reads it here, not back from the body
  return p;
}

std::pair<size_t, Payload> CandidateSelector::unwrap(const Payload& p) const {
  codec::check_payload(p, codec_.c_str(), 1);
  const int64_t i = p.params[0];
  TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(size()), codec_, ": corrupt payload: it names candidate ", i,
              ", this codec '", spec(), "' has ", size(), " (0..", size() - 1, ")");
  BodyReader r(p, codec_.c_str());
  Payload inner = r.take_payload();
  r.finish();
  TORCH_CHECK(inner.shape == p.shape && inner.dtype == p.dtype, codec_,
              ": corrupt payload: the nested payload's shape or dtype differs from the message's");
  return {static_cast<size_t>(i), std::move(inner)};
}

Payload CandidateSelector::send_with(size_t i, const at::Tensor& x, const CodecContext& ctx) {
  if (ctx.training) set_current(i);
  return wrap(i, candidates_[i]->encode(x, ctx));
}

at::Tensor CandidateSelector::decode(const Payload& p, const CodecContext& ctx) {
  auto [i, inner] = unwrap(p);
  if (ctx.training) set_current(i);  // the receiver's replica tracks the sender's level
  return candidates_[i]->decode(inner, ctx);
}

bool CandidateSelector::supports_shared() const {
  return std::all_of(candidates_.begin(), candidates_.end(), [](const auto& c) { return c->supports_shared(); });
}

Payload CandidateSelector::encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) {
  if (!supports_shared()) return Compressor::encode_shared(g, fwd, ctx);
  auto [i, inner] = unwrap(fwd);
  return wrap(i, candidates_[i]->encode_shared(g, inner, ctx));
}

at::Tensor CandidateSelector::decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) {
  if (!supports_shared()) return Compressor::decode_shared(p, fwd, ctx);
  auto [i, inner_fwd] = unwrap(fwd);
  auto [j, inner] = unwrap(p);
  TORCH_CHECK(i == j, codec_, ": the gradient's payload names candidate ", j, ", its forward message was sent with ",
              i);
  return candidates_[i]->decode_shared(inner, inner_fwd, ctx);
}

bool CandidateSelector::decode_has_state() const {
  return std::any_of(candidates_.begin(), candidates_.end(), [](const auto& c) { return c->decode_has_state(); });
}

void CandidateSelector::after_optimizer_step() {
  for (auto& c : candidates_) c->after_optimizer_step();
}

CandidateSelector::Trial CandidateSelector::trial(size_t i, const at::Tensor& x, const CodecContext& ctx) {
  Trial t;
  t.payload = candidates_[i]->encode(x, ctx);
  const at::ScalarType acc = stateful::accumulation_type(x.scalar_type());
  at::Tensor xf = x.to(acc);
  at::Tensor xhat = candidates_[i]->decode(t.payload, ctx).to(acc);
  const double norm = xf.norm().item<double>();
  const double diff = (xf - xhat).norm().item<double>();
  t.error = norm > 0 ? diff / norm : (diff > 0 ? 1.0 : 0.0);
  return t;
}

void CandidateSelector::check_trial_safe() const {
  for (const auto& c : candidates_)
    TORCH_CHECK(!c->decode_has_state(), codec_, ": the candidate '", c->spec(), "' keeps receiver state in decode(); ",
                codec_,
                " decodes trial payloads on the sender, which would advance that state for messages never sent. "
                "Put the stateful codec outside (e.g. ef21(",
                codec_, "(...))) or use a schedule");
}

// ---- schedule --------------------------------------------------------------------------------------

ScheduledCodec::ScheduledCodec(std::vector<CompressorPtr> candidates, std::vector<double> thresholds)
    : CandidateSelector("Schedule", "schedule", std::move(candidates)), thresholds_(std::move(thresholds)) {
  TORCH_CHECK(thresholds_.size() + 1 == size(), "schedule: ", size(), " codecs need ", size() - 1,
              " switch points, got ", thresholds_.size());
  for (size_t i = 0; i < thresholds_.size(); ++i) {
    TORCH_CHECK(thresholds_[i] > 0 && thresholds_[i] < 1, "schedule: switch point ", i + 1, " is ", thresholds_[i],
                "; accepted: a training progress in (0, 1)");
    TORCH_CHECK(i == 0 || thresholds_[i] > thresholds_[i - 1], "schedule: switch points must increase, got ",
                thresholds_[i - 1], " then ", thresholds_[i]);
  }
}

CompressorPtr ScheduledCodec::from_spec(SpecArgs& a) {
  const size_t n = a.call().positional.size();
  if (n < 3 || n % 2 == 0)
    TORCH_CHECK(false,
                "schedule: expected codecs and switch points alternating, C0, p1, C1[, p2, C2 ...], e.g. "
                "schedule(quant(bits=2), 0.3, quant(bits=4)): C0 while the training progress is below p1, then C1; "
                "got ",
                n, " argument", n == 1 ? "" : "s", " in '", a.call().text, "'",
                n % 2 == 0 && n > 0 ? " (it must end with the codec used after the last switch point)" : "");
  std::vector<CompressorPtr> codecs;
  std::vector<double> until;
  for (size_t i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      codecs.push_back(candidate_at(a, i));
      continue;
    }
    const std::string key = "until" + std::to_string(i / 2 + 1);
    const double p = a.number(i, key);
    if (!(p > 0 && p < 1)) a.fail(i, key, "a training progress in (0, 1) (the fraction of the run's steps done)");
    if (!until.empty() && !(p > until.back()))
      a.fail(i, key, "a progress above the previous switch point " + codec::format_number(until.back()));
    until.push_back(p);
  }
  return std::make_shared<ScheduledCodec>(std::move(codecs), std::move(until));
}

std::string ScheduledCodec::spec() const {
  std::string s = "schedule(" + candidates_[0]->spec();
  for (size_t i = 0; i < thresholds_.size(); ++i)
    s += ", " + codec::format_number(thresholds_[i]) + ", " + candidates_[i + 1]->spec();
  return s + ")";
}

size_t ScheduledCodec::phase_of(double p) const {
  return static_cast<size_t>(std::upper_bound(thresholds_.begin(), thresholds_.end(), p) - thresholds_.begin());
}

Payload ScheduledCodec::encode(const at::Tensor& x, const CodecContext& ctx) {
  return send_with(ctx.knows_progress() ? phase_of(ctx.progress) : current(), x, ctx);
}

at::Tensor ScheduledCodec::deliver_residual(const at::Tensor& x, const CodecContext& ctx) {
  return candidates_[ctx.knows_progress() ? phase_of(ctx.progress) : current()]->deliver_residual(x, ctx);
}

// ---- adaptive --------------------------------------------------------------------------------------

namespace {

/// The argument adaptive adapts by default: the codec record's knob (compression/registry.h).
const AdaptiveKnob* knob_of(const std::string& codec) {
  const CodecRecord* r = find_codec(codec);
  return r && r->traits.knob ? &*r->traits.knob : nullptr;
}
std::string knob_list() {
  std::string s;
  for (const CodecRecord* r : codec_records())
    if (r->factory && r->traits.knob) s += (s.empty() ? "" : ", ") + r->name + " (" + r->traits.knob->arg + ")";
  return s;
}

/// Values from `from` to `to` (either order): consecutive integers, or for fractions the 1-2-5
/// series (..., 0.01, 0.02, 0.05, 0.1, ...) between them with both ends included.
std::vector<double> ladder_values(double from, double to, bool fraction) {
  const double lo = std::min(from, to), hi = std::max(from, to);
  std::vector<double> v;
  if (!fraction) {
    for (double x = lo; x <= hi && v.size() <= kMaxLevels; x += 1) v.push_back(x);
  } else {
    v.push_back(lo);
    for (int e = static_cast<int>(std::floor(std::log10(lo))); e <= static_cast<int>(std::ceil(std::log10(hi))); ++e)
      for (double m : {1.0, 2.0, 5.0}) {
        // m * 10^e, rounded once (a division for e < 0), so 0.05 reads as the literal 0.05.
        const double x = e >= 0 ? m * std::pow(10.0, e) : m / std::pow(10.0, -e);
        if (x > lo && x < hi) v.push_back(x);
      }
    v.push_back(hi);
  }
  if (from > to) std::reverse(v.begin(), v.end());
  return v;
}

}  // namespace

Adaptive::Adaptive(std::string base_spec, Ladder ladder, std::vector<CompressorPtr> candidates, double error)
    : CandidateSelector("Adaptive", "adaptive", std::move(candidates)),
      base_(std::move(base_spec)),
      ladder_(std::move(ladder)),
      error_(error) {
  TORCH_CHECK(error_ > 0 && error_ < 1, "adaptive: error target ", error_, " is outside (0, 1)");
  TORCH_CHECK(ladder_.values.size() == size(), "adaptive: ", ladder_.values.size(), " ladder values for ", size(),
              " candidates");
  check_trial_safe();
  set_current(size() - 1);  // Note [adaptive search]: the first message starts at the top
}

CompressorPtr Adaptive::from_spec(SpecArgs& a) {
  const auto base = a.spec(0, "codec");
  const AdaptiveKnob* known = knob_of(base->name);
  const bool has_arg = a.has(SpecArgs::kNamedOnly, "arg");
  if (!known_compressors().count(base->name)) build_compressor(*base);  // the error naming the known codecs
  if (!known && !has_arg)
    TORCH_CHECK(false, "adaptive: '", base->text, "' has no level adaptive knows how to adjust; it adapts ",
                knob_list(), ", or any numeric argument named with arg=NAME, from=A, to=B (most compressed first)");
  Ladder ladder;
  ladder.arg = a.word(SpecArgs::kNamedOnly, "arg", {}, known ? known->arg : std::string());
  // The codec's own knob: its kind (fraction or integer) and, unless given, its ends.
  const bool by_knob = known && ladder.arg == known->arg;
  const double from =
      a.number(SpecArgs::kNamedOnly, "from", by_knob ? std::optional<double>(known->from) : std::nullopt);
  const double to = a.number(SpecArgs::kNamedOnly, "to", by_knob ? std::optional<double>(known->to) : std::nullopt);
  if (by_knob) {
    ladder.fraction = known->fraction;
  } else {  // a fraction when either end is written with a '.' or is not whole
    for (const char* key : {"from", "to"}) {
      const SpecValue* v = a.peek(SpecArgs::kNamedOnly, key);
      const double x = std::get<double>(v->v);
      ladder.fraction = ladder.fraction || v->text.find('.') != std::string::npos || std::floor(x) != x;
    }
  }
  if (from == to) a.fail(SpecArgs::kNamedOnly, "to", "a value other than from=" + codec::format_number(from));
  if (ladder.fraction && !(from > 0 && to > 0))
    a.fail(SpecArgs::kNamedOnly, from > 0 ? "to" : "from",
           "a positive number (fraction ladders are geometric: 1-2-5 series)");
  ladder.values = ladder_values(from, to, ladder.fraction);
  if (ladder.values.size() > kMaxLevels)
    a.fail(SpecArgs::kNamedOnly, "to",
           "at most " + std::to_string(kMaxLevels) + " integer levels from from=" + codec::format_number(from) +
               " (write the ends with a '.' for a 1-2-5 series)");
  const double error = error_target(a);

  // The base must leave the adapted argument to adaptive: by name, or (a known knob) positionally.
  for (const auto& [k, v] : base->named)
    TORCH_CHECK(k != ladder.arg, "adaptive: '", base->text, "' sets ", ladder.arg, "=", v.text,
                ", the argument adaptive picks; leave it out, e.g. adaptive(", base->name,
                ", error=", a.peek(SpecArgs::kNamedOnly, "error")->text, ")");
  TORCH_CHECK(!by_knob || base->positional.empty(), "adaptive: '", base->text, "' gives ", ladder.arg,
              " (argument 1), the argument adaptive picks; leave it out, e.g. adaptive(", base->name,
              ", error=", a.peek(SpecArgs::kNamedOnly, "error")->text, ")");
  std::vector<CompressorPtr> candidates;
  for (double x : ladder.values) {
    SpecCall c = *base;
    SpecValue v;
    v.v = x;
    v.text = codec::format_number(x, ladder.fraction);
    c.named.emplace_back(ladder.arg, v);
    c.text = render(c);
    try {
      candidates.push_back(build_compressor(c));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "adaptive: the level ", ladder.arg, "=", v.text, " of '", base->text,
                  "' is not a codec: ", e.what_without_backtrace());
    }
  }
  return std::make_shared<Adaptive>(render(*base), std::move(ladder), std::move(candidates), error);
}

std::string Adaptive::spec() const {
  return "adaptive(" + base_ + ", error=" + codec::format_number(error_) + ", arg=" + ladder_.arg +
         ", from=" + codec::format_number(ladder_.values.front(), ladder_.fraction) +
         ", to=" + codec::format_number(ladder_.values.back(), ladder_.fraction) + ")";
}

CodecLevel Adaptive::level_of(size_t i) const {
  return {ladder_.values.at(i), ladder_.arg + "=" + codec::format_number(ladder_.values.at(i), ladder_.fraction)};
}

Payload Adaptive::encode(const at::Tensor& x, const CodecContext& ctx) {
  // Note [adaptive search].
  const size_t top = size() - 1;
  size_t c = current();
  Trial t = trial(c, x, ctx);
  if (t.error > error_) {
    while (c < top && t.error > error_) t = trial(++c, x, ctx);
  } else if (c > 0) {
    Trial below = trial(c - 1, x, ctx);
    if (below.error <= error_) t = std::move(below), --c;
  }
  if (ctx.training) set_current(c);
  return wrap(c, t.payload);
}

// ---- budget ----------------------------------------------------------------------------------------

Budget::Budget(std::vector<CompressorPtr> candidates, double error)
    : CandidateSelector("Budget", "budget", std::move(candidates)), error_(error) {
  TORCH_CHECK(error_ > 0 && error_ < 1, "budget: error target ", error_, " is outside (0, 1)");
  check_trial_safe();
}

CompressorPtr Budget::from_spec(SpecArgs& a) {
  const size_t n = a.call().positional.size();
  TORCH_CHECK(n >= 2, "budget: expected at least two candidate codecs and error=E, e.g. budget(quant(bits=2), ",
              "quant(bits=4), topk(0.1), error=0.1); got ", n, " in '", a.call().text, "'");
  std::vector<CompressorPtr> codecs;
  for (size_t i = 0; i < n; ++i) codecs.push_back(candidate_at(a, i));
  return std::make_shared<Budget>(std::move(codecs), error_target(a));
}

std::string Budget::spec() const {
  std::string s = "budget(";
  for (const auto& c : candidates_) s += c->spec() + ", ";
  return s + "error=" + codec::format_number(error_) + ")";
}

Payload Budget::encode(const at::Tensor& x, const CodecContext& ctx) {
  // Every candidate is tried: the fewest bytes under the target, else the least error.
  size_t best = 0;
  Trial chosen;
  bool met = false;
  for (size_t i = 0; i < size(); ++i) {
    Trial t = trial(i, x, ctx);
    const bool ok = t.error <= error_;
    const bool better = i == 0 || (ok && (!met || t.payload.nbytes() < chosen.payload.nbytes())) ||
                        (!ok && !met && t.error < chosen.error);
    if (better) best = i, chosen = std::move(t), met = ok;
  }
  if (ctx.training) set_current(best);
  return wrap(best, chosen.payload);
}

}  // namespace tl
