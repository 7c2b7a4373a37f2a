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

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

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
  /// Non-tensor values for backward (dims, flags, scalars).
  std::unordered_map<std::string, at::IValue> saved_data;

  size_t saved_bytes() const;
  void release();

  // Set by the Function machinery.
  std::vector<bool> needs_input_grad_;
  const char* op_name_ = "?";

 private:
  std::vector<at::Tensor> saved_;
  std::vector<int64_t> versions_;
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
void collect(std::vector<const Variable*>& out, const A& a) {
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

/// Builds the graph-side node: edges to the Variable inputs and the op's Context.
std::vector<Edge> make_edges(const std::vector<const Variable*>& inputs, std::vector<bool>& needs);
OutputMeta meta_of(const at::Tensor& t);

template <class T>
class FunctionNode final : public Node {
 public:
  Context ctx;
  std::vector<at::Tensor> apply(std::vector<at::Tensor>&& grads) override {
    auto out = T::backward(ctx, std::move(grads));
    return out;
  }
  std::string name() const override { return op_name<T>::get(); }
  size_t saved_bytes() const override { return ctx.saved_bytes(); }

 protected:
  void release_saved() override { ctx.release(); }
};

}  // namespace detail

template <class T>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    using Out = decltype(T::forward(std::declval<Context&>(), detail::unwrap(std::forward<Args>(args))...));
    static_assert(std::is_same<Out, at::Tensor>::value || std::is_same<Out, std::vector<at::Tensor>>::value,
                  "forward must return at::Tensor or std::vector<at::Tensor>");
    std::vector<const Variable*> inputs;
    inputs.reserve(sizeof...(Args));
    (detail::collect(inputs, args), ...);

    bool needs_grad = false;
    if (GradMode::is_enabled()) {
      for (const Variable* v : inputs) needs_grad = needs_grad || (v->defined() && v->requires_grad());
    }
    if (!needs_grad) {
      Context ctx;
      ctx.op_name_ = detail::op_name<T>::get();
      Out out = T::forward(ctx, detail::unwrap(std::forward<Args>(args))...);
      return wrap(std::move(out), nullptr);
    }
    auto node = std::make_shared<detail::FunctionNode<T>>();
    node->ctx.op_name_ = detail::op_name<T>::get();
    node->next_edges_ = detail::make_edges(inputs, node->ctx.needs_input_grad_);
    Out out = T::forward(node->ctx, detail::unwrap(std::forward<Args>(args))...);
    return wrap(std::move(out), std::move(node));
  }

 private:
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
