#pragma once
// What the engine's ops cost: floating-point operations, bytes of memory traffic and kernel
// launches, counted per recorded op, forward and backward. The counts feed the tape printout
// (Tape::to_string) and a CostMeter, which the pipeline's timeline uses to model compute on a
// device it does not run on (parallel/device_model.h).
//
// Note [op costs]
// The counts are a model of what a GPU implementation of the op does, not a trace of ATen's
// kernels on this CPU:
//  - FLOPs: an op with arithmetic that matters declares it in forward with Context::set_flops
//    (matmul, bmm and linear 2mnk; conv2d 2 * out * C_in/groups * kh * kw; attention 4 B H Tq Tk D
//    for its two products plus 5 per score for the masked softmax), and the FLOPs of the gradient
//    of each input (a matmul's dA and dB each cost its forward again; a bias's gradient is a sum).
//    Every other op counts one FLOP per element of its largest operand, forward and per gradient:
//    elementwise ops, reductions and normalisations are memory-bound, so their FLOPs never decide
//    a roofline and one per element is close enough.
//  - Bytes: forward reads every tensor argument and writes its outputs; a backward reads the
//    output gradients and what forward saved and writes the input gradients it computes. A view
//    (an output sharing an input's storage: reshape, permute, narrow, ...) costs nothing and
//    launches nothing, forward and backward.
//  - Kernels: one per forward op that is not a view, one per input gradient computed.
// Gradient accumulation (a + b where two paths meet), codecs (charged by the Boundary from the
// bytes they touch, Note [codec cost] in compression/boundary.cpp) and optimizer steps are not
// ops of the tape; the first two are charged explicitly, the optimizer is outside the timeline.

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace tl {

/// Arithmetic, memory traffic and kernel launches of some work.
struct OpCost {
  double flops = 0;
  double bytes = 0;
  int64_t kernels = 0;
  OpCost& operator+=(const OpCost& o) {
    flops += o.flops, bytes += o.bytes, kernels += o.kernels;
    return *this;
  }
};

/// Sums the costs of the ops run on this thread while it is current (CostMeterGuard), forward
/// and backward, and the seconds a device model gives each of them (applied op by op: a roofline
/// is a max per kernel, not of the totals).
class CostMeter {
 public:
  using TimeModel = std::function<double(const OpCost&)>;
  CostMeter() = default;
  explicit CostMeter(TimeModel model) : model_(std::move(model)) {}

  void add(const OpCost& c) {
    total_ += c;
    if (model_) seconds_ += model_(c);
  }
  /// Modelled time that is no op (a planned wait, e.g. a tensor-parallel all-reduce on a link):
  /// counted in seconds(), not in total().
  void add_seconds(double s) { seconds_ += s; }
  const OpCost& total() const { return total_; }
  /// The modelled seconds of everything added (0 without a model).
  double seconds() const { return seconds_; }
  void reset() { total_ = OpCost{}, seconds_ = 0; }

  /// The meter ops on this thread report to, or null (then nothing is counted).
  static CostMeter* current();

 private:
  friend class CostMeterGuard;
  TimeModel model_;
  OpCost total_;
  double seconds_ = 0;
};

/// RAII: makes `meter` the current meter of this thread for a scope (meters nest; the innermost
/// one counts).
class CostMeterGuard {
 public:
  explicit CostMeterGuard(CostMeter& meter);
  ~CostMeterGuard();
  CostMeterGuard(const CostMeterGuard&) = delete;
  CostMeterGuard& operator=(const CostMeterGuard&) = delete;

 private:
  CostMeter* prev_;
};

/// Adds `c` to the current meter, if any.
inline void charge(const OpCost& c) {
  if (CostMeter* m = CostMeter::current()) m->add(c);
}

/// Storage bytes a tensor's elements occupy (0 for an undefined tensor).
inline double tensor_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<double>(t.numel()) * static_cast<double>(t.element_size()) : 0.0;
}

}  // namespace tl
