#include "parallel/ranks/group_sum.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "parallel/ranks/transport.h"

namespace tl::ranks {

at::Tensor all_reduce_in_rank_order(Transport& transport, const std::vector<int>& group, int me, const at::Tensor& flat,
                                    int64_t tag, const std::string& context,
                                    const std::function<void(const std::string&, int64_t)>& before_send) {
  const int M = static_cast<int>(group.size());
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.is_cpu() && at::isFloatingType(flat.scalar_type()),
              context, ": the in-place group sum takes a 1-D contiguous floating-point CPU tensor, got ",
              flat.toString(), " ", flat.sizes());
  TORCH_CHECK(me >= 0 && me < M, context, ": member ", me, " of a group of ", M);
  if (M == 1) return flat;
  const int64_t n = flat.numel();
  auto chunk = [&](int j) { return flat.narrow(0, n * j / M, n * (j + 1) / M - n * j / M); };
  auto bytes = [](const at::Tensor& t) { return t.view(at::kByte); };
  auto send = [&](int to, const at::Tensor& part, const std::string& phase) {
    const std::string where = context + " (" + phase + ") to member " + std::to_string(to);
    if (before_send) before_send(where, part.numel() * part.element_size());
    transport.send(group[static_cast<size_t>(to)], bytes(part), tag, where);
  };
  // Member e's part, as this rank expects it: `like`'s dtype and size.
  auto recv = [&](int from, const at::Tensor& like, const std::string& phase) {
    const int rank = group[static_cast<size_t>(from)];
    const std::string where =
        context + " (" + phase + ") from member " + std::to_string(from) + " (rank " + std::to_string(rank) + ")";
    const at::Tensor body = transport.recv(rank, tag, where).body;
    const int64_t want = like.numel() * like.element_size();
    TORCH_CHECK(body.numel() == want, where, ": ", body.numel(), " bytes where this member expects ", want, " (",
                like.numel(), " values: the members' tensors differ)");
    return body.view(like.scalar_type());
  };
  if (M == 2) {  // one exchange of the whole tensor moves the same bytes as the two phases, in one step
    const int other = 1 - me;
    send(other, flat, "exchange");
    return recv(other, flat, "exchange").add_(flat);  // t_other + t_me == t_0 + t_1, in this rank's buffer
  }
  // Reduce-scatter: chunk j to member j.
  for (int j = 0; j < M; ++j)
    if (j != me) send(j, chunk(j), "reduce-scatter");
  const at::Tensor own = chunk(me);
  at::Tensor before;  // t_0 + ... + t_{me-1}
  for (int e = 0; e < me; ++e) {
    const at::Tensor t = recv(e, own, "reduce-scatter");
    before = e == 0 ? t : before.add_(t);  // a received body is this rank's own buffer
  }
  if (before.defined()) own.add_(before);
  for (int e = me + 1; e < M; ++e) own.add_(recv(e, own, "reduce-scatter"));
  // All-gather: the summed chunks, in place.
  for (int j = 0; j < M; ++j)
    if (j != me) send(j, own, "all-gather");
  for (int j = 0; j < M; ++j)
    if (j != me) {
      const at::Tensor c = chunk(j);
      const at::Tensor t = recv(j, c, "all-gather");
      std::memcpy(c.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
    }
  transport.flush(context);  // the caller may change `flat` once this returns: its sends are out
  return flat;
}

}  // namespace tl::ranks
