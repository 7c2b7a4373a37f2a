// Variable, Node, Context, Tape and grad mode: the engine's data structures.
#include <algorithm>
#include <atomic>
#include <sstream>
#include <unordered_set>

#include "autograd/function.h"

namespace tl {

// ---- grad mode ------------------------------------------------------------------------------
namespace {
thread_local bool grad_enabled = true;
thread_local Tape* current_tape = nullptr;
std::atomic<uint64_t> next_sequence_nr{1};
}  // namespace

bool GradMode::is_enabled() { return grad_enabled; }
void GradMode::set_enabled(bool enabled) { grad_enabled = enabled; }

// ---- Node -----------------------------------------------------------------------------------
Node::Node() : seq_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

void Node::add_pre_hook(uint32_t output_nr, GradHook hook) { pre_hooks_.emplace_back(output_nr, std::move(hook)); }

void Node::release() {
  if (released_.exchange(true, std::memory_order_acq_rel)) return;
  release_saved();
  // Clearing edges here (while the tape still owns every node) means no chain of shared_ptrs is
  // ever destroyed recursively.
  next_edges_.clear();
  pre_hooks_.clear();
}

std::vector<at::Tensor> Node::apply_subset(std::vector<at::Tensor>&& grads, const c10::SmallVector<bool, 8>& wanted) {
  std::vector<at::Tensor> out = apply(std::move(grads));
  for (size_t i = 0; i < out.size(); ++i)
    if (i >= wanted.size() || !wanted[i]) out[i] = at::Tensor();
  return out;
}

// ---- Context --------------------------------------------------------------------------------
void Context::save_for_backward(std::vector<at::Tensor> tensors) {
  versions_.clear();
  for (const auto& t : tensors) versions_.push_back(t.defined() ? t._version() : 0);
  saved_ = std::move(tensors);
}

const std::vector<at::Tensor>& Context::saved() const {
  TORCH_CHECK(!released_, "op '", op_name_,
              "': its saved tensors were already freed by an earlier backward; pass retain_graph=true "
              "to the first backward to run it twice");
  for (size_t i = 0; i < saved_.size(); ++i) {
    if (saved_[i].defined() && saved_[i]._version() != versions_[i]) {
      TORCH_CHECK(false, "op '", op_name_, "': saved tensor ", i, " (shape ", saved_[i].sizes(),
                  ") was modified in place after the forward (version ", versions_[i], " -> ", saved_[i]._version(),
                  "); an optimizer step or an in-place op ran before this backward. Run backward "
                  "first, or clone the tensor");
    }
  }
  return saved_;
}

size_t Context::saved_bytes() const {
  size_t n = 0;
  for (const auto& t : saved_)
    if (t.defined()) n += t.numel() * t.element_size();
  return n;
}

void Context::release() {
  released_ = true;
  saved_.clear();
  saved_data.clear();
}

namespace detail {
void make_edges(const InputList& inputs, EdgeList& edges, c10::SmallVector<bool, 8>& needs) {
  const size_t n = inputs.size();
  edges.resize(n);
  needs.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const Variable& v = *inputs[i];
    if (!v.defined() || !v.requires_grad()) continue;
    needs[i] = true;
    if (v.grad_fn()) {
      edges[i].fn = v.grad_fn();
      edges[i].input_nr = v.output_nr();
    } else {
      edges[i].leaf = v.impl_ptr();
    }
  }
}

OutputMeta meta_of(const at::Tensor& t) { return OutputMeta{shape_of(t.sizes()), t.options()}; }

void account_forward(const Context& ctx, const InputList& inputs, const at::Tensor* outs, size_t n_outs, Node* node) {
  NodeCost c;
  double largest = 0;
  for (size_t i = 0; i < n_outs; ++i) {
    const at::Tensor& o = outs[i];
    if (!o.defined()) continue;
    c.bytes += tensor_bytes(o);
    largest = std::max(largest, static_cast<double>(o.numel()));
    for (const Variable* v : inputs)
      if (v->defined() && o.is_alias_of(v->data())) c.view = true;
  }
  for (const Variable* v : inputs) {
    if (!v->defined()) continue;
    c.bytes += tensor_bytes(v->data());
    largest = std::max(largest, static_cast<double>(v->data().numel()));
  }
  if (c.view) {
    c.bytes = 0;
  } else {
    c.flops = ctx.flops_ >= 0 ? ctx.flops_ : largest;
    for (size_t i = 0; i < inputs.size(); ++i)
      c.input_flops.push_back(i < ctx.input_flops_.size() ? ctx.input_flops_[i] : c.flops);
  }
  if (CostMeter* m = CostMeter::current())
    m->add(OpCost{c.flops, c.bytes, c.view ? 0 : 1});
  if (node) node->cost_ = std::move(c);
}
}  // namespace detail

