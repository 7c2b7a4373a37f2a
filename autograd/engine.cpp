// The backward pass. Nodes on the root's tape are visited by walking that tape in reverse
// (execution order reversed is a topological order). A graph may also reach nodes recorded on
// other tapes (a value computed under another TapeGuard and used here); those are merged in by
// their global sequence number, so every node runs once, after all of its consumers.
//
// Leaf gradients are summed over the whole backward first, then passed through the leaf's hooks
// once, then accumulated into .grad through one checked sink (at the pass's end, or as soon as the
// leaf is final: Note [leaves released when final] in autograd/leaf_final.h).
//
// Note [concurrent backward passes]
// Everything one backward pass needs to remember lives in its GraphTask (as in PyTorch's
// torch/csrc/autograd/graph_task.h), not on the nodes: the gradient received so far for each
// pending node (a slot per position of the root's tape, found from a node's sequence number in a
// snapshot of the tape's sequence numbers taken at the start), the pending nodes of other tapes
// (a map and a queue ordered by sequence number) and the summed leaf gradients. Nodes are only
// read during backward (edges, output metadata, saved state), and released by the one pass that
// runs them. So two backward passes over disjoint graphs can run at the same time on two threads,
// whether their graphs sit on two tapes (two pipeline stages) or on one.
//
// What is shared, and how it is made safe:
//  - a leaf reached by both passes (shared or tied weights): its .grad is read and written only
//    under the leaf's own mutex (VariableImpl::grad_mutex); each pass sums its contributions
//    privately first and takes the lock once per leaf, so contention is one lock per leaf per
//    backward, and the result is the same sum in some order (exact for integer-valued tensors);
//  - a tape: its node list is changed (record, garbage collection, reset) and snapshotted under
//    the tape's mutex. A pass holds a shared_ptr to every node it has yet to run, so another
//    thread's garbage collection (which frees nodes only the tape still owns) cannot free them;
//  - Node::released_ and Node::tape_ are atomics (a garbage collection reads them while the pass
//    that ran the node sets them).
// Graphs that share a non-leaf node may not be backpropagated concurrently: the first pass to run
// the node frees it (without retain_graph), exactly as when the two passes run one after the other.

//
// Note [split backward]
// Zero-bubble pipeline schedules (Qi et al., ICLR 2024) split a stage's backward in two: B, the
// gradients that flow to the stage's inputs (the next rank waits for them), and W, the weight
// gradients (nobody waits: they fill bubbles later). backward_inputs() runs B as one ordinary
// pass with a list of input leaves. Every op whose edges reach other leaves (the weights: leaves
// that require grad, found from the graph, not from a list of parameters) runs its backward for
// its other inputs only (Node::apply_subset), and is kept, with the gradients of its outputs,
// in a DeferredWeightGrads. Its run() is W: each kept op's backward for its weights, in the order
// B met them, summed into the leaves exactly as the one full backward sums them, then the ops are
// freed. Each gradient is computed by the same kernel on the same operands as in one backward, and
// every leaf's terms are added in the same order, so B + W is bit-identical to backward() on the
// CPU. An op that must not run its backward twice (Node::splits_backward false: the boundary's
// wire, which encodes) runs whole in B. Between B and W the kept ops hold their saved tensors and
// the output gradients: DeferredWeightGrads::held_bytes().

#include <algorithm>
#include <queue>
#include <unordered_set>
#include <sstream>
#include <unordered_map>

#include "autograd/function.h"
#include "autograd/leaf_final.h"

