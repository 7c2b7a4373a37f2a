#pragma once
// A Node is one recorded op: it maps gradients w.r.t. its outputs to gradients w.r.t. its inputs.
// Nodes are owned by the Tape they were recorded on (and by the Variables they produced); edges
// point from a node to the nodes (or leaf Variables) that produced its inputs.

#include <ATen/ATen.h>

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

/// Where the gradient for one input of a node goes: into output `input_nr` of another node, or
/// into a leaf Variable. Both empty: the input needs no gradient.
struct Edge {
  std::shared_ptr<Node> fn;
  std::shared_ptr<VariableImpl> leaf;
  uint32_t input_nr = 0;
  bool valid() const { return fn || leaf; }
};

/// Shape, dtype and device of one output; used to check gradients and to make zero gradients
/// for outputs that received none.
struct OutputMeta {
  std::vector<int64_t> sizes;
  at::TensorOptions options;
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// grads[i] is the gradient w.r.t. output i (never undefined: the engine fills zeros).
  /// Returns one gradient per next edge (undefined where an input needs none).
  virtual std::vector<at::Tensor> apply(std::vector<at::Tensor>&& grads) = 0;
  virtual std::string name() const = 0;
  /// Bytes of tensors kept alive for backward (storage bytes, counted once per tensor).
  virtual size_t saved_bytes() const { return 0; }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  const std::vector<OutputMeta>& outputs() const { return outputs_; }
  uint64_t sequence_nr() const { return seq_; }
  bool released() const { return released_; }
  Tape* tape() const { return tape_; }

  /// Hook run on the gradient of output `output_nr` before this node's backward.
  void add_pre_hook(uint32_t output_nr, GradHook hook);

  // Engine-facing state. -------------------------------------------------------------------------
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> outputs_;
  std::vector<at::Tensor> grad_buffer_;  // summed gradients w.r.t. outputs during one backward
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks_;
  bool queued_ = false;    // in the engine's cross-tape queue
  bool released_ = false;  // saved tensors dropped: cannot run backward again
  Tape* tape_ = nullptr;

  /// Drop saved tensors and edges (after backward without retain_graph, or when the tape is freed).
  void release();

 protected:
  virtual void release_saved() {}

 private:
  uint64_t seq_;
};

}  // namespace tl