// ---- cost meter -----------------------------------------------------------------------------
namespace {
thread_local CostMeter* current_meter = nullptr;
}  // namespace

CostMeter* CostMeter::current() { return current_meter; }
CostMeterGuard::CostMeterGuard(CostMeter& meter) : prev_(current_meter) { current_meter = &meter; }
CostMeterGuard::~CostMeterGuard() { current_meter = prev_; }

// ---- Variable -------------------------------------------------------------------------------
namespace {
const at::Tensor& undefined_tensor() {
  static const at::Tensor t;
  return t;
}
const std::shared_ptr<Node>& null_node() {
  static const std::shared_ptr<Node> n;
  return n;
}
VariableImpl& checked(const std::shared_ptr<VariableImpl>& impl, const char* what) {
  TORCH_CHECK(impl, "Variable::", what, " called on an undefined Variable");
  return *impl;
}
}  // namespace

Variable::Variable(at::Tensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  impl_->data = std::move(data);
  if (requires_grad) set_requires_grad(true);
}

Variable Variable::make_output(at::Tensor data, std::shared_ptr<Node> fn, uint32_t output_nr) {
  Variable v;
  v.impl_ = std::make_shared<VariableImpl>();
  v.impl_->data = std::move(data);
  v.impl_->requires_grad = true;
  v.impl_->grad_fn = std::move(fn);
  v.impl_->output_nr = output_nr;
  return v;
}

const at::Tensor& Variable::data() const { return impl_ ? impl_->data : undefined_tensor(); }
at::Tensor& Variable::mutable_data() { return checked(impl_, "mutable_data").data; }
void Variable::set_data(at::Tensor data) { checked(impl_, "set_data").data = std::move(data); }
at::Tensor Variable::grad() const {
  if (!impl_) return at::Tensor();
  std::lock_guard<std::mutex> lock(impl_->grad_mutex);
  return impl_->grad;
}
void Variable::set_grad(at::Tensor grad) {
  auto& impl = checked(impl_, "set_grad");
  std::lock_guard<std::mutex> lock(impl.grad_mutex);
  impl.grad = std::move(grad);
}
void Variable::zero_grad() {
  if (!impl_) return;
  at::Tensor old;  // released outside the lock
  std::lock_guard<std::mutex> lock(impl_->grad_mutex);
  old = std::move(impl_->grad);
  impl_->grad = at::Tensor();
}
bool Variable::requires_grad() const { return impl_ && impl_->requires_grad; }
void Variable::set_requires_grad(bool requires_grad) {
  auto& impl = checked(impl_, "set_requires_grad");
  TORCH_CHECK(!impl.grad_fn,
              "set_requires_grad: only leaf variables can change requires_grad; this one is "
              "the output of '",
              impl.grad_fn->name(), "' (use detach() first)");
  TORCH_CHECK(
      !requires_grad || at::isFloatingType(impl.data.scalar_type()) || at::isComplexType(impl.data.scalar_type()),
      "set_requires_grad: only floating-point tensors can require grad, got ", impl.data.scalar_type());
  impl.requires_grad = requires_grad;
}
bool Variable::is_leaf() const { return !impl_ || !impl_->grad_fn; }
const std::shared_ptr<Node>& Variable::grad_fn() const { return impl_ ? impl_->grad_fn : null_node(); }
uint32_t Variable::output_nr() const { return impl_ ? impl_->output_nr : 0; }
Variable Variable::detach() const { return Variable(data(), false); }

void Variable::register_hook(GradHook hook) const {
  auto& impl = checked(impl_, "register_hook");
  TORCH_CHECK(impl.requires_grad,
              "register_hook: this variable does not require grad, so no gradient "
              "will ever reach the hook");
  if (impl.grad_fn) {
    impl.grad_fn->add_pre_hook(impl.output_nr, std::move(hook));
  } else {
    impl.hooks.push_back(std::move(hook));
  }
}

const std::string& Variable::name() const {
  static const std::string empty;
  return impl_ ? impl_->name : empty;
}
void Variable::set_name(std::string name) { checked(impl_, "set_name").name = std::move(name); }

void Variable::backward(const at::Tensor& grad, bool retain_graph) const {
  tl::backward({*this}, {grad}, retain_graph);
}

// ---- Tape -----------------------------------------------------------------------------------
Tape& Tape::current() {
  if (current_tape) return *current_tape;
  thread_local Tape default_tape;
  return default_tape;
}

Tape::~Tape() { reset(); }