namespace tl {
namespace {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Checks a gradient against the metadata of the output it is for. Names are built only on failure.
void check_grad(const at::Tensor& g, const OutputMeta& meta, const Node& producer, const Node& target, size_t index) {
  if (C10_UNLIKELY(!g.sizes().equals(meta.sizes))) {
    TORCH_CHECK(false, "backward of '", producer.name(), "' produced a gradient of shape ", shape_str(g.sizes()),
                " for output ", index, " of '", target.name(), "', whose shape is ", shape_str(meta.sizes));
  }
  if (C10_UNLIKELY(g.scalar_type() != meta.options.dtype().toScalarType())) {
    TORCH_CHECK(false, "backward of '", producer.name(), "' produced a ", g.scalar_type(), " gradient for output ",
                index, " of '", target.name(), "', which is ", meta.options.dtype());
  }
}

// The one place gradients are summed into a buffer.
void accumulate(at::Tensor& slot, at::Tensor g) {
  if (!slot.defined()) {
    slot = std::move(g);
  } else {
    slot = slot + g;  // out of place: `slot` may alias a tensor a hook or the user still holds
    charge(OpCost{static_cast<double>(g.numel()), 3 * tensor_bytes(g), 1});  // Note [op costs]
  }
}

double bytes_of(const std::vector<at::Tensor>& ts) {
  double b = 0;
  for (const auto& t : ts) b += tensor_bytes(t);
  return b;
}

// Runs a node's backward (all of it, or the inputs marked in `wanted`) and charges the thread's
// CostMeter with it (Note [op costs] in autograd/cost.h): the recorded FLOPs of each gradient
// computed; the output gradients and saved tensors read, the input gradients written.
std::vector<at::Tensor> run_backward(Node& node, std::vector<at::Tensor>&& grads,
                                     const c10::SmallVector<bool, 8>* wanted) {
  CostMeter* meter = CostMeter::current();
  const double read = meter && !node.cost_.view ? bytes_of(grads) + static_cast<double>(node.saved_bytes()) : 0;
  std::vector<at::Tensor> in_grads = wanted ? node.apply_subset(std::move(grads), *wanted) : node.apply(std::move(grads));
  if (meter && !node.cost_.view) {
    OpCost c{0, read, 0};
    for (size_t j = 0; j < in_grads.size(); ++j) {
      if (!in_grads[j].defined()) continue;
      c.flops += j < node.cost_.input_flops.size() ? node.cost_.input_flops[j] : node.cost_.flops;
      c.bytes += tensor_bytes(in_grads[j]);
      c.kernels += 1;
    }
    meter->add(c);
  }
  return in_grads;
}

// Gradients received so far by one pending node, and the node itself (kept alive until it runs).
struct Slot {
  std::shared_ptr<Node> node;
  std::vector<at::Tensor> grads;  // one per output of node once anything arrived
};

class GraphTask {
 public:
  explicit GraphTask(bool retain_graph) : retain_graph_(retain_graph) {}

  /// Note [leaves released when final]: `on_final` hears of each leaf once its gradient is in .grad.
  void release_leaves(const LeafFinalScope::Listener* on_final) { on_final_ = on_final; }

  /// Split mode (Note [split backward]): gradients of `inputs` now, of every other leaf into `later`.
  void split(const std::unordered_set<const VariableImpl*>* inputs, std::vector<DeferredWeightGrads::Op>* later) {
    inputs_ = inputs;
    later_ = later;
  }

  /// W of Note [split backward]: the kept ops' backward for their weights, in order, then the leaves.
  void run_deferred(std::vector<DeferredWeightGrads::Op>& ops) {
    at::AutoDispatchBelowADInplaceOrView below;  // Note [ATen's autograd is not involved] (function.h)
    for (auto& op : ops) {
      std::shared_ptr<Node> node = std::move(op.node);
      TORCH_CHECK(!node->released(), "backward (weights): op '", node->name(),
                  "' was freed before its weight gradients ran (its tape was reset between the two passes)");
      std::vector<at::Tensor> in_grads = run_backward(*node, std::move(op.grads), &op.weights);
      const auto& edges = node->next_edges();
      TORCH_CHECK(in_grads.size() == edges.size(), "backward of '", node->name(), "' returned ", in_grads.size(),
                  " gradients for ", edges.size(), " inputs");
      for (size_t j = 0; j < edges.size(); ++j)
        if (op.weights[j] && edges[j].leaf && in_grads[j].defined()) add_leaf(edges[j].leaf, std::move(in_grads[j]));
      if (!retain_graph_) node->release();
    }
    ops.clear();
    finish_leaves();
  }

