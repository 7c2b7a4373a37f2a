#pragma once
// Codecs whose level changes during training (docs/COMPRESSION.md section 4.5):
//
//  schedule(C0, p1, C1, p2, C2, ...)         C0 while the training progress is below p1, C1 while
//                                            below p2, ..., the last one after: a level by progress.
//  adaptive(C, error=e, arg=, from=, to=)    C with one numeric argument (topk's k, quant's bits,
//                                            powersgd's rank, ...) picked per message from a ladder
//                                            of values so that the message's relative error
//                                            ||x - x^|| / ||x|| stays at most e.
//  budget(C0, C1, ..., error=e)              per message, the candidate with the fewest payload
//                                            bytes whose relative error is at most e (the most
//                                            accurate one if none is).
//
// All three are a CandidateSelector: a fixed list of candidate codecs (registered children
// `candidates.0`, `candidates.1`, ..., so their own state is checkpointed), one of which sends each
// message. The payload names it, so the receiver decodes without knowing the sender's progress or
// controller state:
//
//   codec id (schedule 38, adaptive 39, budget 40), params = {candidate index},
//   body = [the candidate's whole payload, nested (header and body)]
//
// which costs 16 + 8 * (ndim + 1) bytes over the candidate's own payload; nbytes() stays exact.
//
// State: `level`, an int64 scalar buffer holding the candidate index of the last training message
// (adaptive: where the next search starts), set by encode on the sender and by decode on the
// receiver, so both replicas hold it. It is in state_dict(), so a resumed run continues exactly.
// Messages in eval mode (CodecContext::training false) read it and never change it.

#include <vector>

#include "compression/stateful/common.h"

namespace tl {

class CandidateSelector : public Compressor {
 public:
  /// `codec`: the spec name, also the payloads' codec name (its wire id is registered with it).
  CandidateSelector(std::string type_name, std::string codec, std::vector<CompressorPtr> candidates);

  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  /// Backward mode `shared`, when every candidate can: the gradient goes with the candidate that
  /// sent the forward message, on its support or basis.
  bool supports_shared() const override;
  Payload encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) override;
  at::Tensor decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) override;
  bool decode_has_state() const override;
  void after_optimizer_step() override;
  std::optional<CodecLevel> level() const override { return level_of(current()); }

  size_t size() const { return candidates_.size(); }
  const CompressorPtr& candidate(size_t i) const { return candidates_.at(i); }
  /// The candidate index of the last training message (the `level` buffer; 0 before any).
  size_t current() const;

 protected:
  /// What level() reports for candidate i: {i, its spec} unless a subclass says better.
  virtual CodecLevel level_of(size_t i) const;
  /// Encodes x with candidate i and wraps the payload (records i as the level when training).
  Payload send_with(size_t i, const at::Tensor& x, const CodecContext& ctx);
  void set_current(size_t i);
  /// The candidate index a payload names (checked against size()) and its nested payload.
  std::pair<size_t, Payload> unwrap(const Payload& p) const;
  Payload wrap(size_t i, const Payload& inner) const;

  /// One trial of the searching selectors: candidate i's payload of x and its relative error
  /// ||x - decode(payload)|| / ||x|| (0 for x = 0), read on the host.
  struct Trial {
    Payload payload;
    double error = 0;
  };
  Trial trial(size_t i, const at::Tensor& x, const CodecContext& ctx);
  /// Error unless a candidate of a searching selector keeps receiver state (a trial decodes on the
  /// sender: EF21's or AQ-SGD's receiver copy would advance for messages never sent).
  void check_trial_safe() const;

  std::string codec_;
  std::vector<CompressorPtr> candidates_;

 private:
  Variable level_;  // int64 scalar
};

/// schedule(C0, p1, C1, ...): switches codec by training progress (CodecContext::progress, the
/// fraction of the run's steps done). A message whose context has no progress (evaluation, unit
/// tests) uses the phase of the last training message (C0 before any). Not named Schedule: that is
/// the learning-rate schedule (layers/optim/schedule.h), and two polymorphic tl::Schedule classes
/// in one program share one vtable and one type_info symbol.
class ScheduledCodec : public CandidateSelector {
 public:
  /// thresholds.size() == candidates.size() - 1, strictly increasing, each in (0, 1).
  ScheduledCodec(std::vector<CompressorPtr> candidates, std::vector<double> thresholds);
  static CompressorPtr from_spec(SpecArgs& args);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  /// The epilogue's uncompressed message goes through the current phase's codec's policy.
  at::Tensor deliver_residual(const at::Tensor& x, const CodecContext& ctx) override;
  /// The phase of progress p in [0, 1].
  size_t phase_of(double p) const;

 private:
  std::vector<double> thresholds_;
};

/// adaptive(C, error=e, ...): one numeric argument of C picked per message (Note [adaptive search]
/// in adaptive.cpp). The candidates are C at each value of the ladder, most compressed first.
class Adaptive : public CandidateSelector {
 public:
  struct Ladder {
    std::string arg;             // the argument adapted (k, bits, rank, ...)
    std::vector<double> values;  // most compressed first
    bool fraction = false;       // values written with a '.' (topk's k as a fraction)
  };
  Adaptive(std::string base_spec, Ladder ladder, std::vector<CompressorPtr> candidates, double error);
  static CompressorPtr from_spec(SpecArgs& args);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  const Ladder& ladder() const { return ladder_; }
  double target() const { return error_; }

 protected:
  CodecLevel level_of(size_t i) const override;

 private:
  std::string base_;  // C without the adapted argument, as a spec
  Ladder ladder_;
  double error_;
};

/// budget(C0, C1, ..., error=e): per message, the candidate with the fewest payload bytes whose
/// relative error is at most e; none: the one of least error. Ties: the first written.
class Budget : public CandidateSelector {
 public:
  Budget(std::vector<CompressorPtr> candidates, double error);
  static CompressorPtr from_spec(SpecArgs& args);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  double target() const { return error_; }

 private:
  double error_;
};

}  // namespace tl
