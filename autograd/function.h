#pragma once
// Function<T>: the way to add a differentiable op. T provides
//
//   static at::Tensor forward(Context& ctx, <args>...);            // or std::vector<at::Tensor>
//   static std::vector<at::Tensor> backward(Context& ctx, std::vector<at::Tensor> grad_outputs);
//
// and users call T::apply(<args>...), passing Variables where forward takes tensors. Variable
// arguments arrive in forward as `const at::Tensor&`, a variable_list as `std::vector<at::Tensor>`
// (each element counts as one Variable argument); every other argument is forwarded as is.
// backward returns one gradient per Variable argument, in order (undefined where
// !ctx.needs_input_grad(i)). When no Variable argument requires grad (or grad mode is off),
// nothing is recorded and the Context is a throwaway.
//
// What backward needs besides tensors goes in one of two places:
//  - typed state: T declares `struct Saved { ... };` (default-constructible, movable) and then
//    takes it as the second parameter of both functions,
//        static at::Tensor forward(Context& ctx, Saved& saved, <args>...);
//        static std::vector<at::Tensor> backward(Context& ctx, const Saved& saved, std::vector<at::Tensor>);
//    The node holds it as a plain member: no allocation per attribute, and a misspelt field is a
//    compile error. Every built-in op does this.
//  - ctx.saved_data, a string-keyed map of IValues, for quick user extensions.
// Saved tensors go through ctx.save_for_backward either way (it checks in-place modification).
//
// A split backward (Note [split backward] in engine.cpp) may run an op's backward twice, first for
// its inputs that are not weights, later for its weights, each time with ctx.needs_input_grad
// narrowed to that part. An op whose backward updates state (its Saved is not read-only there)
// declares `static constexpr bool kSplitBackward = false;` and then runs whole in the first part.
//
// Note [ATen's autograd is not involved]
// The tensors inside Variables never require grad in ATen's sense, so ATen's autograd layer
// (VariableType) would only check that and redispatch: every op's forward runs under
// at::AutoDispatchBelowAutograd, which skips it. The next layer, ADInplaceOrView, bumps version
// counters of in-place ops and makes view outputs share their base's version counter; that is what
// lets ctx.saved() notice an in-place change of a saved tensor made through a view, so it stays on
// by default. An op whose outputs never alias its inputs and which modifies no caller-visible
// tensor in place declares
//     static constexpr bool kFreshOutputs = true;
// and runs under at::AutoDispatchBelowADInplaceOrView instead, as ATen's own autograd kernels run
// the kernels below them. That also keeps ATen's composite kernels (bmm on CPU selects each batch
// element) from building view metadata for every internal view. All built-in ops but the view ops
// (reshape, permute, narrow, split, ...) and batch_norm (which updates the running statistics in
// place) declare it. Backward functions run under the same exclusion (engine.cpp); gradients need
// no view tracking.

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <initializer_list>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/cost.h"
#include "autograd/grad_mode.h"
#include "autograd/tape.h"
#include "autograd/variable.h"

namespace tl {

class Context {
 public:
  /// Keep tensors for backward. Their in-place version is recorded: modifying one before
  /// backward (e.g. an optimizer step while a micro-batch's backward is pending) is detected.
  void save_for_backward(std::vector<at::Tensor> tensors);
  /// The saved tensors; an error if they were freed by an earlier backward.
  const std::vector<at::Tensor>& saved() const;
  /// Whether the i-th Variable argument of forward needs a gradient.
  bool needs_input_grad(size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }
  /// Non-tensor values for backward in user extensions (dims, flags, scalars). Built-in ops use
  /// typed state instead (see the top of this file).
  std::unordered_map<std::string, at::IValue> saved_data;

  size_t saved_bytes() const;
  void release();

  /// The op's FLOPs (Note [op costs] in autograd/cost.h): forward, and the gradient of each
  /// Variable argument in order (missing ones: the forward's again). Ops that do not call it
  /// count one FLOP per element of their largest operand.
  void set_flops(double forward, std::initializer_list<double> per_input_gradient = {}) {
    flops_ = forward;
    input_flops_.assign(per_input_gradient.begin(), per_input_gradient.end());
  }

