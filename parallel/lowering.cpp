// Lowering a compute schedule into the lists ranks execute, as four passes (parallel/lowering.h).
#include "parallel/lowering.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "parallel/slack.h"

namespace tl {

namespace {

// The messages compute action `a` receives before it and sends after it (Note [lowering]).
void messages_of(const Action& a, const StageLayout& L, std::vector<Action>* recvs, std::vector<Action>* sends) {
  const int S = L.stages(), s = a.stage, r = L.rank_of(s);
  auto cross = [&](int other) { return other >= 0 && other < S && L.rank_of(other) != r; };
  if (a.type == ActionType::Forward) {
    if (cross(s - 1)) recvs->push_back({ActionType::RecvActivation, s, a.micro_batch, true, L.rank_of(s - 1)});
    if (cross(s + 1)) sends->push_back({ActionType::SendActivation, s, a.micro_batch, true, L.rank_of(s + 1)});
  } else if (takes_gradient(a.type)) {
    if (cross(s + 1)) recvs->push_back({ActionType::RecvGrad, s, a.micro_batch, true, L.rank_of(s + 1)});
    if (cross(s - 1)) sends->push_back({ActionType::SendGrad, s, a.micro_batch, true, L.rank_of(s - 1)});
  }
}

}  // namespace

std::vector<RankSchedule> add_sends_and_receives(const std::vector<RankSchedule>& compute_lists,
                                                 const StageLayout& layout) {
  TORCH_CHECK(static_cast<int>(compute_lists.size()) == layout.ranks, "lower: ", compute_lists.size(), " lists for ",
              layout.ranks, " pipeline ranks");
  std::vector<RankSchedule> out(compute_lists.size());
  for (size_t r = 0; r < compute_lists.size(); ++r) {
    const RankSchedule& in = compute_lists[r];
    RankSchedule& l = out[r];
    std::vector<Action> pending;  // receives already placed for the next compute action
    for (size_t i = 0; i < in.size(); ++i) {
      const Action& a = in[i];
      TORCH_CHECK(is_compute(a.type), "lower: rank ", r, " action ", i, " (", action_token(a),
                  ") is a message; lower() takes compute-only lists");
      std::vector<Action> recvs, sends;
      messages_of(a, layout, &recvs, &sends);
      for (const Action& m : recvs)
        if (std::find(pending.begin(), pending.end(), m) == pending.end()) l.push_back(m);
      pending.clear();
      l.push_back(a);
      // The next compute's activation from a rank this one sends a gradient to goes first. (Not
      // past a W: Note [ZB-H1 needs the send thread].)
      if (i + 1 < in.size()) {
        std::vector<Action> next_recvs, unused;
        messages_of(in[i + 1], layout, &next_recvs, &unused);
        for (const Action& m : next_recvs) {
          const bool hoist =
              m.type == ActionType::RecvActivation && std::any_of(sends.begin(), sends.end(), [&](const Action& s) {
                return s.type == ActionType::SendGrad && s.peer == m.peer;
              });
          if (hoist) l.push_back(m), pending.push_back(m);
        }
      }
      l.insert(l.end(), sends.begin(), sends.end());
    }
  }
  return out;
}

// Note [receive in the order sent]. A link delivers in the order its sender sends (the transport
// numbers each pair's messages), so both ends must list a link's messages in one order. The
// placement of receives right before their compute gets that for every schedule whose two
// directions of a link carry different kinds (round robin: activations one way, gradients the
// other). On a V placement, ranks r and r + 1 each send both: activations down chunk 0 and
// gradients up chunk 1 from r, and the reverse from r + 1; the sender may then send activation 2
// before gradient 0 where the receiver's compute wants gradient 0 first. This pass walks each
// receiver's list and, at a receive, first receives whatever its sender sent before that message
// and is not yet received (it waits in the inbox until its compute). Nothing arrives later than
// it would have: on a FIFO link the message wanted comes after those anyway. A no-op for the
// other schedules (their tables in the tests pin it).
void order_receives_as_sent(std::vector<RankSchedule>& lists) {
  const int R = static_cast<int>(lists.size());
  // Per (src, dst): the messages src sends dst, in its order.
  std::map<std::pair<int, int>, std::vector<Action>> sent;
  for (int r = 0; r < R; ++r)
    for (const Action& a : lists[r])
      if (is_send(a.type)) sent[{r, a.peer}].push_back(a);
  auto recv_of = [](const Action& send, int src) {
    const bool act = send.type == ActionType::SendActivation;
    return Action{act ? ActionType::RecvActivation : ActionType::RecvGrad, act ? send.stage + 1 : send.stage - 1,
                  send.micro_batch, true, src};
  };
  for (int r = 0; r < R; ++r) {
    RankSchedule out;
    std::map<int, size_t> next;  // per source: index of the next message in its sent order
    std::set<std::tuple<ActionType, int, int>> early;
    for (const Action& a : lists[r]) {
      if (!is_recv(a.type)) {
        out.push_back(a);
        continue;
      }
      if (early.erase({a.type, a.stage, a.micro_batch})) continue;  // already received
      const std::vector<Action>& order = sent[{a.peer, r}];
      size_t& i = next[a.peer];
      for (; i < order.size(); ++i) {
        const Action m = recv_of(order[i], a.peer);
        if (m.type == a.type && m.stage == a.stage && m.micro_batch == a.micro_batch) break;
        out.push_back(m);
        early.insert({m.type, m.stage, m.micro_batch});
      }
      out.push_back(a);
      if (i < order.size()) ++i;  // (a message never sent: validate_schedule reports it)
    }
    lists[r] = std::move(out);
  }
}

void mark_epilogue_only(std::vector<RankSchedule>& lists) {
  // Note [epilogue-only]: critical unless a forward follows on the rank.
  for (RankSchedule& l : lists) {
    bool forward_after = false;
    for (auto a = l.rbegin(); a != l.rend(); ++a) {
      if (a->type == ActionType::SendGrad) a->compress_backward = !forward_after;
      forward_after = forward_after || a->type == ActionType::Forward;
    }
  }
}

void mark_critical(std::vector<RankSchedule>& lists, const StageLayout& layout) {
  // Note [slack of a gradient send]: the dependency graph's answer, beside Optimus-CC's.
  std::map<std::pair<int, int>, double> slack;
  try {
    for (const SendSlack& x : gradient_send_slack(lists, SimCosts::uniform(layout.stages(), 1.0, 2.0)))
      slack[{x.send.stage, x.send.micro_batch}] = x.slack_s;
  } catch (const c10::Error&) {
    slack.clear();
  }
  for (auto& l : lists)
    for (Action& a : l) {
      auto it = slack.find({a.stage, a.micro_batch});
      if (a.type == ActionType::SendGrad && it != slack.end()) a.critical = it->second < 1e-9;
    }
}

std::vector<RankSchedule> lower(const std::vector<RankSchedule>& compute, const StageLayout& layout) {
  std::vector<RankSchedule> out = add_sends_and_receives(compute, layout);
  order_receives_as_sent(out);
  mark_epilogue_only(out);
  mark_critical(out, layout);
  return out;
}

}  // namespace tl
