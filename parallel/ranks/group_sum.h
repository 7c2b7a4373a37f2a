#pragma once
// The sum every collective of tapeline forms (data-parallel gradients over the replicas, the
// tensor-parallel all-reduces over a stage's tensor ranks).
//
// Note [sums in rank order]. Each member of a group receives every member's term (its own
// included) and adds them in member order, 0 first, into a tensor of its own: the first term, a
// fresh tensor for the first two (a term may be a view of a received message or of the caller's
// tensor, which must not change), then each next term added in place. Every member runs the same
// ops on the same bytes, so every member holds the bitwise same sum: replicas step identically and
// a stage's tensor ranks stay equal, without a broadcast.

#include <ATen/ATen.h>

#include <functional>

namespace tl::ranks {

/// sum over e = 0 .. members - 1 of term(e), in that order (Note [sums in rank order]); term(e)
/// checks and decodes member e's part. A group of one returns term(0) itself.
inline at::Tensor sum_in_rank_order(int members, const std::function<at::Tensor(int)>& term) {
  at::Tensor sum;
  for (int e = 0; e < members; ++e) {
    const at::Tensor t = term(e);
    sum = e == 0 ? t : (e == 1 ? at::add(sum, t) : sum.add_(t));
  }
  return sum;
}

}  // namespace tl::ranks