  // Set by the Function machinery.
  c10::SmallVector<bool, 8> needs_input_grad_;
  const char* op_name_ = "?";
  double flops_ = -1;  // -1: not declared
  c10::SmallVector<double, 3> input_flops_;

 private:
  std::vector<at::Tensor> saved_;
  c10::SmallVector<int64_t, 4> versions_;
  bool released_ = false;
};

namespace detail {

template <class A>
using is_variable = std::is_same<std::decay_t<A>, Variable>;

template <class A>
using is_variable_list = std::is_same<std::decay_t<A>, std::vector<Variable>>;

template <class A>
decltype(auto) unwrap(A&& a) {
  if constexpr (is_variable<A>::value) {
    return static_cast<const at::Tensor&>(a.data());
  } else if constexpr (is_variable_list<A>::value) {
    std::vector<at::Tensor> tensors;
    tensors.reserve(a.size());
    for (const auto& v : a) tensors.push_back(v.data());
    return tensors;
  } else {
    return std::forward<A>(a);
  }
}

template <class A>
void collect(c10::SmallVector<const Variable*, 4>& out, const A& a) {
  if constexpr (is_variable<A>::value) {
    out.push_back(&a);
  } else if constexpr (is_variable_list<A>::value) {
    for (const auto& v : a) out.push_back(&v);
  }
}

// Demangled-ish name of T for tape printing: T::name if it defines one.
template <class T, class = void>
struct op_name {
  static const char* get() { return typeid(T).name(); }
};
template <class T>
struct op_name<T, std::void_t<decltype(T::name)>> {
  static const char* get() { return T::name; }
};

// T::Saved when T declares one (typed state), else an empty placeholder.
struct NoSaved {};
// T::kSplitBackward, true when T does not declare it (Note [split backward] in engine.cpp).
template <class T, class = void>
struct split_backward : std::true_type {};
template <class T>
struct split_backward<T, std::void_t<decltype(T::kSplitBackward)>> : std::bool_constant<T::kSplitBackward> {};

// T::kFreshOutputs, false when T does not declare it.
template <class T, class = void>
struct fresh_outputs : std::false_type {};
template <class T>
struct fresh_outputs<T, std::void_t<decltype(T::kFreshOutputs)>> : std::bool_constant<T::kFreshOutputs> {};

template <class T, class = void>
struct saved_of {
  using type = NoSaved;
  static constexpr bool typed = false;
};
template <class T>
struct saved_of<T, std::void_t<typename T::Saved>> {
  using type = typename T::Saved;
  static constexpr bool typed = true;
};

using InputList = c10::SmallVector<const Variable*, 4>;

/// Fills the node's edges to the Variable inputs and the op's needs_input_grad.
void make_edges(const InputList& inputs, EdgeList& edges, c10::SmallVector<bool, 8>& needs);
/// The forward cost of an op that ran (Note [op costs]): into `node` when it is recorded, and
/// to the thread's CostMeter when there is one. `outs`: its outputs.
void account_forward(const Context& ctx, const InputList& inputs, const at::Tensor* outs, size_t n_outs, Node* node);
OutputMeta meta_of(const at::Tensor& t);

template <class T>
class FunctionNode final : public Node {
 public:
  Context ctx;
  typename saved_of<T>::type saved;

  std::vector<at::Tensor> apply(std::vector<at::Tensor>&& grads) override {
    // The engine runs this under at::AutoDispatchBelowADInplaceOrView (Note [ATen's autograd is not involved]).
    if constexpr (saved_of<T>::typed) {
      return T::backward(ctx, saved, std::move(grads));
    } else {
      return T::backward(ctx, std::move(grads));
    }
  }
  std::vector<at::Tensor> apply_subset(std::vector<at::Tensor>&& grads, const c10::SmallVector<bool, 8>& wanted) override {
    // The op's backward asks ctx.needs_input_grad(i): narrowed to `wanted` for this call only.
    const c10::SmallVector<bool, 8> needs = ctx.needs_input_grad_;
    for (size_t i = 0; i < ctx.needs_input_grad_.size(); ++i)
      ctx.needs_input_grad_[i] = needs[i] && i < wanted.size() && wanted[i];
    std::vector<at::Tensor> out;
    try {
      out = apply(std::move(grads));
    } catch (...) {
      ctx.needs_input_grad_ = needs;
      throw;
    }
    ctx.needs_input_grad_ = needs;
    for (size_t i = 0; i < out.size(); ++i)  // an op may compute more than it was asked for
      if (i >= wanted.size() || !wanted[i]) out[i] = at::Tensor();
    return out;
  }
  bool splits_backward() const override { return split_backward<T>::value; }
  std::string name() const override { return op_name<T>::get(); }
  size_t saved_bytes() const override { return ctx.saved_bytes(); }

