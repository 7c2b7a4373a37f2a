#pragma once
// Note [leaves released when final]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A backward pass sums each leaf's gradient privately and accumulates it into .grad at the pass's
// end (autograd/engine.cpp). A data-parallel sum can start on a parameter's gradient as soon as
// its last contribution has arrived, as PyTorch's DDP starts a bucket from its autograd hooks,
// while the backward goes on through the earlier layers. With a LeafFinalScope alive on a thread,
// the backward passes that thread runs (backward(), not the split backward_inputs() and its
// weight pass) release a leaf early: the engine notes, when the pass starts, the lowest position
// on the walked tape of a node with an edge to each leaf (Tape::snapshot_sequence), and once the
// walk has passed that position, no later node can reach the leaf; its summed gradient then goes
// through its hooks and into .grad exactly as at the end (the same operations on the same values,
// so the same bits), and the listener hears of it. Leaves not released early (reached only from
// another tape's nodes, or a leaf root) are released at the end, then heard of. Every leaf that got
// a gradient in the pass is heard of once, in an order fixed by the graph (position, then edge),
// so processes that run the same graph hear the same sequence. A gradient that reaches an already
// released leaf (from a node recorded on another tape, older than the leaf's last use on the
// walked tape) is an error naming the leaf, never a silently incomplete sum.

#include <functional>

namespace tl {

struct VariableImpl;

/// RAII: while alive, the backward passes this thread runs release leaves as they become final
/// and call `on_final(leaf)` for each, after its gradient is in .grad. Scopes nest (the innermost
/// listens).
class LeafFinalScope {
 public:
  using Listener = std::function<void(VariableImpl* leaf)>;
  explicit LeafFinalScope(Listener on_final);
  ~LeafFinalScope();
  LeafFinalScope(const LeafFinalScope&) = delete;
  LeafFinalScope& operator=(const LeafFinalScope&) = delete;

  /// The innermost scope's listener on this thread, or null.
  static const Listener* current();

 private:
  Listener on_final_;
  const Listener* prev_;
};

}  // namespace tl
