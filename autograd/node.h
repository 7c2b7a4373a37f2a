#pragma once
// A Node is one recorded op: it maps gradients w.r.t. its outputs to gradients w.r.t. its inputs.
// Nodes are owned by the Tape they were recorded on (and by the Variables they produced); edges
// point from a node to the nodes (or leaf Variables) that produced its inputs.
//
// A Node holds only what its op recorded (edges, output metadata, saved state, hooks). Everything
// that belongs to one backward pass (gradient buffers, which nodes are pending) lives in that
// pass's own object in engine.cpp, so backward passes over disjoint graphs may run on several
// threads at once. See Note [concurrent backward passes] in engine.cpp.

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tl {

class Node;
class Tape;
struct VariableImpl;

/// A gradient hook: receives a gradient and returns a replacement, or an undefined tensor to
/// keep the gradient unchanged.
using GradHook = std::function<at::Tensor(const at::Tensor&)>;

/// A shape kept inline (no heap allocation up to 5 dims).
using Shape = c10::SmallVector<int64_t, 5>;
inline Shape shape_of(at::IntArrayRef sizes) { return Shape(sizes.begin(), sizes.end()); }

/// Where the gradient for one input of a node goes: into output `input_nr` of another node, or
/// into a leaf Variable. Both empty: the input needs no gradient.
struct Edge {
  std::shared_ptr<Node> fn;
  std::shared_ptr<VariableImpl> leaf;
  uint32_t input_nr = 0;
  bool valid() const { return fn || leaf; }
};

/// What one recorded op costs (Note [op costs] in autograd/cost.h), filled at forward.
struct NodeCost {
  double flops = 0;                          // forward FLOPs
  double bytes = 0;                          // forward bytes read and written
  c10::SmallVector<double, 3> input_flops;   // FLOPs of the gradient of each input
  bool view = false;                         // a view of an input: no kernel, no traffic
};

/// Shape, dtype and device of one output; used to check gradients and to make zero gradients
/// for outputs that received none.
struct OutputMeta {
  Shape sizes;
  at::TensorOptions options;
};

using EdgeList = c10::SmallVector<Edge, 3>;
using OutputMetaList = c10::SmallVector<OutputMeta, 1>;

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// grads[i] is the gradient w.r.t. output i (never undefined: the engine fills zeros).
  /// Returns one gradient per next edge (undefined where an input needs none).
  virtual std::vector<at::Tensor> apply(std::vector<at::Tensor>&& grads) = 0;
  /// Split backward (Note [split backward] in engine.cpp): like apply, but only the gradients of
  /// the inputs marked in `wanted` are computed (the others come back undefined).
  virtual std::vector<at::Tensor> apply_subset(std::vector<at::Tensor>&& grads, const c10::SmallVector<bool, 8>& wanted);
  /// Whether the op's backward may run in two parts, each for a subset of its inputs: a pure
  /// function of the gradients and what forward saved, with no state of its own to update.
  virtual bool splits_backward() const { return false; }
  virtual std::string name() const = 0;
  /// Bytes of tensors kept alive for backward (storage bytes, counted once per tensor).
  virtual size_t saved_bytes() const { return 0; }

  const EdgeList& next_edges() const { return next_edges_; }
  const OutputMetaList& outputs() const { return outputs_; }
  uint64_t sequence_nr() const { return seq_; }
  bool released() const { return released_.load(std::memory_order_acquire); }
  Tape* tape() const { return tape_.load(std::memory_order_acquire); }

  /// Hook run on the gradient of output `output_nr` before this node's backward. Register hooks
  /// before the backward that should see them starts (not from another thread during it).
  void add_pre_hook(uint32_t output_nr, GradHook hook);

  // Recorded at forward; read-only during backward. ------------------------------------------------
  EdgeList next_edges_;
  OutputMetaList outputs_;
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks_;
  NodeCost cost_;

  /// Drop saved tensors and edges (after backward without retain_graph, or when the tape is
  /// freed). Idempotent and safe to call from two threads: one of them does the work.
  void release();

 protected:
  virtual void release_saved() {}

 private:
  friend class Tape;
  std::atomic<bool> released_{false};  // saved state dropped: cannot run backward again
  std::atomic<Tape*> tape_{nullptr};   // the tape that records (owns) this node, null once dropped
  uint64_t seq_;
};

}  // namespace tl
