// The backward pass. Nodes on the root's tape are visited by walking that tape in reverse
// (execution order reversed is a topological order). A graph may also reach nodes recorded on
// other tapes (a value computed under another TapeGuard and used here); those are merged in by
// their global sequence number, so every node runs once, after all of its consumers.
//
// Leaf gradients are summed over the whole backward first, then passed through the leaf's hooks
// once, then accumulated into .grad through one checked sink.

#include <queue>
#include <unordered_map>

#include "autograd/function.h"

namespace tl {
namespace {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

void check_grad(const at::Tensor& g, const OutputMeta& meta, const std::string& producer, const std::string& target,
                size_t index) {
  TORCH_CHECK(g.sizes().equals(meta.sizes), "backward of '", producer, "' produced a gradient of shape ",
              shape_str(g.sizes()), " for output ", index, " of '", target, "', whose shape is ",
              shape_str(meta.sizes));
  TORCH_CHECK(g.scalar_type() == meta.options.dtype().toScalarType(), "backward of '", producer,
              "' produced a ", g.scalar_type(), " gradient for output ", index, " of '", target, "', which is ",
              meta.options.dtype());
}

// The one place gradients are summed into a buffer.
void accumulate(at::Tensor& slot, at::Tensor g) {
  if (!slot.defined()) {
    slot = std::move(g);
  } else {
    slot = slot + g;  // out of place: `slot` may alias a tensor a hook or the user still holds
  }
}

struct SeqLess {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

class Backward {
 public:
  Backward(bool retain_graph) : retain_graph_(retain_graph) {}

  void seed(const Variable& root, at::Tensor grad) {
    TORCH_CHECK(root.defined(), "backward: root variable is undefined");
    TORCH_CHECK(root.requires_grad(), "backward: the variable does not require grad (it was computed from no "
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
    Node* n = root.grad_fn().get();
    TORCH_CHECK(!n->released(), "backward: the graph of this variable was already freed (op '", n->name(),
                "'); pass retain_graph=true to the first backward to run it twice");
    add_to_node(n, root.output_nr(), std::move(grad));
    seeded_.push_back(n);
    if (!primary_ || n->sequence_nr() > primary_->sequence_nr()) primary_ = n;
  }

  void run() {
    if (primary_) {
      Tape* tape = primary_->tape();
      TORCH_CHECK(tape, "backward: the tape that recorded op '", primary_->name(), "' was freed");
      tape_ = tape;
      for (Node* s : seeded_) {
        if (s->tape() != tape_ && !s->queued_) {
          s->queued_ = true;
          foreign_.push(s);
        }
      }
      int64_t pos = tape->index_of(primary_);
      TORCH_CHECK(pos >= 0, "backward: op '", primary_->name(), "' is not on its tape (internal error)");
      const auto& nodes = tape->nodes();
      for (int64_t i = pos; i >= 0; --i) {
        Node* n = nodes[i].get();
        drain_foreign_above(n->sequence_nr());
        if (!n->grad_buffer_.empty()) process(n);
      }
      drain_foreign_above(0);
    }
    finish_leaves();
    if (tape_ && !retain_graph_) tape_->collect_garbage();
  }

 private:
  void add_to_node(Node* n, uint32_t index, at::Tensor g) {
    if (n->grad_buffer_.empty()) n->grad_buffer_.resize(n->outputs().size());
    accumulate(n->grad_buffer_[index], std::move(g));
  }

  void add_leaf(const std::shared_ptr<VariableImpl>& leaf, at::Tensor g) {
    auto it = leaf_index_.find(leaf.get());
    if (it == leaf_index_.end()) {
      leaf_index_.emplace(leaf.get(), leaves_.size());
      leaves_.emplace_back(leaf, std::move(g));
    } else {
      accumulate(leaves_[it->second].second, std::move(g));
    }
  }

  void drain_foreign_above(uint64_t seq) {
    while (!foreign_.empty() && foreign_.top()->sequence_nr() > seq) {
      Node* n = foreign_.top();
      foreign_.pop();
      n->queued_ = false;
      process(n);
    }
  }

  void process(Node* n) {
    TORCH_CHECK(!n->released(), "backward: op '", n->name(), "' was already freed by an earlier backward (or "
                "its tape was reset); pass retain_graph=true to the first backward to run it twice");
    std::vector<at::Tensor> grads = std::move(n->grad_buffer_);
    n->grad_buffer_.clear();
    const auto& outs = n->outputs();
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) grads[i] = at::zeros(outs[i].sizes, outs[i].options);
    }
    for (auto& [index, hook] : n->pre_hooks_) {
      at::Tensor r = hook(grads[index]);
      if (r.defined()) {
        check_grad(r, outs[index], "hook", n->name(), index);
        grads[index] = std::move(r);
      }
    }
    std::vector<at::Tensor> in_grads = n->apply(std::move(grads));
    const auto& edges = n->next_edges();
    TORCH_CHECK(in_grads.size() == edges.size(), "backward of '", n->name(), "' returned ", in_grads.size(),
                " gradients for ", edges.size(), " inputs");
    for (size_t j = 0; j < edges.size(); ++j) {
      const Edge& e = edges[j];
      if (!e.valid() || !in_grads[j].defined()) continue;
      if (e.leaf) {
        add_leaf(e.leaf, std::move(in_grads[j]));
        continue;
      }
      Node* target = e.fn.get();
      check_grad(in_grads[j], target->outputs()[e.input_nr], n->name(), target->name(), e.input_nr);
      add_to_node(target, e.input_nr, std::move(in_grads[j]));
      if (target->tape() != tape_ && !target->queued_) {
        target->queued_ = true;
        foreign_.push(target);
      }
    }
    if (!retain_graph_) n->release();
  }

