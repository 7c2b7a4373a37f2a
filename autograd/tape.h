#pragma once
// The tape: a Wengert list of the nodes recorded on one thread, in execution order. Backward walks
// it in reverse, so execution order is already a valid topological order and no sort is needed.
//
// The current tape is thread-local and scoped (TapeGuard); each thread has a default tape so that
// `loss.backward()` works with no setup. A pipeline stage or a micro-batch records on its own Tape
// object; destroying (or reset()-ing) a Tape frees all its nodes at once: saved tensors are dropped
// and a later backward through them is a clear error.
//
// Threads: a tape is recorded on by the thread whose current tape it is. Backward passes over
// its graphs may run on other threads at the same time (each over a disjoint graph); record(),
// reset(), collect_garbage() and the engine's snapshot take the tape's lock. nodes() and
// to_string() are for inspection while no other thread uses the tape.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"

namespace tl {

class Tape {
 public:
  Tape() = default;
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  /// The tape ops on this thread record on: the innermost TapeGuard's, or the thread's default.
  static Tape& current();

  void record(std::shared_ptr<Node> node);
  /// Free every node as a unit (iteratively: no recursion however long the chains are).
  void reset();
  /// Drop nodes that were released by backward or that nothing can reach any more.
  void collect_garbage();

  size_t size() const { return nodes_.size(); }
  const std::vector<std::shared_ptr<Node>>& nodes() const { return nodes_; }
  /// Bytes held for backward by the live nodes.
  size_t saved_bytes() const;
  /// One line per node: index, op, output shapes, bytes saved for backward; then a total.
  std::string to_string() const;

  /// Position of `node` in this tape (binary search on sequence numbers), or -1.
  int64_t index_of(const Node* node) const;

  /// Engine use: the sequence numbers of the nodes up to and including `last` (in tape order,
  /// so ascending), taken under the lock; false if `last` is not on this tape.
  bool snapshot_sequence(const Node* last, std::vector<uint64_t>& out) const;
  /// The same, and in `last_uses` each leaf that an edge of those nodes reaches, once, with the
  /// lowest position (in `out`) of a node reaching it: (position, leaf), by position descending,
  /// then in edge order (Note [leaves released when final] in autograd/leaf_final.h).
  bool snapshot_sequence(const Node* last, std::vector<uint64_t>& out,
                         std::vector<std::pair<int64_t, VariableImpl*>>& last_uses) const;

 private:
  void collect_garbage_locked();
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<Node>> nodes_;
  size_t next_gc_ = 4096;
};

/// RAII: makes `tape` the current tape of this thread for a scope.
class TapeGuard {
 public:
  explicit TapeGuard(Tape& tape);
  ~TapeGuard();
  TapeGuard(const TapeGuard&) = delete;
  TapeGuard& operator=(const TapeGuard&) = delete;

 private:
  Tape* prev_;
};

}  // namespace tl
