#include "parallel/schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace tl {

bool is_compute(ActionType t) {
  return t == ActionType::Forward || t == ActionType::Backward || t == ActionType::BackwardInput ||
         t == ActionType::BackwardWeight;
}
// The action that takes a stage's output gradient and sends its input's: B, or I of a split backward.
static bool takes_gradient(ActionType t) { return t == ActionType::Backward || t == ActionType::BackwardInput; }
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

std::vector<int> StageLayout::stages_of(int rank) const {
  if (placement == Placement::V) return {rank, 2 * ranks - 1 - rank};
  std::vector<int> out;
  for (int c = 0; c < virtual_stages; ++c) out.push_back(rank + c * ranks);
  return out;
}

StageLayout StageLayout::of(int stages, int virtual_stages, Placement placement) {
  TORCH_CHECK(stages >= 1, "schedule: stages must be >= 1, got ", stages);
  TORCH_CHECK(virtual_stages >= 1 && stages % virtual_stages == 0, "pipeline.virtual_stages = ", virtual_stages,
              " does not divide the ", stages, " stages (model.cuts + 1): each pipeline rank holds the same number of "
              "stages");
  TORCH_CHECK(placement != Placement::V || virtual_stages == 2,
              "pipeline.schedule = zbv places two stages on each rank in a V: it needs pipeline.virtual_stages = 2 "
              "(got ",
              virtual_stages, ")");
  return StageLayout{stages / virtual_stages, virtual_stages, placement};
}

Placement placement_of(const std::string& schedule) {
  return schedule == "zbv" ? Placement::V : Placement::RoundRobin;
}