 protected:
  void release_saved() override {
    ctx.release();
    saved = typename saved_of<T>::type{};
  }
};

}  // namespace detail

template <class T>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    using Saved = typename detail::saved_of<T>::type;
    using Out = decltype(call_forward(std::declval<Context&>(), std::declval<Saved&>(),
                                      detail::unwrap(std::forward<Args>(args))...));
    static_assert(std::is_same<Out, at::Tensor>::value || std::is_same<Out, std::vector<at::Tensor>>::value,
                  "forward must return at::Tensor or std::vector<at::Tensor>");
    detail::InputList inputs;
    (detail::collect(inputs, args), ...);

    bool needs_grad = false;
    if (GradMode::is_enabled()) {
      for (const Variable* v : inputs) needs_grad = needs_grad || (v->defined() && v->requires_grad());
    }
    // Note [ATen's autograd is not involved]
    using BelowGuard = std::conditional_t<detail::fresh_outputs<T>::value, at::AutoDispatchBelowADInplaceOrView,
                                          at::AutoDispatchBelowAutograd>;
    BelowGuard below;
    if (!needs_grad) {
      Context ctx;
      ctx.op_name_ = detail::op_name<T>::get();
      Saved saved;
      Out out = call_forward(ctx, saved, detail::unwrap(std::forward<Args>(args))...);
      if (CostMeter::current()) account(ctx, inputs, out, nullptr);
      return wrap(std::move(out), nullptr);
    }
    auto node = std::make_shared<detail::FunctionNode<T>>();
    node->ctx.op_name_ = detail::op_name<T>::get();
    detail::make_edges(inputs, node->next_edges_, node->ctx.needs_input_grad_);
    Out out = call_forward(node->ctx, node->saved, detail::unwrap(std::forward<Args>(args))...);
    account(node->ctx, inputs, out, node.get());
    return wrap(std::move(out), std::move(node));
  }

 private:
  static void account(const Context& ctx, const detail::InputList& inputs, const at::Tensor& out, Node* node) {
    detail::account_forward(ctx, inputs, &out, 1, node);
  }
  static void account(const Context& ctx, const detail::InputList& inputs, const std::vector<at::Tensor>& outs,
                      Node* node) {
    detail::account_forward(ctx, inputs, outs.data(), outs.size(), node);
  }
  template <class Saved, class... U>
  static auto call_forward(Context& ctx, Saved& saved, U&&... u) {
    if constexpr (detail::saved_of<T>::typed) {
      return T::forward(ctx, saved, std::forward<U>(u)...);
    } else {
      return T::forward(ctx, std::forward<U>(u)...);
    }
  }
  static Variable wrap(at::Tensor out, std::shared_ptr<Node> node) {
    if (!node) return Variable(std::move(out));
    node->outputs_.push_back(detail::meta_of(out));
    Tape::current().record(node);
    return Variable::make_output(std::move(out), std::move(node), 0);
  }
  static variable_list wrap(std::vector<at::Tensor> outs, std::shared_ptr<Node> node) {
    variable_list result;
    result.reserve(outs.size());
    if (!node) {
      for (auto& t : outs) result.emplace_back(std::move(t));
      return result;
    }
    for (auto& t : outs) node->outputs_.push_back(detail::meta_of(t));
    Tape::current().record(node);
    for (size_t i = 0; i < outs.size(); ++i)
      result.push_back(Variable::make_output(std::move(outs[i]), node, static_cast<uint32_t>(i)));
    return result;
  }
};

}  // namespace tl
