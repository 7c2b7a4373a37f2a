#pragma once
// Boundary: the Module placed at a cut between two pipeline stages. Forward it sends the
// activation through a forward codec, backward it sends the activation gradient through a
// backward codec (or per the backward mode), and it counts what it sends.
//
//   out = post( Wire( pre(h) ) )
//
// pre/post are the forward codec's differentiable transforms (ae: encoder/decoder, subspace:
// U^T / U; identity otherwise), recorded on the tape like any op, so learned weights train.
// Wire is an autograd Function (WireFn): forward encodes + decodes with the forward codec,
// backward encodes + decodes the incoming gradient per the backward mode:
//   independent       the backward codec compresses the gradient on its own;
//   shared            the forward codec's encode_shared/decode_shared: the gradient travels on the
//                     forward payload's support (TopK/RandK mask) or basis; the forward payload of
//                     each micro-batch is kept until its backward (1F1B runs backward in another
//                     order); an error at construction when the forward codec cannot do it;
//   straight-through  the gradient passes uncompressed (counted as an identity payload);
//   none              no gradient crosses: the earlier stages receive a zero gradient (the stages
//                     before the cut then learn nothing from the loss; for studying that regime).
//
// Inference: in eval() mode a boundary with active_at_inference=false is the identity (nothing is
// counted); otherwise it compresses as in training (forward only; stateful codecs then act as
// their inner codec and leave their state untouched).
//
// Epilogue-only compression (Optimus-CC): with epilogue_only() set, a backward send that the
// schedule places off the critical path (send_backward's GradSendPlace) goes uncompressed, and an
// error-feedback backward codec (ef, lazy) delivers its pending residual with them. Which
// sends are critical: Optimus-CC's rule for 1F1B (EpilogueRule::Optimus), or zero slack on the
// step's dependency graph (CriticalPath; Note [slack of a gradient send] in parallel/slack.h).
//
// Statistics per direction (reset_stats()): exact bytes sent (Payload::nbytes), uncompressed
// bytes (the boundary input's numel x element size, each way), relative error ||x - x^||/||x||
// (forward: boundary input vs boundary output, so a learned transform's reconstruction error
// counts; backward: the gradient on the wire vs what was decoded), density (fraction of nonzero
// entries of the decoded wire tensor); running mean and last value.
//
// Sender/receiver halves for multi-process pipelines: sender_transform + send_forward on stage i,
// receive_forward + receiver_transform on stage i+1; send_backward on stage i+1 and
// receive_backward on stage i. They count bytes; error and density need both ends and are only
// measured by the in-process forward().

#include <map>
#include <string>

#include "compression/compressor.h"

namespace tl {

enum class BackwardMode { Independent, Shared, StraightThrough, None };
/// Epilogue-only compression: which backward sends are on the critical path.
enum class EpilogueRule { Optimus, CriticalPath };
/// Where the lowered schedule places one backward send (parallel/schedule.h marks every gradient
/// send with both): in Optimus-CC's epilogue (1F1B's cool-down and the last steady-state send),
/// and on the step's critical path (zero slack). The boundary's epilogue rule picks which counts.
struct GradSendPlace {
  bool epilogue = true;
  bool critical = true;
};
/// "independent", "shared", "straight-through" (or "straight_through", "ste"), "none".
BackwardMode parse_backward_mode(const std::string& text);
std::string to_string(BackwardMode mode);

struct DirectionStats {
  int64_t messages = 0;
  int64_t bytes = 0;      // sum of Payload::nbytes sent
  int64_t raw_bytes = 0;  // sum of uncompressed sizes (numel x element size)
  int64_t last_bytes = 0;
  int64_t last_raw_bytes = 0;
  int64_t measured = 0;       // messages whose error and density were measured
  double rel_error_mean = 0;  // ||x - x^|| / ||x||
  double rel_error_last = 0;
  double density_mean = 0;  // nnz(x^) / numel
  double density_last = 0;
  /// raw_bytes / bytes (0 when nothing was sent).
  double ratio() const { return bytes > 0 ? static_cast<double>(raw_bytes) / static_cast<double>(bytes) : 0.0; }
};

struct BoundaryStats {
  DirectionStats forward, backward;
};

class Boundary : public Module {
 public:
  /// Specs as in docs/COMPRESSION.md; "", "none" and "identity" mean uncompressed. The codecs are
  /// registered children "forward" and "backward" (their state is in state_dict()).
  Boundary(std::string name, const std::string& forward_spec, const std::string& backward_spec = "",
           BackwardMode mode = BackwardMode::Independent, bool active_at_inference = true);
  Boundary(std::string name, CompressorPtr forward_codec, CompressorPtr backward_codec,
           BackwardMode mode = BackwardMode::Independent, bool active_at_inference = true);