namespace {

void check_sizes(const StageLayout& layout, int micro_batches) {
  TORCH_CHECK(layout.ranks >= 1, "schedule: stages must be >= 1, got ", layout.ranks);
  TORCH_CHECK(layout.virtual_stages >= 1, "schedule: virtual stages must be >= 1, got ", layout.virtual_stages);
  TORCH_CHECK(micro_batches >= 1, "schedule: micro_batches must be >= 1, got ", micro_batches);
}

Action compute(ActionType t, int stage, int mb) { return Action{t, stage, mb}; }

// GPipe and 1F1B with one stage per rank (stage = rank).
std::vector<RankSchedule> gpipe_compute(int S, int M) {
  std::vector<RankSchedule> out(S);
  for (int s = 0; s < S; ++s) {
    for (int mb = 0; mb < M; ++mb) out[s].push_back(compute(ActionType::Forward, s, mb));
    for (int mb = 0; mb < M; ++mb) out[s].push_back(compute(ActionType::Backward, s, mb));
  }
  return out;
}

std::vector<RankSchedule> one_f_one_b_compute(int S, int M) {
  std::vector<RankSchedule> out(S);
  for (int s = 0; s < S; ++s) {
    const int warmup = std::min(S - s - 1, M);
    for (int f = 0; f < warmup; ++f) out[s].push_back(compute(ActionType::Forward, s, f));
    for (int f = warmup, b = 0; f < M; ++f, ++b) {
      out[s].push_back(compute(ActionType::Forward, s, f));
      out[s].push_back(compute(ActionType::Backward, s, b));
    }
    for (int b = M - warmup; b < M; ++b) out[s].push_back(compute(ActionType::Backward, s, b));
  }
  return out;
}

// Note [ZB-H1]. Qi et al.'s handcrafted zero-bubble schedule with 1F1B's memory. Rank r runs 1F1B's
// compute list with each backward B_k split into I_k (its input's gradient, sent at once: the
// previous rank waits for it) and W_{k-r} (the weight gradients of micro-batch k - r) right after
// it; the last r W's follow the last I. Rank r thus lags its W's by r micro-batches: the last rank,
// which 1F1B keeps busiest at the end, leaves P - 1 of them for its cool-down, where 1F1B idles.
// With uniform stages and free links the step is M (F + I + W) + (P - 1)(F + I - W) for M >= P,
// against 1F1B's (M + P - 1)(F + I + W): with I = W the bubble is a third of 1F1B's. The most
// micro-batches a rank holds (forward run, W not yet) is P, on every rank: 1F1B's peak (rank 0).
std::vector<RankSchedule> zbh1_compute(int S, int M) {
  std::vector<RankSchedule> out = one_f_one_b_compute(S, M);
  for (int s = 0; s < S; ++s) {
    RankSchedule split;
    int w = 0;  // the next W of this rank
    for (const Action& a : out[s]) {
      if (a.type != ActionType::Backward) {
        split.push_back(a);
        continue;
      }
      split.push_back(compute(ActionType::BackwardInput, s, a.micro_batch));
      if (a.micro_batch - s >= 0) split.push_back(compute(ActionType::BackwardWeight, s, w++));
    }
    while (w < M) split.push_back(compute(ActionType::BackwardWeight, s, w++));
    out[s] = std::move(split);
  }
  return out;
}

// Note [ZB-V]. Qi et al.'s zero-bubble schedule on a V placement: rank r holds chunk 0 = stage r
// and chunk 1 = stage 2P - 1 - r, so a micro-batch runs down the ranks on chunk 0 and back up on
// chunk 1, and rank 0 computes the loss. Every backward is split (I, then W). Rank r's list, with
// F0/F1 a forward of chunk 0/1 and counts per chunk (the order torch.distributed.pipelining's
// ScheduleZBVZeroBubble uses):
//   warm-up: 2 (P - r) - 1 times F0; r times F1 F0; P - r times F1 I1 W1;
//   steady:  while forwards are left: F0 (while any), I0 W0, F1 I1 W1;
//   cool-down: r times I0 I1; P - r times I0 W0; then the W1's left, then the W0's left.
// It is built for max(M, 2P - 1) micro-batches and the actions of micro-batches >= M are dropped
// (the order of the others stands). Each rank then holds at most 2P chunk-activations at once, as
// 1F1B's rank 0 holds P whole-stage ones (a chunk is half a stage). With every chunk taking
// F = I = W = 1 and sends that do not wait for their receiver (SendMode::Eager), the simulator
// finds the step 6M + (P - 1) for M >= 2P - 1: the only idle time is the start-up, one chunk
// forward per rank down the V. The same model cut for ZB-H1 (two chunks a stage) takes
// 6M + 2 (P - 1), 1F1B 6 (M + P - 1). With one send in flight per rank (SendMode::SendQueue)
// ZB-V's lead over ZB-H1 is gone: the runtime keeps several in flight (Note [communication
// thread]). As ZB-H1, it needs the send thread (Note [ZB-H1 needs the send thread]), and its two
// directions of a link carry both kinds of message (Note [receive in the order sent]).
std::vector<RankSchedule> zbv_compute(const StageLayout& layout, int M) {
  const int P = layout.ranks;
  TORCH_CHECK(layout.placement == Placement::V && layout.virtual_stages == 2,
              "pipeline.schedule = zbv places two stages on each rank in a V: it needs pipeline.virtual_stages = 2 "
              "(got ",
              layout.virtual_stages, ")");
  const int n = std::max(M, 2 * P - 1);
  std::vector<RankSchedule> out(P);
  for (int r = 0; r < P; ++r) {
    const int c0 = r, c1 = 2 * P - 1 - r;
    int f0 = 0, f1 = 0, i0 = 0, i1 = 0, w0 = 0, w1 = 0;
    RankSchedule l;
    auto add = [&](ActionType t, int stage, int& count) { l.push_back(compute(t, stage, count++)); };
    for (int k = 0; k < 2 * (P - r) - 1; ++k) add(ActionType::Forward, c0, f0);
    for (int k = 0; k < r; ++k) add(ActionType::Forward, c1, f1), add(ActionType::Forward, c0, f0);
    for (int k = 0; k < P - r; ++k)
      add(ActionType::Forward, c1, f1), add(ActionType::BackwardInput, c1, i1), add(ActionType::BackwardWeight, c1, w1);
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(ActionType::Forward, c0, f0);
      add(ActionType::BackwardInput, c0, i0), add(ActionType::BackwardWeight, c0, w0);
      add(ActionType::Forward, c1, f1), add(ActionType::BackwardInput, c1, i1), add(ActionType::BackwardWeight, c1, w1);
    }
    for (int k = 0; k < r; ++k) add(ActionType::BackwardInput, c0, i0), add(ActionType::BackwardInput, c1, i1);
    for (int k = 0; k < P - r; ++k) add(ActionType::BackwardInput, c0, i0), add(ActionType::BackwardWeight, c0, w0);
    while (w1 < i1) add(ActionType::BackwardWeight, c1, w1);
    while (w0 < i0) add(ActionType::BackwardWeight, c0, w0);
    TORCH_CHECK(f0 == n && i0 == n && w0 == n && f1 == n && i1 == n && w1 == n, "zbv schedule: rank ", r,
                " built ", f0, "/", i0, "/", w0, " and ", f1, "/", i1, "/", w1, " F/I/W of its chunks for ", n,
                " micro-batches (a bug)");
    for (const Action& a : l)
      if (a.micro_batch < M) out[r].push_back(a);
  }
  return out;
}