  void seed(const Variable& root, at::Tensor grad) {
    TORCH_CHECK(root.defined(), "backward: root variable is undefined");
    TORCH_CHECK(root.requires_grad(),
                "backward: the variable does not require grad (it was computed from no "
                "input that requires grad, or under NoGradGuard)");
    if (!grad.defined()) {
      TORCH_CHECK(root.numel() == 1, "backward: a gradient must be given for a non-scalar root of shape ",
                  shape_str(root.sizes()));
      grad = at::ones_like(root.data());
    }
    TORCH_CHECK(grad.sizes().equals(root.sizes()), "backward: gradient of shape ", shape_str(grad.sizes()),
                " given for a root of shape ", shape_str(root.sizes()));
    if (root.is_leaf()) {
      add_leaf(root.impl_ptr(), std::move(grad));
      return;
    }
    const std::shared_ptr<Node>& n = root.grad_fn();
    TORCH_CHECK(!n->released(), "backward: the graph of this variable was already freed (op '", n->name(),
                "'); pass retain_graph=true to the first backward to run it twice");
    if (!primary_ || n->sequence_nr() > primary_->sequence_nr()) primary_ = n.get();
    seeds_.push_back({n, root.output_nr(), std::move(grad)});
  }

  void run() {
    if (primary_) {
      // Roots on several tapes: the newest root's tape is walked; the others are merged in by
      // sequence number like any other cross-tape node.
      Tape* tape = primary_->tape();
      const bool snapped = tape && (on_final_ ? tape->snapshot_sequence(primary_, seqs_, last_uses_)
                                              : tape->snapshot_sequence(primary_, seqs_));
      if (snapped) {
        tape_ = tape;
        slots_.resize(seqs_.size());
      }
      for (auto& s : seeds_) add_to_node(s.node, s.input_nr, std::move(s.grad), static_cast<int64_t>(seqs_.size()));
      seeds_.clear();
      for (int64_t i = static_cast<int64_t>(seqs_.size()) - 1; i >= 0; --i) {
        drain_foreign_above(seqs_[i]);
        if (slots_[i].node) process(slots_[i], i);
        release_final_leaves(i);
      }
      drain_foreign_above(0);
    }
    finish_leaves();
    if (tape_ && !retain_graph_) tape_->collect_garbage();
  }

 private:
  struct Seed {
    std::shared_ptr<Node> node;
    uint32_t input_nr;
    at::Tensor grad;
  };

  // Position of sequence number `seq` in seqs_[0, hint), or -1. Producers are usually recorded
  // shortly before their consumer, so the search gallops down from `hint` before bisecting.
  int64_t find_position(uint64_t seq, int64_t hint) const {
    int64_t hi = hint, lo = hint - 1, step = 1;
    while (lo > 0 && seqs_[lo] > seq) {
      hi = lo;
      lo = std::max<int64_t>(0, lo - step);
      step <<= 1;
    }
    if (lo < 0) return -1;
    auto first = seqs_.begin() + lo, last = seqs_.begin() + hi;
    auto it = std::lower_bound(first, last, seq);
    return (it != last && *it == seq) ? it - seqs_.begin() : -1;
  }

  // Adds gradient `g` for output `index` of `target`; `hint` bounds its position on the walked
  // tape from above (the position of the node that produced the gradient).
  void add_to_node(const std::shared_ptr<Node>& target, uint32_t index, at::Tensor g, int64_t hint) {
    Slot* slot = nullptr;
    if (tape_ && target->tape() == tape_) {
      const int64_t pos = find_position(target->sequence_nr(), hint);
      if (pos >= 0) slot = &slots_[pos];
    }
    if (!slot) {  // another tape's node (or one no longer on any tape: it fails when run)
      auto [it, inserted] = foreign_index_.try_emplace(target.get(), foreign_slots_.size());
      if (inserted) {
        foreign_slots_.emplace_back();
        foreign_queue_.push({target->sequence_nr(), it->second});
      }
      slot = &foreign_slots_[it->second];
    }
    if (!slot->node) {
      slot->node = target;
      slot->grads.resize(target->outputs().size());
    }
    accumulate(slot->grads[index], std::move(g));
  }

