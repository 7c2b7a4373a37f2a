// Structural checks of a schedule's lists (validate_schedule in parallel/schedule.h).
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "parallel/schedule.h"

namespace tl {

void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches) {
  validate_schedule(schedule, micro_batches, StageLayout{static_cast<int>(schedule.size()), 1});
}

void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches, const StageLayout& layout) {
  const int P = static_cast<int>(schedule.size()), S = layout.stages();
  TORCH_CHECK(P >= 1, "schedule: no ranks");
  TORCH_CHECK(P == layout.ranks, "schedule: ", P, " rank lists for a layout of ", layout.ranks, " ranks");
  // Position of each action kind per (stage, micro-batch) on its rank (-1: absent).
  std::map<std::tuple<ActionType, int, int>, int> pos;
  for (int r = 0; r < P; ++r) {
    for (int i = 0; i < static_cast<int>(schedule[r].size()); ++i) {
      const Action& a = schedule[r][i];
      const std::string what = "schedule: rank " + std::to_string(r) + " action " + std::to_string(i) + " (" +
                               action_token(a, layout.virtual_stages > 1) + ")";
      TORCH_CHECK(a.stage >= 0 && a.stage < S && layout.rank_of(a.stage) == r, what, " belongs to stage ", a.stage,
                  ", which rank ", r, " does not hold",
                  layout.virtual_stages == 1 ? "; one stage per rank: list r holds stage r's actions" : "");
      TORCH_CHECK(a.micro_batch >= 0 && a.micro_batch < micro_batches, what, " micro-batch out of range [0, ",
                  micro_batches, ")");
      const int peer = peer_stage(a);
      TORCH_CHECK(is_compute(a.type) || (peer >= 0 && peer < S), what, " talks to stage ", peer,
                  ", which does not exist (", S, " stages)");
      TORCH_CHECK(is_compute(a.type) || a.peer == layout.rank_of(peer), what, " names rank ", a.peer,
                  " as its peer, but stage ", peer, " lives on rank ", is_compute(a.type) ? -1 : layout.rank_of(peer));
      TORCH_CHECK(pos.emplace(std::make_tuple(a.type, a.stage, a.micro_batch), i).second, what, " appears twice");
    }
  }
  auto at = [&](ActionType t, int s, int mb) {
    auto it = pos.find({t, s, mb});
    return it == pos.end() ? -1 : it->second;
  };
  for (int s = 0; s < S; ++s) {
    const int r = layout.rank_of(s);
    const bool first = s == 0, last = s == S - 1;
    // Neighbours on another rank exchange messages; on the same rank the order of compute says it.
    const bool msg_in = !first && layout.rank_of(s - 1) != r, msg_out = !last && layout.rank_of(s + 1) != r;
    for (int mb = 0; mb < micro_batches; ++mb) {
      // b: the backward that takes the gradient (B, or I of a split backward, whose W follows).
      const int f = at(ActionType::Forward, s, mb), whole = at(ActionType::Backward, s, mb);
      const int in = at(ActionType::BackwardInput, s, mb), w = at(ActionType::BackwardWeight, s, mb);
      const int b = whole >= 0 ? whole : in;
      std::string where = "schedule: rank " + std::to_string(r) + " micro-batch " + std::to_string(mb) + ": ";
      if (layout.virtual_stages > 1)
        where = "schedule: rank " + std::to_string(r) + " stage " + std::to_string(s) + " micro-batch " +
                std::to_string(mb) + ": ";
      TORCH_CHECK(f >= 0 && b >= 0, where, "needs one forward and one backward (B, or I and W)");
      TORCH_CHECK(whole < 0 || (in < 0 && w < 0), where, "has a whole backward and a split one");
      TORCH_CHECK((in >= 0) == (w >= 0), where, in >= 0 ? "has an I without its W" : "has a W without its I");
      TORCH_CHECK(f < b, where, "backward before forward");
      TORCH_CHECK(w < 0 || in < w, where, "runs W before I (the weight gradients need I's pass)");
      const int ra = at(ActionType::RecvActivation, s, mb), sa = at(ActionType::SendActivation, s, mb);
      const int rg = at(ActionType::RecvGrad, s, mb), sg = at(ActionType::SendGrad, s, mb);
      // Each message: absent unless its neighbour lives on another rank, then a receive before its
      // compute and a send after it.
      struct Rule {
        int pos;
        bool crosses, before;
        int compute;
        bool edge;
        const char *at_edge, *misplaced, *same_rank;
      };
      const Rule rules[] = {
          {ra, msg_in, true, f, first, "the first stage receives no activation",
           "must receive its activation before the forward", "receives no activation from a stage on its own rank"},
          {sa, msg_out, false, f, last, "the last stage sends no activation",
           "must send its activation after the forward", "sends no activation to a stage on its own rank"},
          {rg, msg_out, true, b, last, "the last stage receives no gradient",
           "must receive its gradient before the backward", "receives no gradient from a stage on its own rank"},
          {sg, msg_in, false, b, first, "the first stage sends no gradient",
           "must send its gradient after the backward", "sends no gradient to a stage on its own rank"},
      };
      for (const Rule& m : rules) {
        const bool ok = !m.crosses ? m.pos < 0 : m.before ? m.pos >= 0 && m.pos < m.compute : m.pos > m.compute;
        TORCH_CHECK(ok, where, m.edge ? m.at_edge : m.crosses ? m.misplaced : m.same_rank);
      }
      // A neighbour on the same rank: its forward comes first, its backward after.
      if (!first && !msg_in)
        TORCH_CHECK(at(ActionType::Forward, s - 1, mb) < f, where, "runs its forward before stage ", s - 1,
                    "'s on the same rank");
      if (!last && !msg_out) {
        const int next_b = std::max(at(ActionType::Backward, s + 1, mb), at(ActionType::BackwardInput, s + 1, mb));
        TORCH_CHECK(next_b < b, where, "runs its backward before stage ", s + 1, "'s on the same rank");
      }
    }
  }
}

}  // namespace tl