// Megatron's interleaved 1F1B (schedules.py, forward_backward_pipelining_with_interleaving): the
// k-th forward of a rank is micro-batch (k / (P v)) P + k % P on its chunk (k / P) % v; the k-th
// backward the same micro-batch on chunk v - 1 - (k / P) % v. Warm-up: 2 (P - r - 1) + (v - 1) P
// forwards (all of them when that reaches M v), then one forward and one backward, then the rest.
std::vector<RankSchedule> interleaved_compute(const StageLayout& layout, int M) {
  const int P = layout.ranks, v = layout.virtual_stages;
  TORCH_CHECK(M % P == 0, "interleaved schedule: micro_batches = ", M, " must be a multiple of the ", P,
              " pipeline ranks (micro-batches go round the ranks in groups of ", P, ")");
  const int total = M * v;
  std::vector<RankSchedule> out(P);
  for (int r = 0; r < P; ++r) {
    auto stage_of = [&](int k, bool forward) {
      const int chunk = (k / P) % v;
      return (forward ? chunk : v - 1 - chunk) * P + r;
    };
    auto mb_of = [&](int k) { return (k / (P * v)) * P + k % P; };
    const int warmup = std::min(total, 2 * (P - r - 1) + (v - 1) * P);
    for (int k = 0; k < warmup; ++k) out[r].push_back(compute(ActionType::Forward, stage_of(k, true), mb_of(k)));
    for (int f = warmup, b = 0; f < total; ++f, ++b) {
      out[r].push_back(compute(ActionType::Forward, stage_of(f, true), mb_of(f)));
      out[r].push_back(compute(ActionType::Backward, stage_of(b, false), mb_of(b)));
    }
    for (int b = total - warmup; b < total; ++b)
      out[r].push_back(compute(ActionType::Backward, stage_of(b, false), mb_of(b)));
  }
  return out;
}

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
void receive_in_order_sent(std::vector<RankSchedule>& lists) {
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

}  // namespace

