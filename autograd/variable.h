#pragma once
// Variable: a cheap shared handle over an at::Tensor with its gradient, requires_grad flag, the
// node that produced it (grad_fn) and gradient hooks. Copies share state, like torch.Tensor.
//
// Threads: backward passes on several threads may accumulate into the same leaf (shared or tied
// weights); grad(), set_grad() and zero_grad() take the leaf's lock, so they may be called while
// another thread's backward runs. Everything else (data, hooks, requires_grad) is set up before
// the threads start.

#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/node.h"

namespace tl {

struct VariableImpl {
  at::Tensor data;
  at::Tensor grad;  // read and written under grad_mutex (see Note [concurrent backward passes])
  std::mutex grad_mutex;
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::vector<GradHook> hooks;  // leaf hooks; non-leaf hooks live on grad_fn as pre-hooks
  std::string name;
};

class Variable {
 public:
  Variable() = default;
  /// A leaf over `data`. Only floating-point leaves may require grad.
  explicit Variable(at::Tensor data, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const at::Tensor& data() const;
  /// Mutable access to the storage handle (optimizers update parameters in place under no-grad).
  at::Tensor& mutable_data();
  void set_data(at::Tensor data);

  at::Tensor grad() const;
  void set_grad(at::Tensor grad);
  /// Drops the accumulated gradient.
  void zero_grad();

  bool requires_grad() const;
  /// Only for leaves: a non-leaf's requirement follows from its inputs.
  void set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;

  /// A new leaf sharing storage, cut from the graph.
  Variable detach() const;

  /// Backpropagate from this variable. `grad` defaults to 1 for a single-element variable.
  /// Without retain_graph the saved tensors of every node walked are freed.
  void backward(const at::Tensor& grad = {}, bool retain_graph = false) const;

  /// Hook on this variable's gradient; it may return a replacement (undefined: keep).
  /// On a leaf it sees the gradient summed over one backward before accumulation into grad().
  void register_hook(GradHook hook) const;

  const std::string& name() const;
  void set_name(std::string name);

  // Tensor conveniences.
  at::IntArrayRef sizes() const { return data().sizes(); }
  int64_t size(int64_t dim) const { return data().size(dim); }
  int64_t dim() const { return data().dim(); }
  int64_t numel() const { return data().numel(); }
  at::ScalarType scalar_type() const { return data().scalar_type(); }
  at::Device device() const { return data().device(); }
  at::TensorOptions options() const { return data().options(); }
  template <class T>
  T item() const {
    return data().item<T>();
  }

  VariableImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<VariableImpl>& impl_ptr() const { return impl_; }
  /// Internal: a non-leaf output of `fn`.
  static Variable make_output(at::Tensor data, std::shared_ptr<Node> fn, uint32_t output_nr);

 private:
  std::shared_ptr<VariableImpl> impl_;
};

using variable_list = std::vector<Variable>;

/// Backpropagate from several roots at once (gradients summed where graphs overlap).
void backward(const variable_list& roots, const std::vector<at::Tensor>& grads = {}, bool retain_graph = false);

/// The second half of a split backward (Note [split backward] in engine.cpp): the weight
/// gradients that backward_inputs() left for later. run() computes them and accumulates them
/// into the leaves' .grad, bit for bit as one backward() would have, and frees the ops' saved
/// tensors; destroying it without run() drops them. Move-only; not for concurrent use.
class DeferredWeightGrads {
 public:
  DeferredWeightGrads() = default;
  DeferredWeightGrads(DeferredWeightGrads&&) = default;
  DeferredWeightGrads& operator=(DeferredWeightGrads&&) = default;

  void run();
  /// Ops whose weight gradients are pending (0 once run).
  size_t ops() const { return ops_.size(); }
  /// Bytes held until run(): the pending ops' saved tensors and their output gradients.
  size_t held_bytes() const;

  struct Op {
    std::shared_ptr<Node> node;
    std::vector<at::Tensor> grads;       // gradients of the node's outputs, as B saw them
    c10::SmallVector<bool, 8> weights;  // the edges whose gradients W computes
  };

 private:
  friend DeferredWeightGrads backward_inputs(const variable_list&, const std::vector<at::Tensor>&,
                                             const variable_list&, bool);
  std::vector<Op> ops_;
  bool retain_graph_ = false;
};

/// The first half of a split backward: backpropagates from `roots` and accumulates the gradients
/// of `inputs` (leaves) into their .grad as backward() does; the gradients of every other leaf
/// that requires grad (the weights) are left to the returned object's run().
DeferredWeightGrads backward_inputs(const variable_list& roots, const std::vector<at::Tensor>& grads,
                                    const variable_list& inputs, bool retain_graph = false);

}  // namespace tl
