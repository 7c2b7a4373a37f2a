#pragma once
// Module: the unit of a model. Holds named parameters (leaf Variables that require grad),
// buffers (Variables that do not: BatchNorm running statistics, compression state, RNG state) and
// child modules, all in registration order. Dotted names (`layer1.0.conv1.weight`) key
// checkpoints, optimizer groups, per-boundary configs and reference tests.

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"

namespace tl {

using TensorMap = std::map<std::string, at::Tensor>;

/// How a parameter is split over the ranks of a tensor-parallel group (Note [tensor-parallel
/// blocks] in layers/nn/tensor_parallel.h): along `dim`, the full extent being `groups` equal
/// blocks (a fused qkv weight: 3) each cut into T equal parts; rank t holds part t of every block.
struct TensorShard {
  int64_t dim = 0;
  int64_t groups = 1;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Single-input forward, used by Sequential and by pipeline stages. Modules with other
  /// signatures (models taking token ids) provide their own and leave this one throwing.
  virtual Variable forward(const Variable& x);
  Variable operator()(const Variable& x) { return forward(x); }

  const std::string& type_name() const { return type_name_; }

  // ---- registration ----------------------------------------------------------------------------
  Variable register_parameter(const std::string& name, at::Tensor value, bool requires_grad = true);
  Variable register_buffer(const std::string& name, at::Tensor value);
  /// Marks a registered parameter or buffer of this module as resizable: its shape is set by the
  /// data it meets (EF residuals, per-sample caches, lazily sized weights), so load_state_dict
  /// replaces it with the checkpoint's tensor (keeping its dtype and device) instead of failing on
  /// a shape mismatch. The Variable handle stays the same.
  void mark_resizable(const std::string& name);
  /// Marks a registered parameter of this module as rank t's part of a tensor split over a
  /// tensor-parallel group (checkpoints hold the whole tensor: parallel/ranks/runtime.h).
  void mark_sharded(const std::string& name, TensorShard shard);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- traversal (dotted names, registration order, depth first) --------------------------------
  std::vector<std::pair<std::string, Variable>> named_parameters(bool recurse = true) const;
  std::vector<Variable> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Variable>> named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  /// The parameters marked sharded, by dotted name.
  std::map<std::string, TensorShard> named_shards() const;
  /// This module (name "") and every descendant.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();
  /// The descendant at a dotted path ("layer1.0"); error naming the missing part otherwise.
  std::shared_ptr<Module> submodule(const std::string& path);

  // ---- state ------------------------------------------------------------------------------------
  /// Parameters and buffers by dotted name (tensors share storage with the module).
  TensorMap state_dict() const;
  /// Copies values in. strict: missing or unexpected names are an error. A shape mismatch is
  /// always an error. The error lists every missing, unexpected and mis-shaped entry.
  void load_state_dict(const TensorMap& state, bool strict = true);

  // ---- mode and placement ------------------------------------------------------------------------
  /// Training mode (BatchNorm batch statistics, dropout); separate from grad mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Moves parameters and buffers; dtype applies to floating-point tensors only.
  void to(at::Device device, std::optional<at::ScalarType> dtype = std::nullopt);
  void to(at::ScalarType dtype);
  void zero_grad();
  size_t num_parameters() const;

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  /// Called by train() on every module (e.g. to propagate to non-child helpers).
  virtual void on_train(bool on) {}

 private:
  void check_name(const std::string& name) const;
  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Variable>> params_;
  std::vector<std::pair<std::string, Variable>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<const VariableImpl*> resizable_;
  std::map<std::string, TensorShard> shards_;  // by parameter name (this module's own)
};

using ModulePtr = std::shared_ptr<Module>;

}  // namespace tl