std::vector<RankSchedule> lower(const std::vector<RankSchedule>& compute_lists, const StageLayout& layout) {
  TORCH_CHECK(static_cast<int>(compute_lists.size()) == layout.ranks, "lower: ", compute_lists.size(),
              " lists for ", layout.ranks, " pipeline ranks");
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
          const bool hoist = m.type == ActionType::RecvActivation &&
                             std::any_of(sends.begin(), sends.end(), [&](const Action& s) {
                               return s.type == ActionType::SendGrad && s.peer == m.peer;
                             });
          if (hoist) l.push_back(m), pending.push_back(m);
        }
      }
      for (Action m : sends) {
        if (m.type == ActionType::SendGrad) {  // Note [epilogue-only]: critical unless forwards follow
          m.compress_backward = std::none_of(in.begin() + static_cast<std::ptrdiff_t>(i) + 1, in.end(),
                                             [](const Action& b) { return b.type == ActionType::Forward; });
        }
        l.push_back(m);
      }
    }
  }
  receive_in_order_sent(out);
  // Note [slack of a gradient send]: the dependency graph's answer, beside Optimus-CC's. (A list
  // without a backward a message needs, or with a cycle, keeps every send critical:
  // validate_schedule says what is wrong with it.)
  std::map<std::pair<int, int>, double> slack;
  try {
    for (const SendSlack& x : gradient_send_slack(out, SimCosts::uniform(layout.stages(), 1.0, 2.0)))
      slack[{x.send.stage, x.send.micro_batch}] = x.slack_s;
  } catch (const c10::Error&) {
    slack.clear();
  }
  for (auto& l : out)
    for (Action& a : l) {
      auto it = slack.find({a.stage, a.micro_batch});
      if (a.type == ActionType::SendGrad && it != slack.end()) a.critical = it->second < 1e-9;
    }
  return out;
}

const char* known_schedules() { return "gpipe, 1f1b, interleaved, zbh1, zbv"; }

std::vector<RankSchedule> compute_schedule(const std::string& name, const StageLayout& layout, int micro_batches) {
  check_sizes(layout, micro_batches);
  const bool known = name == "gpipe" || name == "1f1b" || name == "interleaved" || name == "zbh1" || name == "zbv";
  TORCH_CHECK(known, "unknown pipeline schedule '", name, "'; known: ", known_schedules());
  TORCH_CHECK((layout.placement == Placement::V) == (name == "zbv"), "pipeline.schedule = ", name, " runs on ",
              name == "zbv" ? "a V placement of the stages" : "the round-robin placement of the stages",
              ", the layout given has the other (StageLayout::of(stages, v, placement_of(schedule)))");
  if (name == "zbv") return zbv_compute(layout, micro_batches);
  if (name == "interleaved" && layout.virtual_stages > 1) return interleaved_compute(layout, micro_batches);
  TORCH_CHECK(layout.virtual_stages == 1, "pipeline.schedule = ", name, " runs one stage per rank, but ",
              "pipeline.virtual_stages = ", layout.virtual_stages, "; use pipeline.schedule = interleaved");
  // Interleaving one stage per rank is 1F1B.
  if (name == "zbh1") return zbh1_compute(layout.ranks, micro_batches);
  return name == "gpipe" ? gpipe_compute(layout.ranks, micro_batches) : one_f_one_b_compute(layout.ranks, micro_batches);
}

std::vector<RankSchedule> make_schedule(const std::string& name, const StageLayout& layout, int micro_batches) {
  return lower(compute_schedule(name, layout, micro_batches), layout);
}

std::vector<RankSchedule> make_schedule(const std::string& name, int stages, int micro_batches) {
  TORCH_CHECK(stages >= 1, "schedule: stages must be >= 1, got ", stages);
  return make_schedule(name, StageLayout{stages, 1}, micro_batches);
}

std::vector<RankSchedule> gpipe_schedule(int stages, int micro_batches) {
  return make_schedule("gpipe", stages, micro_batches);
}

std::vector<RankSchedule> one_f_one_b_schedule(int stages, int micro_batches) {
  return make_schedule("1f1b", stages, micro_batches);
}

std::vector<RankSchedule> interleaved_schedule(int ranks, int virtual_stages, int micro_batches) {
  return make_schedule("interleaved", StageLayout{ranks, virtual_stages}, micro_batches);
}

std::vector<RankSchedule> zbh1_schedule(int stages, int micro_batches) {
  return make_schedule("zbh1", stages, micro_batches);
}

std::vector<RankSchedule> zbv_schedule(int ranks, int micro_batches) {
  TORCH_CHECK(ranks >= 1, "schedule: ranks must be >= 1, got ", ranks);
  return make_schedule("zbv", StageLayout{ranks, 2, Placement::V}, micro_batches);
}

