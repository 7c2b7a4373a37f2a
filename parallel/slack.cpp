// The slack of gradient sends on a step's dependency graph (parallel/slack.h).
#include "parallel/slack.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace tl {

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

}  // namespace tl