  void add_leaf(const std::shared_ptr<VariableImpl>& leaf, at::Tensor g) {
    if (C10_UNLIKELY(!released_.empty()) && released_.count(leaf.get()))
      TORCH_CHECK(false, "backward: ", leaf->name.empty() ? std::string("a leaf") : "leaf '" + leaf->name + "'",
                  " got a gradient after it was released as final (Note [leaves released when final]): a node "
                  "recorded on another tape, before the leaf's last use on the walked tape, reaches it; run this "
                  "backward without a LeafFinalScope");
    // Few leaves (the common case): a linear scan beats hashing.
    if (leaf_index_.empty()) {
      for (auto& [l, acc] : leaves_) {
        if (l.get() == leaf.get()) {
          accumulate(acc, std::move(g));
          return;
        }
      }
      leaves_.emplace_back(leaf, std::move(g));
      if (leaves_.size() > 16) {
        for (size_t i = 0; i < leaves_.size(); ++i) leaf_index_.emplace(leaves_[i].first.get(), i);
      }
      return;
    }
    auto [it, inserted] = leaf_index_.try_emplace(leaf.get(), leaves_.size());
    if (inserted) {
      leaves_.emplace_back(leaf, std::move(g));
    } else {
      accumulate(leaves_[it->second].second, std::move(g));
    }
  }

  void drain_foreign_above(uint64_t seq) {
    while (!foreign_queue_.empty() && foreign_queue_.top().first > seq) {
      const size_t index = foreign_queue_.top().second;
      foreign_queue_.pop();
      // Its producers on the walked tape lie below the first position with a larger sequence number.
      const uint64_t s = foreign_slots_[index].node->sequence_nr();
      const int64_t hint = std::upper_bound(seqs_.begin(), seqs_.end(), s) - seqs_.begin();
      process(foreign_slots_[index], hint);
    }
  }

  void process(Slot& slot, int64_t hint) {
    at::AutoDispatchBelowADInplaceOrView below;  // Note [ATen's autograd is not involved] (function.h)
    // Moved out first: `slot` may live in foreign_slots_, which add_to_node can grow.
    std::shared_ptr<Node> node = std::move(slot.node);
    std::vector<at::Tensor> grads = std::move(slot.grads);
    slot.grads.clear();
    TORCH_CHECK(!node->released(), "backward: op '", node->name(),
                "' was already freed by an earlier backward (or "
                "its tape was reset); pass retain_graph=true to the first backward to run it twice");
    const auto& outs = node->outputs();
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) grads[i] = at::zeros(outs[i].sizes, outs[i].options);
    }
    for (auto& [index, hook] : node->pre_hooks_) {
      at::Tensor r = hook(grads[index]);
      if (r.defined()) {
        check_grad(r, outs[index], *node, *node, index);
        grads[index] = std::move(r);
      }
    }
    const auto& edges = node->next_edges();
    bool kept = false;  // Note [split backward]: its weight gradients wait for W
    std::vector<at::Tensor> in_grads;
    if (later_ && node->splits_backward()) {
      c10::SmallVector<bool, 8> now(edges.size(), false), weights(edges.size(), false);
      bool any_now = false;
      for (size_t j = 0; j < edges.size(); ++j) {
        const Edge& e = edges[j];
        if (!e.valid()) continue;
        if (e.leaf && !inputs_->count(e.leaf.get()))
          weights[j] = kept = true;
        else
          now[j] = any_now = true;
      }
      if (kept) {
        // The output gradients are kept as handles: a backward reads its gradients, never writes them.
        later_->push_back({node, grads, weights});
        in_grads = any_now ? run_backward(*node, std::move(grads), &now) : std::vector<at::Tensor>(edges.size());
      }
    }
    if (!kept) in_grads = run_backward(*node, std::move(grads), nullptr);
    TORCH_CHECK(in_grads.size() == edges.size(), "backward of '", node->name(), "' returned ", in_grads.size(),
                " gradients for ", edges.size(), " inputs");
    for (size_t j = 0; j < edges.size(); ++j) {
      const Edge& e = edges[j];
      if (!e.valid() || !in_grads[j].defined()) continue;
      if (e.leaf) {
        add_leaf(e.leaf, std::move(in_grads[j]));
        continue;
      }
      check_grad(in_grads[j], e.fn->outputs()[e.input_nr], *node, *e.fn, e.input_nr);
      add_to_node(e.fn, e.input_nr, std::move(in_grads[j]), hint);
    }
    if (!retain_graph_ && !kept) node->release();
  }