  /// In-process boundary with the context set by set_context().
  Variable forward(const Variable& h) override;
  Variable forward(const Variable& h, const CodecContext& ctx);

  /// Context for the next forward calls (sample ids, token ids, micro-batch index, epoch).
  /// ctx.training is always taken from the module's train()/eval() mode.
  void set_context(const CodecContext& ctx) { context_ = ctx; }
  const CodecContext& context() const { return context_; }

  // ---- sender / receiver halves ----------------------------------------------------------------
  /// Whether forward messages are compressed now (false: eval with active_at_inference off).
  bool active() const;
  Variable sender_transform(const Variable& h, const CodecContext& ctx);
  /// Encodes the wire tensor z (= sender_transform(h)). In shared mode the payload is kept for
  /// receive_backward of the same ctx.micro_batch. raw_bytes: the uncompressed size counted in the
  /// statistics (pass h's for a transform codec; default: z's).
  Payload send_forward(const at::Tensor& z, const CodecContext& ctx, int64_t raw_bytes = -1);
  /// Decodes on the receiver; in shared mode keeps the payload for send_backward.
  at::Tensor receive_forward(const Payload& p, const CodecContext& ctx);
  Variable receiver_transform(const Variable& z, const CodecContext& ctx);
  /// Whether a gradient crosses back (false in mode none: the sender uses a zero gradient).
  bool sends_gradient() const { return mode_ != BackwardMode::None; }
  /// Receiver side of the forward message: encodes the gradient w.r.t. the received wire tensor
  /// (raw_bytes as in send_forward). `place`: where the schedule puts this send; with
  /// epilogue_only() a send off the critical path (by the epilogue rule) goes uncompressed.
  Payload send_backward(const at::Tensor& grad, const CodecContext& ctx, int64_t raw_bytes = -1,
                        GradSendPlace place = {});
  /// Whether a backward send at `place` is compressed by the epilogue-only policy.
  bool compresses_backward_at(GradSendPlace place) const {
    return !epilogue_only_ || (epilogue_rule_ == EpilogueRule::CriticalPath ? place.critical : place.epilogue);
  }
  /// Sender side: decodes the gradient w.r.t. z.
  at::Tensor receive_backward(const Payload& p, const CodecContext& ctx);

  // ---- switches ----------------------------------------------------------------------------------
  void set_active_at_inference(bool on) { active_at_inference_ = on; }
  bool active_at_inference() const { return active_at_inference_; }
  void set_epilogue_only(bool on) { epilogue_only_ = on; }
  bool epilogue_only() const { return epilogue_only_; }
  /// With epilogue_only: which sends count as critical (the lowered schedule carries both flags).
  void set_epilogue_rule(EpilogueRule rule) { epilogue_rule_ = rule; }
  EpilogueRule epilogue_rule() const { return epilogue_rule_; }
  /// Off: every gradient goes uncompressed, whatever its place (the in-process autograd path has no
  /// place, so tests switch it by hand); default true.
  void set_backward_compression_enabled(bool on) { backward_enabled_ = on; }
  bool backward_compression_enabled() const { return backward_enabled_; }
  /// Whether error and density are measured (a few reductions per message); default true.
  void set_measure_error(bool on) { measure_error_ = on; }
  bool measures_error() const { return measure_error_; }
  /// For executors that hold both halves (in-process): records one forward message's relative
  /// error (boundary input h vs the receiver's output `out`) and density (of the decoded wire
  /// tensor zhat), or one backward message's (gradient g on the wire vs decoded ghat). No-ops
  /// unless measures_error().
  void measure_forward(const at::Tensor& h, const at::Tensor& out, const at::Tensor& zhat);
  void measure_backward(const at::Tensor& g, const at::Tensor& ghat);

