// The event simulation of lowered lists (parallel/simulate.h).
#include "parallel/simulate.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

namespace tl {

double SimResult::bubble() const {
  if (step_s <= 0.0 || compute_s.empty()) return 0.0;
  double busy = 0.0;
  for (double c : compute_s) busy += c;
  return 1.0 - busy / (static_cast<double>(compute_s.size()) * step_s);
}

namespace {

// The message a send or recv action moves: (kind, boundary, micro-batch); kind 0 = activation,
// 1 = gradient; boundary b sits between stages b and b + 1.
using MessageId = std::tuple<int, int, int>;
MessageId message_of(const Action& a) {
  const bool act = a.type == ActionType::SendActivation || a.type == ActionType::RecvActivation;
  const int boundary = std::min(a.stage, peer_stage(a));
  return {act ? 0 : 1, boundary, a.micro_batch};
}

struct InFlight {
  MessageId msg;
  double ready_s;  // eager: when the receiver may have it; queue: when the send thread may start it
};

}  // namespace

SimResult simulate_schedule(const std::vector<RankSchedule>& schedule, const SimCosts& costs, SendMode mode) {
  const int R = static_cast<int>(schedule.size());
  int stages = 0;
  for (const auto& l : schedule)
    for (const Action& a : l) stages = std::max(stages, a.stage + 1);
  TORCH_CHECK(static_cast<int>(costs.forward_s.size()) >= stages && static_cast<int>(costs.backward_s.size()) >= stages,
              "simulate_schedule: costs for ", costs.forward_s.size(), " / ", costs.backward_s.size(),
              " stages (forward / backward), schedule has ", stages);
  TORCH_CHECK(costs.weight_s.empty() || static_cast<int>(costs.weight_s.size()) >= stages,
              "simulate_schedule: weight costs for ", costs.weight_s.size(), " stages, schedule has ", stages);
  SimResult res;
  res.compute_s.assign(R, 0.0);
  res.finish_s.assign(R, 0.0);
  res.spans.assign(R, {});
  std::vector<size_t> pc(R, 0);
  std::vector<double> t(R, 0.0);
  // Eager: messages in flight per directed rank pair (src, dst). SendQueue: per rank, its pending
  // sends (dst, message, enqueue time) and when its send thread is next free.
  std::map<std::pair<int, int>, std::deque<InFlight>> wire;
  std::vector<std::deque<std::tuple<int, MessageId, double>>> queue(R);
  std::vector<double> queue_free(R, 0.0);

  auto cost_of = [&](const Action& a) {
    const bool act = a.type == ActionType::SendActivation || a.type == ActionType::RecvActivation;
    return act ? costs.activation_s : costs.grad_s;
  };
  auto mismatch = [&](int r, const Action& a, MessageId got) {
    TORCH_CHECK(false, "simulate_schedule: rank ", r, " at ", action_token(a, true), " would receive ",
                std::get<0>(got) == 0 ? "activation " : "gradient ", std::get<2>(got), " of boundary ",
                std::get<1>(got), " from rank ", a.peer, ": the two ends of the link order their messages differently");
  };
  auto check_peer = [&](int r, const Action& a) {
    TORCH_CHECK(a.peer >= 0 && a.peer < R && a.peer != r, "simulate_schedule: rank ", r, " at ", action_token(a, true),
                " names rank ", a.peer, " as its peer (", R, " ranks): lower() the schedule first");
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      // The send thread (SendQueue): its head completes when the peer's main list is at the recv.
      while (mode == SendMode::SendQueue && !queue[r].empty()) {
        auto [dst, msg, enq] = queue[r].front();
        if (pc[dst] >= schedule[dst].size()) break;
        const Action& p = schedule[dst][pc[dst]];
        if (!is_recv(p.type) || p.peer != r) break;
        if (message_of(p) != msg) mismatch(dst, p, msg);
        const double done = std::max({enq, queue_free[r], t[dst]}) + cost_of(p);
        queue_free[r] = done;
        t[dst] = done;
        ++pc[dst];
        queue[r].pop_front();
        progress = true;
      }
      while (pc[r] < schedule[r].size()) {
        const Action& a = schedule[r][pc[r]];
        if (is_compute(a.type)) {
          const double d = costs.of(a);
          res.spans[r].push_back({a, t[r], t[r] + d});
          t[r] += d;
          res.compute_s[r] += d;
        } else if (is_send(a.type)) {
          check_peer(r, a);
          const int dst = a.peer;
          if (mode == SendMode::Eager) {
            wire[{r, dst}].push_back({message_of(a), t[r] + cost_of(a)});
          } else if (mode == SendMode::SendQueue) {
            queue[r].emplace_back(dst, message_of(a), t[r]);
          } else {  // Rendezvous: both ends must be at the message.
            if (pc[dst] >= schedule[dst].size()) break;
            const Action& p = schedule[dst][pc[dst]];
            if (!is_recv(p.type) || p.peer != r) break;
            if (message_of(p) != message_of(a)) mismatch(dst, p, message_of(a));
            const double done = std::max(t[r], t[dst]) + cost_of(a);
            t[r] = t[dst] = done;
            ++pc[dst];
          }
        } else {  // recv
          check_peer(r, a);
          if (mode != SendMode::Eager) break;  // completed by the sender's side above
          auto& q = wire[{a.peer, r}];
          if (q.empty()) break;
          if (q.front().msg != message_of(a)) mismatch(r, a, q.front().msg);
          t[r] = std::max(t[r], q.front().ready_s);
          q.pop_front();
        }
        ++pc[r];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int r = 0; r < R; ++r) {
    if (pc[r] < schedule[r].size()) stuck << " rank " << r << " at " << action_token(schedule[r][pc[r]], true) << ";";
    if (!queue[r].empty()) stuck << " rank " << r << "'s send thread holds " << queue[r].size() << " sends;";
  }
  TORCH_CHECK(stuck.str().empty(), "simulate_schedule: deadlock under ",
              mode == SendMode::Rendezvous  ? "rendezvous"
              : mode == SendMode::SendQueue ? "send-queue"
                                            : "eager",
              " sends:", stuck.str());
  for (int r = 0; r < R; ++r) {
    res.finish_s[r] = t[r];
    res.step_s = std::max(res.step_s, t[r]);
  }
  return res;
}

double ideal_step_time(int ranks, int micro_batches, double forward_s, double backward_s, int virtual_stages) {
  check_schedule_sizes(StageLayout{ranks, virtual_stages}, micro_batches);
  return (micro_batches * virtual_stages + ranks - 1) * (forward_s + backward_s);
}

double ideal_zbh1_step_time(int ranks, int micro_batches, double forward_s, double input_s, double weight_s) {
  check_schedule_sizes(StageLayout{ranks, 1}, micro_batches);
  TORCH_CHECK(micro_batches >= ranks, "ideal_zbh1_step_time: the formula holds for micro_batches >= ranks (",
              micro_batches, " < ", ranks, ")");
  return micro_batches * (forward_s + input_s + weight_s) + (ranks - 1) * (forward_s + input_s - weight_s);
}

std::string format_timeline(const SimResult& result, double slot_s) {
  TORCH_CHECK(slot_s > 0.0, "format_timeline: slot_s must be > 0, got ", slot_s);
  const long slots = std::lround(std::ceil(result.step_s / slot_s - 1e-9));
  bool with_stage = false;
  for (const auto& spans : result.spans)
    for (const auto& sp : spans) with_stage = with_stage || sp.action.stage != spans.front().action.stage;
  size_t width = 2;
  for (const auto& spans : result.spans)
    for (const auto& sp : spans) width = std::max(width, action_token(sp.action, with_stage).size());
  std::ostringstream os;
  for (size_t r = 0; r < result.spans.size(); ++r) {
    std::vector<std::string> cells(slots, std::string(width, '.'));
    for (const auto& sp : result.spans[r]) {
      const long a = std::lround(sp.start_s / slot_s), b = std::lround(sp.end_s / slot_s);
      std::string tok = action_token(sp.action, with_stage);
      tok.resize(width, ' ');
      for (long k = a; k < b && k < slots; ++k) cells[k] = tok;
    }
    os << "rank " << r << ":";
    for (const auto& c : cells) os << " " << c;
    os << "\n";
  }
  return os.str();
}

}  // namespace tl