  // Note [leaves released when final]: the leaves whose lowest use on the walked tape is at
  // `position` or above, now that the walk has passed it.
  void release_final_leaves(int64_t position) {
    for (; next_release_ < last_uses_.size() && last_uses_[next_release_].first >= position; ++next_release_) {
      VariableImpl* leaf = last_uses_[next_release_].second;
      const size_t i = leaf_position(leaf);
      if (i == leaves_.size()) continue;  // no gradient reached it (yet): released at the end, if ever
      finish_leaf(leaves_[i].first, leaves_[i].second);
      released_.insert(leaf);
      (*on_final_)(leaf);
    }
  }

  // Index of `leaf` in leaves_, or leaves_.size().
  size_t leaf_position(const VariableImpl* leaf) const {
    if (!leaf_index_.empty()) {
      auto it = leaf_index_.find(const_cast<VariableImpl*>(leaf));
      return it == leaf_index_.end() ? leaves_.size() : it->second;
    }
    for (size_t i = 0; i < leaves_.size(); ++i)
      if (leaves_[i].first.get() == leaf) return i;
    return leaves_.size();
  }

  void finish_leaves() {
    for (auto& [leaf, g] : leaves_) {
      if (!released_.empty() && released_.count(leaf.get())) continue;
      finish_leaf(leaf, g);
      if (on_final_) (*on_final_)(leaf.get());
    }
  }

  void finish_leaf(const std::shared_ptr<VariableImpl>& leaf, at::Tensor& g) {
    for (auto& hook : leaf->hooks) {
      at::Tensor r = hook(g);
      if (r.defined()) g = std::move(r);
    }
    if (C10_UNLIKELY(!g.sizes().equals(leaf->data.sizes()) || g.scalar_type() != leaf->data.scalar_type())) {
      const std::string who = leaf->name.empty() ? std::string("a leaf") : "leaf '" + leaf->name + "'";
      TORCH_CHECK(g.sizes().equals(leaf->data.sizes()), "backward: gradient for ", who, " has shape ",
                  shape_str(g.sizes()), " but the variable has shape ", shape_str(leaf->data.sizes()));
      TORCH_CHECK(false, "backward: gradient for ", who, " is ", g.scalar_type(), " but the variable is ",
                  leaf->data.scalar_type());
    }
    std::lock_guard<std::mutex> lock(leaf->grad_mutex);
    if (leaf->grad.defined()) {
      leaf->grad.add_(g);
    } else {
      // Own the memory: the incoming gradient may alias another tensor.
      const bool owned = g.is_contiguous() && g.storage_offset() == 0 && g.storage().use_count() == 1 &&
                         g.storage().nbytes() == g.numel() * g.element_size();
      leaf->grad = owned ? g : g.clone(at::MemoryFormat::Contiguous);
    }
  }