  // ---- statistics and accessors -------------------------------------------------------------------
  BoundaryStats stats() const;
  void reset_stats();
  const std::string& name() const { return name_; }
  BackwardMode mode() const { return mode_; }
  const CompressorPtr& forward_codec() const { return fwd_; }
  const CompressorPtr& backward_codec() const { return bwd_; }
  /// One line: name, forward spec, backward spec, mode, inference toggle.
  std::string describe() const;
  /// Forwards to both codecs (subspace weight projection, lazy carry policy).
  void after_optimizer_step();

  // ---- planning (Note [sized messages]) ----------------------------------------------------------
  /// Bytes per message to use instead of the codecs' own sizes (-1: the codec's), each way.
  void set_given_sizes(int64_t forward_bytes, int64_t backward_bytes) {
    given_fwd_ = forward_bytes, given_bwd_ = backward_bytes;
  }
  /// The weakest size kind of the sized messages sent so far, each way (Exact before any).
  PayloadSize::Kind forward_size_kind() const { return fwd_kind_; }
  PayloadSize::Kind backward_size_kind() const { return bwd_kind_; }
  /// Whether `p` is a sized payload (a meta body of the sized bytes; no data).
  static bool is_sized(const Payload& p) { return p.body.defined() && p.body.is_meta(); }

  // Internal (WireFn): one message each way with statistics.
  at::Tensor wire_forward(const at::Tensor& z, const CodecContext& ctx, int64_t raw_bytes, Payload* keep);
  at::Tensor wire_backward(const at::Tensor& g, const CodecContext& ctx, int64_t raw_bytes, const Payload* fwd);

 private:
  struct Accumulator {
    int64_t messages = 0, bytes = 0, raw_bytes = 0, last_bytes = 0, last_raw_bytes = 0, measured = 0;
    at::Tensor err_sum, err_last, dens_sum, dens_last;  // 0-dim float64 on the data's device (no sync)
    void add_bytes(int64_t sent, int64_t raw);
    void add_measure(const at::Tensor& err, const at::Tensor& density);
    DirectionStats snapshot() const;
  };
  void validate();
  CodecContext with_mode(const CodecContext& ctx) const;
  static int64_t raw_size(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }
  at::Tensor pass_uncompressed(const at::Tensor& g, const CodecContext& ctx, Accumulator& acc, int64_t raw_bytes);
  const CompressorPtr& identity_codec();

  std::string name_;
  CompressorPtr fwd_, bwd_;
  CompressorPtr identity_;  // uncompressed messages of the halves API (stateless, not registered)
  bool fwd_identity_ = false, bwd_identity_ = false;
  BackwardMode mode_;
  bool active_at_inference_;
  bool epilogue_only_ = false;
  EpilogueRule epilogue_rule_ = EpilogueRule::Optimus;
  bool backward_enabled_ = true;
  bool measure_error_ = true;
  CodecContext context_;
  Accumulator fwd_stats_, bwd_stats_;
  // Shared mode, halves API: forward payloads by micro-batch until their backward.
  std::map<int64_t, Payload> sent_forward_, received_forward_;
  int64_t given_fwd_ = -1, given_bwd_ = -1;
  PayloadSize::Kind fwd_kind_ = PayloadSize::Kind::Exact, bwd_kind_ = PayloadSize::Kind::Exact;
  Payload sized(const Compressor& codec, const at::Tensor& x, int64_t given, PayloadSize::Kind& kind) const;
};

using BoundaryPtr = std::shared_ptr<Boundary>;

/// Size of the identity payload of `t` (what an uncompressed message costs on the wire).
int64_t identity_payload_bytes(const at::Tensor& t);

}  // namespace tl