  void finish_leaves() {
    for (auto& [leaf, g] : leaves_) {
      for (auto& hook : leaf->hooks) {
        at::Tensor r = hook(g);
        if (r.defined()) g = std::move(r);
      }
      const std::string who = leaf->name.empty() ? std::string("a leaf") : "leaf '" + leaf->name + "'";
      TORCH_CHECK(g.sizes().equals(leaf->data.sizes()), "backward: gradient for ", who, " has shape ",
                  shape_str(g.sizes()), " but the variable has shape ", shape_str(leaf->data.sizes()));
      TORCH_CHECK(g.scalar_type() == leaf->data.scalar_type(), "backward: gradient for ", who, " is ",
                  g.scalar_type(), " but the variable is ", leaf->data.scalar_type());
      if (leaf->grad.defined()) {
        leaf->grad.add_(g);
      } else {
        // Own the memory: the incoming gradient may alias another tensor.
        const bool owned = g.is_contiguous() && g.storage_offset() == 0 && g.storage().use_count() == 1 &&
                           g.storage().nbytes() == g.numel() * g.element_size();
        leaf->grad = owned ? g : g.clone(at::MemoryFormat::Contiguous);
      }
    }
  }

  bool retain_graph_;
  Node* primary_ = nullptr;
  std::vector<Node*> seeded_;
  Tape* tape_ = nullptr;
  std::priority_queue<Node*, std::vector<Node*>, SeqLess> foreign_;
  std::vector<std::pair<std::shared_ptr<VariableImpl>, at::Tensor>> leaves_;
  std::unordered_map<VariableImpl*, size_t> leaf_index_;
};

}  // namespace

void backward(const variable_list& roots, const std::vector<at::Tensor>& grads, bool retain_graph) {
  TORCH_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", roots.size(), " roots but ",
              grads.size(), " gradients");
  Backward b(retain_graph);
  for (size_t i = 0; i < roots.size(); ++i) b.seed(roots[i], grads.empty() ? at::Tensor() : grads[i]);
  // Roots on several tapes: the newest root's tape is walked; the others are merged in by
  // sequence number like any other cross-tape node.
  b.run();
}

}  // namespace tl