  bool retain_graph_;
  Node* primary_ = nullptr;
  std::vector<Seed> seeds_;
  // The walked tape: sequence numbers of its nodes up to the primary root, and one slot each.
  Tape* tape_ = nullptr;
  std::vector<uint64_t> seqs_;
  std::vector<Slot> slots_;
  // Pending nodes of other tapes, newest first.
  std::unordered_map<Node*, size_t> foreign_index_;
  std::vector<Slot> foreign_slots_;
  std::priority_queue<std::pair<uint64_t, size_t>> foreign_queue_;
  // Summed leaf gradients.
  std::vector<std::pair<std::shared_ptr<VariableImpl>, at::Tensor>> leaves_;
  // Note [leaves released when final]: the listener, each leaf's lowest use on the walked tape
  // (by position descending), how many of those were passed, and the leaves released so far.
  const LeafFinalScope::Listener* on_final_ = nullptr;
  std::vector<std::pair<int64_t, VariableImpl*>> last_uses_;
  size_t next_release_ = 0;
  std::unordered_set<const VariableImpl*> released_;
  std::unordered_map<VariableImpl*, size_t> leaf_index_;  // used once there are many leaves
  // Split mode: the input leaves, and where the ops with weights go.
  const std::unordered_set<const VariableImpl*>* inputs_ = nullptr;
  std::vector<DeferredWeightGrads::Op>* later_ = nullptr;
};

}  // namespace

namespace {
thread_local const LeafFinalScope::Listener* current_leaf_listener = nullptr;
}  // namespace

LeafFinalScope::LeafFinalScope(Listener on_final) : on_final_(std::move(on_final)), prev_(current_leaf_listener) {
  current_leaf_listener = on_final_ ? &on_final_ : nullptr;
}
LeafFinalScope::~LeafFinalScope() { current_leaf_listener = prev_; }
const LeafFinalScope::Listener* LeafFinalScope::current() { return current_leaf_listener; }

void backward(const variable_list& roots, const std::vector<at::Tensor>& grads, bool retain_graph) {
  TORCH_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", roots.size(), " roots but ", grads.size(),
              " gradients");
  at::AutoDispatchBelowAutograd below_autograd;  // Note [ATen's autograd is not involved] (function.h)
  GraphTask task(retain_graph);
  // The scope is this pass's: a backward nested in it (run by a hook) releases nothing early.
  const LeafFinalScope::Listener* listener = current_leaf_listener;
  task.release_leaves(listener);
  current_leaf_listener = nullptr;
  struct Restore {
    const LeafFinalScope::Listener* l;
    ~Restore() { current_leaf_listener = l; }
  } restore{listener};
  for (size_t i = 0; i < roots.size(); ++i) task.seed(roots[i], grads.empty() ? at::Tensor() : grads[i]);
  task.run();
}


DeferredWeightGrads backward_inputs(const variable_list& roots, const std::vector<at::Tensor>& grads,
                                    const variable_list& inputs, bool retain_graph) {
  TORCH_CHECK(grads.empty() || grads.size() == roots.size(), "backward_inputs: ", roots.size(), " roots but ",
              grads.size(), " gradients");
  std::unordered_set<const VariableImpl*> in;
  for (const Variable& v : inputs) {
    TORCH_CHECK(v.defined() && v.is_leaf(), "backward_inputs: every input must be a leaf variable (the stage's "
                "received activation, say); got ", v.defined() ? "a non-leaf" : "an undefined variable");
    in.insert(v.impl());
  }
  at::AutoDispatchBelowAutograd below_autograd;  // Note [ATen's autograd is not involved] (function.h)
  DeferredWeightGrads later;
  later.retain_graph_ = retain_graph;
  GraphTask task(retain_graph);
  task.split(&in, &later.ops_);
  for (size_t i = 0; i < roots.size(); ++i) task.seed(roots[i], grads.empty() ? at::Tensor() : grads[i]);
  task.run();
  return later;
}

void DeferredWeightGrads::run() {
  if (ops_.empty()) return;
  at::AutoDispatchBelowAutograd below_autograd;
  GraphTask task(retain_graph_);
  task.run_deferred(ops_);
}

size_t DeferredWeightGrads::held_bytes() const {
  size_t n = 0;
  for (const Op& op : ops_) {
    n += op.node->saved_bytes();
    for (const at::Tensor& g : op.grads)
      if (g.defined()) n += static_cast<size_t>(g.numel() * g.element_size());
  }
  return n;
}

}  // namespace tl