void Tape::record(std::shared_ptr<Node> node) {
  node->tape_.store(this, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mutex_);
  nodes_.push_back(std::move(node));
  if (nodes_.size() >= next_gc_) collect_garbage_locked();
}

void Tape::reset() {
  std::vector<std::shared_ptr<Node>> nodes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    nodes.swap(nodes_);
    next_gc_ = 4096;
  }
  // Release newest first, then drop: every edge is cleared while all nodes are still owned here.
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    (*it)->release();
    (*it)->tape_.store(nullptr, std::memory_order_release);
  }
}

void Tape::collect_garbage() {
  std::lock_guard<std::mutex> lock(mutex_);
  collect_garbage_locked();
}

void Tape::collect_garbage_locked() {
  // Newest first: dropping a node drops its edges, which may leave older nodes unreachable in the
  // same sweep. A node whose only owner is this tape can never be reached by a backward again (a
  // backward in progress on another thread holds the nodes it has yet to run).
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    Node& n = **it;
    if (n.released() || it->use_count() == 1) {
      n.release();
      n.tape_.store(nullptr, std::memory_order_release);
    }
  }
  nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [](const auto& n) { return n->tape() == nullptr; }),
               nodes_.end());
  next_gc_ = std::max<size_t>(4096, 2 * nodes_.size());
}

int64_t Tape::index_of(const Node* node) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::lower_bound(nodes_.begin(), nodes_.end(), node->sequence_nr(),
                             [](const std::shared_ptr<Node>& n, uint64_t s) { return n->sequence_nr() < s; });
  if (it == nodes_.end() || it->get() != node) return -1;
  return it - nodes_.begin();
}

namespace {
// Tape::snapshot_sequence's body, under the tape's lock; `last_uses` may be null (not wanted).
bool snapshot_nodes(const std::vector<std::shared_ptr<Node>>& nodes, const Node* last, std::vector<uint64_t>& out,
                    std::vector<std::pair<int64_t, VariableImpl*>>* last_uses) {
  auto it = std::lower_bound(nodes.begin(), nodes.end(), last->sequence_nr(),
                             [](const std::shared_ptr<Node>& n, uint64_t s) { return n->sequence_nr() < s; });
  if (it == nodes.end() || it->get() != last) return false;
  const size_t count = static_cast<size_t>(it - nodes.begin()) + 1;
  out.resize(count);
  for (size_t i = 0; i < count; ++i) out[i] = nodes[i]->sequence_nr();
  if (!last_uses) return true;
  last_uses->clear();
  // Walked upwards, a leaf is first met at its lowest position: the order of discovery is by
  // position, then edge, the same on every process that recorded the same graph.
  std::unordered_set<const VariableImpl*> seen;
  for (size_t i = 0; i < count; ++i)
    for (const Edge& e : nodes[i]->next_edges())
      if (e.leaf && seen.insert(e.leaf.get()).second) last_uses->emplace_back(static_cast<int64_t>(i), e.leaf.get());
  std::stable_sort(last_uses->begin(), last_uses->end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return true;
}
}  // namespace

bool Tape::snapshot_sequence(const Node* last, std::vector<uint64_t>& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot_nodes(nodes_, last, out, nullptr);
}

bool Tape::snapshot_sequence(const Node* last, std::vector<uint64_t>& out,
                             std::vector<std::pair<int64_t, VariableImpl*>>& last_uses) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot_nodes(nodes_, last, out, &last_uses);
}

size_t Tape::saved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& node : nodes_) n += node->saved_bytes();
  return n;
}

std::string Tape::to_string() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream os;
  size_t total = 0;
  double flops = 0, moved = 0;
  os << "tape: " << nodes_.size() << " ops\n";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = *nodes_[i];
    os << "  [" << i << "] " << n.name() << " ->";
    for (const auto& o : n.outputs()) os << " " << at::IntArrayRef(o.sizes);
    size_t b = n.saved_bytes();
    total += b;
    flops += n.cost_.flops, moved += n.cost_.bytes;
    os << "  saved " << b << " B" << (n.released() ? " (released)" : "");
    if (n.cost_.view)
      os << "  view\n";
    else
      os << "  " << n.cost_.flops << " FLOPs, " << n.cost_.bytes << " B moved\n";
  }
  os << "  total saved for backward: " << total << " B; forward " << flops << " FLOPs, " << moved
     << " B moved (Note [op costs])\n";
  return os.str();
}

TapeGuard::TapeGuard(Tape& tape) : prev_(current_tape) { current_tape = &tape; }
TapeGuard::~TapeGuard() { current_tape = prev_; }

}  // namespace tl
