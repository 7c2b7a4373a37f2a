#include "parallel/schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

namespace tl {

bool is_compute(ActionType t) { return t == ActionType::Forward || t == ActionType::Backward; }
bool is_send(ActionType t) { return t == ActionType::SendActivation || t == ActionType::SendGrad; }
bool is_recv(ActionType t) { return t == ActionType::RecvActivation || t == ActionType::RecvGrad; }

int peer_stage(const Action& a) {
  switch (a.type) {
    case ActionType::SendActivation:
    case ActionType::RecvGrad:
      return a.stage + 1;
    case ActionType::RecvActivation:
    case ActionType::SendGrad:
      return a.stage - 1;
    default:
      return -1;
  }
}

namespace {

void check_sizes(int stages, int micro_batches) {
  TORCH_CHECK(stages >= 1, "schedule: stages must be >= 1, got ", stages);
  TORCH_CHECK(micro_batches >= 1, "schedule: micro_batches must be >= 1, got ", micro_batches);
}

// Appends one forward of micro-batch mb on stage s with its messages.
void add_forward(RankSchedule& l, int s, int S, int mb) {
  if (s > 0) l.push_back({ActionType::RecvActivation, s, mb});
  l.push_back({ActionType::Forward, s, mb});
  if (s < S - 1) l.push_back({ActionType::SendActivation, s, mb});
}

void add_backward(RankSchedule& l, int s, int S, int mb, bool compress = true) {
  if (s < S - 1) l.push_back({ActionType::RecvGrad, s, mb});
  l.push_back({ActionType::Backward, s, mb});
  if (s > 0) l.push_back({ActionType::SendGrad, s, mb, compress});
}

}  // namespace

std::vector<RankSchedule> gpipe_schedule(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  std::vector<RankSchedule> out(stages);
  for (int s = 0; s < stages; ++s) {
    for (int mb = 0; mb < micro_batches; ++mb) add_forward(out[s], s, stages, mb);
    for (int mb = 0; mb < micro_batches; ++mb) add_backward(out[s], s, stages, mb);
  }
  return out;
}

std::vector<RankSchedule> one_f_one_b_schedule(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  const int S = stages, M = micro_batches;
  std::vector<RankSchedule> out(S);
  for (int s = 0; s < S; ++s) {
    RankSchedule& l = out[s];
    const int warmup = std::min(S - s - 1, M);
    const int steady = M - warmup;
    for (int f = 0; f < warmup; ++f) add_forward(l, s, S, f);
    // Steady state: forward f = warmup + i, backward b = i. The input of the next forward is
    // received before the gradient is sent (Note [blocking send/recv and the order of messages on
    // a link]); so is the input of the first steady forward, right after the warm-up.
    if (steady > 0 && s > 0) l.push_back({ActionType::RecvActivation, s, warmup});
    for (int i = 0; i < steady; ++i) {
      const int f = warmup + i, b = i;
      l.push_back({ActionType::Forward, s, f});
      if (s < S - 1) l.push_back({ActionType::SendActivation, s, f});
      if (s < S - 1) l.push_back({ActionType::RecvGrad, s, b});
      l.push_back({ActionType::Backward, s, b});
      if (s > 0 && f + 1 < M) l.push_back({ActionType::RecvActivation, s, f + 1});
      // Off the critical path unless it is the last steady-state send (Note [epilogue-only]).
      if (s > 0) l.push_back({ActionType::SendGrad, s, b, /*compress_backward=*/i == steady - 1});
    }
    for (int b = steady; b < M; ++b) add_backward(l, s, S, b);
  }
  return out;
}

std::vector<RankSchedule> make_schedule(const std::string& name, int stages, int micro_batches) {
  if (name == "gpipe") return gpipe_schedule(stages, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(stages, micro_batches);
  TORCH_CHECK(false, "unknown pipeline schedule '", name, "'; known: gpipe, 1f1b");
}

std::string action_token(const Action& a) {
  const char* p = "?";
  switch (a.type) {
    case ActionType::Forward:
      p = "F";
      break;
    case ActionType::Backward:
      p = "B";
      break;
    case ActionType::SendActivation:
      p = "SA";
      break;
    case ActionType::RecvActivation:
      p = "RA";
      break;
    case ActionType::SendGrad:
      p = "SG";
      break;
    case ActionType::RecvGrad:
      p = "RG";
      break;
  }
  std::string t = p + std::to_string(a.micro_batch);
  if (a.type == ActionType::SendGrad && !a.compress_backward) t += "~";
  return t;
}

std::string format_schedule(const std::vector<RankSchedule>& schedule, bool with_comm) {
  std::ostringstream os;
  for (size_t r = 0; r < schedule.size(); ++r) {
    os << "rank " << r << ":";
    for (const Action& a : schedule[r]) {
      if (with_comm || is_compute(a.type)) os << " " << action_token(a);
    }
    os << "\n";
  }
  return os.str();
}

void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches) {
  const int S = static_cast<int>(schedule.size());
  TORCH_CHECK(S >= 1, "schedule: no ranks");
  for (int r = 0; r < S; ++r) {
    // Position of each action kind per micro-batch (-1: absent).
    std::map<std::pair<ActionType, int>, int> pos;
    for (int i = 0; i < static_cast<int>(schedule[r].size()); ++i) {
      const Action& a = schedule[r][i];
      TORCH_CHECK(a.stage == r, "schedule: rank ", r, " action ", i, " (", action_token(a), ") belongs to stage ",
                  a.stage, "; one stage per rank: list r holds stage r's actions");
      TORCH_CHECK(a.micro_batch >= 0 && a.micro_batch < micro_batches, "schedule: rank ", r, " action ", i, " (",
                  action_token(a), ") micro-batch out of range [0, ", micro_batches, ")");
      const int peer = peer_stage(a);
      TORCH_CHECK(peer < S && (is_compute(a.type) || peer >= 0), "schedule: rank ", r, " action ", i, " (",
                  action_token(a), ") talks to stage ", peer, ", which does not exist (", S, " stages)");
      TORCH_CHECK(pos.emplace(std::make_pair(a.type, a.micro_batch), i).second, "schedule: rank ", r, " action ", i,
                  " (", action_token(a), ") appears twice");
    }
    auto at = [&](ActionType t, int mb) {
      auto it = pos.find({t, mb});
      return it == pos.end() ? -1 : it->second;
    };
    for (int mb = 0; mb < micro_batches; ++mb) {
      const int f = at(ActionType::Forward, mb), b = at(ActionType::Backward, mb);
      const std::string where = "schedule: rank " + std::to_string(r) + " micro-batch " + std::to_string(mb) + ": ";
      TORCH_CHECK(f >= 0 && b >= 0, where, "needs one forward and one backward");
      TORCH_CHECK(f < b, where, "backward before forward");
      const int ra = at(ActionType::RecvActivation, mb), sa = at(ActionType::SendActivation, mb);
      const int rg = at(ActionType::RecvGrad, mb), sg = at(ActionType::SendGrad, mb);
      const bool first = r == 0, last = r == S - 1;
      TORCH_CHECK(first ? ra < 0 : (ra >= 0 && ra < f), where,
                  first ? "the first stage receives no activation" : "must receive its activation before the forward");
      TORCH_CHECK(last ? sa < 0 : sa > f, where,
                  last ? "the last stage sends no activation" : "must send its activation after the forward");
      TORCH_CHECK(last ? rg < 0 : (rg >= 0 && rg < b), where,
                  last ? "the last stage receives no gradient" : "must receive its gradient before the backward");
      TORCH_CHECK(first ? sg < 0 : sg > b, where,
                  first ? "the first stage sends no gradient" : "must send its gradient after the backward");
    }
  }
}

// ---- simulation ----------------------------------------------------------------------------------

SimCosts SimCosts::uniform(int stages, double forward_s, double backward_s) {
  SimCosts c;
  c.forward_s.assign(stages, forward_s);
  c.backward_s.assign(stages, backward_s);
  return c;
}

double SimResult::bubble() const {
  if (step_s <= 0.0 || compute_s.empty()) return 0.0;
  double busy = 0.0;
  for (double c : compute_s) busy += c;
  return 1.0 - busy / (static_cast<double>(compute_s.size()) * step_s);
}

namespace {

// The message a send or recv action moves: (kind, micro-batch), kind 0 = activation, 1 = gradient.
std::pair<int, int> message_of(const Action& a) {
  const bool act = a.type == ActionType::SendActivation || a.type == ActionType::RecvActivation;
  return {act ? 0 : 1, a.micro_batch};
}

struct InFlight {
  std::pair<int, int> msg;
  double ready_s;  // eager: when the receiver may have it; queue: when the send thread may start it
};

}  // namespace

SimResult simulate_schedule(const std::vector<RankSchedule>& schedule, const SimCosts& costs, SendMode mode) {
  const int S = static_cast<int>(schedule.size());
  TORCH_CHECK(static_cast<int>(costs.forward_s.size()) == S && static_cast<int>(costs.backward_s.size()) == S,
              "simulate_schedule: costs for ", costs.forward_s.size(), " / ", costs.backward_s.size(),
              " stages (forward / backward), schedule has ", S);
  SimResult res;
  res.compute_s.assign(S, 0.0);
  res.finish_s.assign(S, 0.0);
  res.spans.assign(S, {});
  std::vector<size_t> pc(S, 0);
  std::vector<double> t(S, 0.0);
  // Eager: messages in flight per directed link (src, dst). SendQueue: per rank, its pending sends
  // (dst, message, enqueue time) and when its send thread is next free.
  std::map<std::pair<int, int>, std::deque<InFlight>> wire;
  std::vector<std::deque<std::tuple<int, std::pair<int, int>, double>>> queue(S);
  std::vector<double> queue_free(S, 0.0);

  auto cost_of = [&](const Action& a) {
    const bool act = a.type == ActionType::SendActivation || a.type == ActionType::RecvActivation;
    return act ? costs.activation_s : costs.grad_s;
  };
  auto mismatch = [&](int r, const Action& a, std::pair<int, int> got) {
    TORCH_CHECK(false, "simulate_schedule: rank ", r, " at ", action_token(a), " would receive ",
                got.first == 0 ? "activation " : "gradient ", got.second, " from stage ", peer_stage(a),
                ": the two ends of the link order their messages differently");
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < S; ++r) {
      // The send thread (SendQueue): its head completes when the peer's main list is at the recv.
      while (mode == SendMode::SendQueue && !queue[r].empty()) {
        auto [dst, msg, enq] = queue[r].front();
        if (pc[dst] >= schedule[dst].size()) break;
        const Action& p = schedule[dst][pc[dst]];
        if (!is_recv(p.type) || peer_stage(p) != r) break;
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
          const double d = a.type == ActionType::Forward ? costs.forward_s[r] : costs.backward_s[r];
          res.spans[r].push_back({a, t[r], t[r] + d});
          t[r] += d;
          res.compute_s[r] += d;
        } else if (is_send(a.type)) {
          const int dst = peer_stage(a);
          if (mode == SendMode::Eager) {
            wire[{r, dst}].push_back({message_of(a), t[r] + cost_of(a)});
          } else if (mode == SendMode::SendQueue) {
            queue[r].emplace_back(dst, message_of(a), t[r]);
          } else {  // Rendezvous: both ends must be at the message.
            if (pc[dst] >= schedule[dst].size()) break;
            const Action& p = schedule[dst][pc[dst]];
            if (!is_recv(p.type) || peer_stage(p) != r) break;
            if (message_of(p) != message_of(a)) mismatch(dst, p, message_of(a));
            const double done = std::max(t[r], t[dst]) + cost_of(a);
            t[r] = t[dst] = done;
            ++pc[dst];
          }
        } else {  // recv
          const int src = peer_stage(a);
          if (mode != SendMode::Eager) break;  // completed by the sender's side above
          auto& q = wire[{src, r}];
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
  for (int r = 0; r < S; ++r) {
    if (pc[r] < schedule[r].size()) stuck << " rank " << r << " at " << action_token(schedule[r][pc[r]]) << ";";
    if (!queue[r].empty()) stuck << " rank " << r << "'s send thread holds " << queue[r].size() << " sends;";
  }
  TORCH_CHECK(stuck.str().empty(), "simulate_schedule: deadlock under ",
              mode == SendMode::Rendezvous  ? "rendezvous"
              : mode == SendMode::SendQueue ? "send-queue"
                                            : "eager",
              " sends:", stuck.str());
  for (int r = 0; r < S; ++r) {
    res.finish_s[r] = t[r];
    res.step_s = std::max(res.step_s, t[r]);
  }
  return res;
}

double ideal_step_time(int stages, int micro_batches, double forward_s, double backward_s) {
  check_sizes(stages, micro_batches);
  return (micro_batches + stages - 1) * (forward_s + backward_s);
}

std::string format_timeline(const SimResult& result, double slot_s) {
  TORCH_CHECK(slot_s > 0.0, "format_timeline: slot_s must be > 0, got ", slot_s);
  const long slots = std::lround(std::ceil(result.step_s / slot_s - 1e-9));
  size_t width = 2;
  for (const auto& spans : result.spans)
    for (const auto& sp : spans) width = std::max(width, action_token(sp.action).size());
  std::ostringstream os;
  for (size_t r = 0; r < result.spans.size(); ++r) {
    std::vector<std::string> cells(slots, std::string(width, '.'));
    for (const auto& sp : result.spans[r]) {
      const long a = std::lround(sp.start_s / slot_s), b = std::lround(sp.end_s / slot_s);
      std::string tok = action_token(sp.action);
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
