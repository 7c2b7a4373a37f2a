#pragma once
// Optimizer: parameter groups, a step() that updates parameters in place under NoGradGuard, and a
// per-parameter state (momentum buffers, Adam moments, step counts) exported as a TensorMap keyed
// by parameter name, so a checkpoint restores it onto a freshly built model and optimizer.
//
// State-dict layout (what checkpoints store under the `optim.` prefix):
//   state.<param name>.<slot>   per-parameter state, e.g. state.layer1.0.conv1.weight.exp_avg
//                               (slots: SGD momentum_buffer; Adam/AdamW step, exp_avg, exp_avg_sq,
//                               max_exp_avg_sq when amsgrad). A parameter that has not been
//                               stepped yet has no entries.
//   groups.<g>.<option>         float64 scalars: lr, weight_decay and the algorithm's options.
// Loading restores the group options too (as torch.optim does), so a scheduler's current lr comes
// back with the optimizer.
//
// Parameter names come from ParamGroup::names; when a group has none they are "group<g>.param<i>"
// (stable as long as the optimizer is built the same way).

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "layers/module.h"

namespace tl {

/// Hyperparameters of one parameter group. One struct serves every algorithm; each reads its own
/// fields (SGD: lr, weight_decay, momentum, dampening, nesterov; Adam/AdamW: lr, weight_decay,
/// beta1, beta2, eps, amsgrad) and ignores the rest. Chainable setters:
/// `GroupOptions().set_lr(0.1).set_momentum(0.9).set_nesterov(true)`.
struct GroupOptions {
  double lr = 1e-3;
  double weight_decay = 0.0;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adam / AdamW
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;

  // clang-format off
  GroupOptions& set_lr(double v) { lr = v; return *this; }
  GroupOptions& set_weight_decay(double v) { weight_decay = v; return *this; }
  GroupOptions& set_momentum(double v) { momentum = v; return *this; }
  GroupOptions& set_dampening(double v) { dampening = v; return *this; }
  GroupOptions& set_nesterov(bool v) { nesterov = v; return *this; }
  GroupOptions& set_betas(double b1, double b2) { beta1 = b1; beta2 = b2; return *this; }
  GroupOptions& set_eps(double v) { eps = v; return *this; }
  GroupOptions& set_amsgrad(bool v) { amsgrad = v; return *this; }
  // clang-format on
};

/// What a caller hands to an optimizer: parameters, optional names (same length) and optional
/// per-group overrides of the optimizer's default options.
struct ParamGroup {
  std::vector<Variable> params;
  std::vector<std::string> names;  // empty, or one per parameter
  std::optional<double> lr;
  std::optional<double> weight_decay;
  /// Full per-group options; when set, replaces the optimizer's defaults (lr / weight_decay
  /// overrides above still apply on top).
  std::optional<GroupOptions> options;
};

/// The two usual groups built from a module: group 0 = weights that decay (`weight_decay`),
/// group 1 = no decay (weight_decay 0): every parameter with fewer than 2 dimensions (biases,
/// norm scales), every parameter named `bias`, every parameter of a module whose type name
/// contains "Norm" (BatchNorm2d, LayerNorm), and every parameter whose dotted name contains one
/// of `extra_no_decay`. Parameters that do not require grad are left out. Both groups are always
/// present (possibly empty), in named_parameters() order, with their names.
std::vector<ParamGroup> weight_decay_groups(Module& model, double weight_decay,
                                            const std::vector<std::string>& extra_no_decay = {});

/// All trainable parameters of a module as one named group.
ParamGroup all_parameters(const Module& model);

class Optimizer {
 public:
  /// A resolved group: its parameters, their names and its full options.
  struct Group {
    std::vector<Variable> params;
    std::vector<std::string> names;
    GroupOptions options;
  };
  using SlotMap = std::map<std::string, at::Tensor>;  // slot name -> state tensor

  Optimizer(std::vector<ParamGroup> groups, const GroupOptions& defaults);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Algorithm name ("SGD", "Adam", "AdamW"); checkpoints record it and check it on load.
  virtual std::string name() const = 0;

  /// One update of every parameter that has a gradient (parameters without one are skipped),
  /// in place, under NoGradGuard.
  void step();
  /// Drops every parameter's gradient.
  void zero_grad();

  size_t num_groups() const { return groups_.size(); }
  Group& group(size_t g);
  const Group& group(size_t g) const;
  const std::vector<Group>& groups() const { return groups_; }
  double lr(size_t g = 0) const { return group(g).options.lr; }
  void set_lr(size_t g, double lr);
  /// Every parameter, group by group.
  std::vector<Variable> parameters() const;

  /// State of one parameter (by name); null when it has none yet.
  const SlotMap* param_state(const std::string& param_name) const;

  /// Group options (fresh scalars) and per-parameter state; the state tensors share memory with
  /// the live state (like Module::state_dict), so copy them to keep a snapshot across steps.
  TensorMap state_dict() const;
  /// Throws (and changes nothing) unless `state` fits this optimizer: same groups, known slots of
  /// known parameters with the parameter's shape. Used by load_state_dict and by checkpoints.
  void check_state_dict(const TensorMap& state) const;
  /// Replaces the per-parameter state and group options (validated first; all or nothing).
  /// State tensors are copied onto each parameter's device (floating slots in its dtype).
  void load_state_dict(const TensorMap& state);

 protected:
  /// Update one parameter in place. `slots` is its state (empty on the first step).
  virtual void update(Variable& param, const at::Tensor& grad, const GroupOptions& opt, SlotMap& slots) = 0;
  /// Slot names this algorithm may store for a parameter with these options.
  virtual std::vector<std::string> slot_names(const GroupOptions& opt) const = 0;
  /// Option names (besides lr and weight_decay) stored in the state dict.
  virtual std::vector<std::string> option_names() const = 0;
  /// Throws when an option is outside its valid range; `where` names the group.
  virtual void validate(const GroupOptions& opt, const std::string& where) const = 0;
  /// Call from the derived constructor: validate() is virtual, so the base constructor cannot.
  void validate_all() const;

 private:
  /// lr and weight_decay, then the algorithm's validate().
  void validate_group(const GroupOptions& opt, const std::string& where) const;

  std::vector<Group> groups_;
  // Param state by name; names are unique across groups.
  std::unordered_map<std::string, SlotMap> state_;
};

}  // namespace tl