std::vector<RankSchedule> forward_only_schedule(const StageLayout& layout) {
  check_sizes(layout, 1);
  std::vector<RankSchedule> compute_lists(layout.ranks);
  for (int r = 0; r < layout.ranks; ++r)
    for (int s : layout.stages_of(r)) compute_lists[r].push_back(compute(ActionType::Forward, s, 0));
  return lower(compute_lists, layout);
}

std::string action_token(const Action& a, bool with_stage) {
  const char* p = "?";
  switch (a.type) {
    case ActionType::Forward:
      p = "F";
      break;
    case ActionType::Backward:
      p = "B";
      break;
    case ActionType::BackwardInput:
      p = "I";
      break;
    case ActionType::BackwardWeight:
      p = "W";
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
  if (with_stage) t += "s" + std::to_string(a.stage);
  if (a.type == ActionType::SendGrad && !a.compress_backward) t += "~";
  return t;
}

namespace {
// Whether some rank runs several stages (then tokens name the stage).
bool several_stages_per_rank(const std::vector<RankSchedule>& schedule) {
  for (const auto& l : schedule)
    for (const Action& a : l)
      if (a.stage != l.front().stage) return true;
  return false;
}
}  // namespace

std::string format_schedule(const std::vector<RankSchedule>& schedule, bool with_comm) {
  const bool with_stage = several_stages_per_rank(schedule);
  std::ostringstream os;
  for (size_t r = 0; r < schedule.size(); ++r) {
    os << "rank " << r << ":";
    for (const Action& a : schedule[r]) {
      if (with_comm || is_compute(a.type)) os << " " << action_token(a, with_stage);
    }
    os << "\n";
  }
  return os.str();
}

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
      if (layout.virtual_stages > 1) where = "schedule: rank " + std::to_string(r) + " stage " + std::to_string(s) +
                                             " micro-batch " + std::to_string(mb) + ": ";
      TORCH_CHECK(f >= 0 && b >= 0, where, "needs one forward and one backward (B, or I and W)");
      TORCH_CHECK(whole < 0 || (in < 0 && w < 0), where, "has a whole backward and a split one");
      TORCH_CHECK((in >= 0) == (w >= 0), where, in >= 0 ? "has an I without its W" : "has a W without its I");
      TORCH_CHECK(f < b, where, "backward before forward");
      TORCH_CHECK(w < 0 || in < w, where, "runs W before I (the weight gradients need I's pass)");
      const int ra = at(ActionType::RecvActivation, s, mb), sa = at(ActionType::SendActivation, s, mb);
      const int rg = at(ActionType::RecvGrad, s, mb), sg = at(ActionType::SendGrad, s, mb);
      TORCH_CHECK(!msg_in ? ra < 0 : (ra >= 0 && ra < f), where,
                  first ? "the first stage receives no activation"
                  : msg_in ? "must receive its activation before the forward"
                           : "receives no activation from a stage on its own rank");
      TORCH_CHECK(!msg_out ? sa < 0 : sa > f, where,
                  last ? "the last stage sends no activation"
                  : msg_out ? "must send its activation after the forward"
                            : "sends no activation to a stage on its own rank");
      TORCH_CHECK(!msg_out ? rg < 0 : (rg >= 0 && rg < b), where,
                  last ? "the last stage receives no gradient"
                  : msg_out ? "must receive its gradient before the backward"
                            : "receives no gradient from a stage on its own rank");
      TORCH_CHECK(!msg_in ? sg < 0 : sg > b, where,
                  first ? "the first stage sends no gradient"
                  : msg_in ? "must send its gradient after the backward"
                           : "sends no gradient to a stage on its own rank");
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

// ---- simulation ----------------------------------------------------------------------------------

SimCosts SimCosts::uniform(int stages, double forward_s, double backward_s) {
  SimCosts c;
  c.forward_s.assign(stages, forward_s);
  c.backward_s.assign(stages, backward_s);
  return c;
}

double SimCosts::of(const Action& a) const {
  const int s = a.stage;
  const double w = weight_s.empty() ? backward_s[s] / 2 : weight_s[s];
  switch (a.type) {
    case ActionType::Forward:
      return forward_s[s];
    case ActionType::Backward:
      return backward_s[s];
    case ActionType::BackwardInput:
      return backward_s[s] - w;
    case ActionType::BackwardWeight:
      return w;
    default:
      return 0.0;
  }
}

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
  check_sizes(StageLayout{ranks, virtual_stages}, micro_batches);
  return (micro_batches * virtual_stages + ranks - 1) * (forward_s + backward_s);
}

