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
#include <string>
#include <vector>

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

class Transport;

/// Note [in-place sum in rank order]. The uncompressed sum of `flat` (1-D, contiguous, floating,
/// CPU; the same numel on every member) over the members of a group, in place, as a ring
/// all-reduce moves bytes: `flat` is cut into one chunk per member; (reduce-scatter) every member
/// sends its chunk j to member j, which adds the members' chunks j in member order 0, 1, ... (its
/// own in its place: t_0 + ... + t_{j-1} first, then its own added to that sum, then the rest, the
/// bitwise same as sum_in_rank_order because a + b == b + a in IEEE arithmetic); (all-gather)
/// member j sends its summed chunk to every other member, which copies it in place. Each member
/// sends and receives 2 (M - 1) / M of the tensor's bytes in 2 (M - 1) messages, as Gloo's ring
/// all-reduce does, and every member holds the bits sum_in_rank_order would give. Two members
/// exchange their whole tensors instead, one message each way (the same bytes, half the round
/// trips), and the sum is formed in the received buffer, `flat` left as it was: this rank's send
/// may still read it after the return (change it only once its storage has no other handle).
/// Returns the sum: `flat` itself, or for two members that new tensor. The transport
/// needs its communication thread (the sends of a phase are posted before its recvs).
/// `group`: transport ranks by member; `me`: this member; `tag`: the messages' tag (both phases);
/// `context`: for errors (the member and rank are appended); `before_send(to, bytes)`: called
/// before each send with its context (fault injection, statistics), may be empty.
at::Tensor all_reduce_in_rank_order(Transport& transport, const std::vector<int>& group, int me, const at::Tensor& flat,
                              int64_t tag, const std::string& context,
                              const std::function<void(const std::string&, int64_t)>& before_send = {});

}  // namespace tl::ranks