std::vector<SendSlack> gradient_send_slack(const std::vector<RankSchedule>& schedule, const SimCosts& costs) {
  // Nodes: every compute action, keyed by (type, stage, micro-batch).
  struct Node {
    Action a;
    double cost;
    std::vector<int> succ;
    int preds = 0;
  };
  std::vector<Node> nodes;
  std::map<std::tuple<ActionType, int, int>, int> id;
  std::vector<std::vector<int>> per_rank(schedule.size());
  for (size_t r = 0; r < schedule.size(); ++r)
    for (const Action& a : schedule[r])
      if (is_compute(a.type)) {
        id[{a.type, a.stage, a.micro_batch}] = static_cast<int>(nodes.size());
        per_rank[r].push_back(static_cast<int>(nodes.size()));
        nodes.push_back({a, costs.of(a), {}, 0});
      }
  auto edge = [&](int from, int to) {
    nodes[from].succ.push_back(to);
    ++nodes[to].preds;
  };
  // The backward that takes (stage, mb)'s gradient: B, or I of a split backward.
  auto taker = [&](int stage, int mb) {
    auto it = id.find({ActionType::Backward, stage, mb});
    if (it == id.end()) it = id.find({ActionType::BackwardInput, stage, mb});
    TORCH_CHECK(it != id.end(), "gradient_send_slack: stage ", stage, " has no backward of micro-batch ", mb);
    return it->second;
  };
  for (const auto& l : per_rank)
    for (size_t i = 1; i < l.size(); ++i) edge(l[i - 1], l[i]);
  for (int n = 0; n < static_cast<int>(nodes.size()); ++n) {
    const Action& a = nodes[n].a;
    auto next = id.find({ActionType::Forward, a.stage + 1, a.micro_batch});
    if (a.type == ActionType::Forward && next != id.end()) edge(n, next->second);
    if ((a.type == ActionType::Backward || a.type == ActionType::BackwardInput) && a.stage > 0)
      edge(n, taker(a.stage - 1, a.micro_batch));
  }
  // Earliest starts in topological order, latest starts in reverse.
  std::vector<int> order, preds(nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n)
    if ((preds[n] = nodes[n].preds) == 0) order.push_back(static_cast<int>(n));
  for (size_t k = 0; k < order.size(); ++k)
    for (int m : nodes[order[k]].succ)
      if (--preds[m] == 0) order.push_back(m);
  TORCH_CHECK(order.size() == nodes.size(), "gradient_send_slack: the schedule's dependencies form a cycle");
  std::vector<double> es(nodes.size(), 0.0), ls(nodes.size());
  double end = 0;
  for (int n : order) {
    for (int m : nodes[n].succ) es[m] = std::max(es[m], es[n] + nodes[n].cost);
    end = std::max(end, es[n] + nodes[n].cost);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    double latest_end = end;
    for (int m : nodes[*it].succ) latest_end = std::min(latest_end, ls[m]);
    ls[*it] = latest_end - nodes[*it].cost;
  }
  std::vector<SendSlack> out;
  for (size_t r = 0; r < schedule.size(); ++r)
    for (const Action& a : schedule[r]) {
      if (a.type != ActionType::SendGrad) continue;
      const int from = taker(a.stage, a.micro_batch), to = taker(a.stage - 1, a.micro_batch);
      out.push_back({static_cast<int>(r), a, ls[to] - (es[from] + nodes[from].cost)});
    }
  return out;
}

double ideal_zbh1_step_time(int ranks, int micro_batches, double forward_s, double input_s, double weight_s) {
  check_sizes(StageLayout{ranks, 1}, micro_batches);
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
