// The action IR: kinds of actions, the placement of stages on ranks, and the text form of a list
// (printed and parsed back).
#include "parallel/schedule.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <sstream>

namespace tl {

bool is_compute(ActionType t) {
  return t == ActionType::Forward || t == ActionType::Backward || t == ActionType::BackwardInput ||
         t == ActionType::BackwardWeight;
}
bool takes_gradient(ActionType t) { return t == ActionType::Backward || t == ActionType::BackwardInput; }
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
              " does not divide the ", stages,
              " stages (model.cuts + 1): each pipeline rank holds the same number of "
              "stages");
  // A V placement holds what the schedule that runs on it accepts (two stages per rank).
  for (const ScheduleKind& k : schedule_kinds()) {
    if (k.placement != placement || placement == Placement::RoundRobin) continue;
    const std::string problem = k.virtual_stages_problem(virtual_stages);
    TORCH_CHECK(problem.empty(), problem);
  }
  return StageLayout{stages / virtual_stages, virtual_stages, placement};
}

void check_schedule_sizes(const StageLayout& layout, int micro_batches) {
  TORCH_CHECK(layout.ranks >= 1, "schedule: stages must be >= 1, got ", layout.ranks);
  TORCH_CHECK(layout.virtual_stages >= 1, "schedule: virtual stages must be >= 1, got ", layout.virtual_stages);
  TORCH_CHECK(micro_batches >= 1, "schedule: micro_batches must be >= 1, got ", micro_batches);
}

// ---- text ---------------------------------------------------------------------------------------

namespace {

// The prefix of each action kind in a token, in ActionType's order.
struct Prefix {
  ActionType type;
  const char* text;
};
constexpr Prefix kPrefixes[] = {
    {ActionType::Forward, "F"},         {ActionType::Backward, "B"},       {ActionType::SendActivation, "SA"},
    {ActionType::RecvActivation, "RA"}, {ActionType::SendGrad, "SG"},      {ActionType::RecvGrad, "RG"},
    {ActionType::BackwardInput, "I"},   {ActionType::BackwardWeight, "W"},
};

// Whether some rank runs several stages (then tokens name the stage).
bool several_stages_per_rank(const std::vector<RankSchedule>& schedule) {
  for (const auto& l : schedule)
    for (const Action& a : l)
      if (a.stage != l.front().stage) return true;
  return false;
}

std::string format_rows(const std::vector<RankSchedule>& schedule, bool with_comm, bool with_stage, bool exact) {
  std::ostringstream os;
  for (size_t r = 0; r < schedule.size(); ++r) {
    os << "rank " << r << ":";
    for (const Action& a : schedule[r]) {
      if (!with_comm && !is_compute(a.type)) continue;
      os << " " << action_token(a, with_stage);
      if (exact && a.type == ActionType::SendGrad && !a.critical) os << "+";
    }
    os << "\n";
  }
  return os.str();
}

// Reads a non-negative decimal at `i` of `s` (advancing i); -1 when there is none.
int read_number(const std::string& s, size_t& i) {
  const size_t start = i;
  long v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && v < (1L << 30)) v = v * 10 + (s[i++] - '0');
  return i == start ? -1 : static_cast<int>(v);
}

}  // namespace

std::string action_token(const Action& a, bool with_stage) {
  const char* p = "?";
  for (const Prefix& x : kPrefixes)
    if (x.type == a.type) p = x.text;
  std::string t(p);
  t += std::to_string(a.micro_batch);
  if (with_stage) t += 's' + std::to_string(a.stage);
  if (a.type == ActionType::SendGrad && !a.compress_backward) t += "~";
  return t;
}

std::string format_schedule(const std::vector<RankSchedule>& schedule, bool with_comm) {
  return format_rows(schedule, with_comm, several_stages_per_rank(schedule), /*exact=*/false);
}

std::string schedule_text(const std::vector<RankSchedule>& schedule) {
  return format_rows(schedule, /*with_comm=*/true, /*with_stage=*/true, /*exact=*/true);
}

Action parse_action(const std::string& token, int rank, const StageLayout& layout) {
  auto bad = [&](const char* why) {
    TORCH_CHECK(false, "schedule text: token '", token, "' on rank ", rank, ": ", why,
                "; expected F, B, I, W, SA, RA, SG or RG, a micro-batch, optionally s and a stage, and on SG "
                "optionally ~ (compress_backward = false) and + (critical = false), e.g. F3, SG0s2~+");
  };
  size_t i = 0;
  const Prefix* kind = nullptr;
  for (const Prefix& x : kPrefixes) {  // two-letter prefixes never begin with a one-letter one
    const std::string p = x.text;
    if (token.compare(0, p.size(), p) == 0) kind = &x, i = p.size();
  }
  if (!kind) bad("unknown action");
  Action a{kind->type, -1, read_number(token, i)};
  if (a.micro_batch < 0) bad("no micro-batch");
  if (i < token.size() && token[i] == 's') {
    ++i;
    a.stage = read_number(token, i);
    if (a.stage < 0 || a.stage >= layout.stages()) bad("no stage of the layout after 's'");
  } else {
    const std::vector<int> own = layout.stages_of(rank);
    if (own.size() != 1) bad("no stage, and the rank holds several");
    a.stage = own.front();
  }
  if (a.type == ActionType::SendGrad && i < token.size() && token[i] == '~') a.compress_backward = false, ++i;
  if (a.type == ActionType::SendGrad && i < token.size() && token[i] == '+') a.critical = false, ++i;
  if (i != token.size()) bad("unexpected characters at the end");
  if (!is_compute(a.type)) {
    const int other = peer_stage(a);
    if (other < 0 || other >= layout.stages()) bad("a message to a stage the layout does not have");
    a.peer = layout.rank_of(other);
  }
  return a;
}

std::vector<RankSchedule> parse_schedule(const std::string& text, const StageLayout& layout) {
  std::vector<RankSchedule> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const int r = static_cast<int>(out.size());
    const std::string head = "rank " + std::to_string(r) + ":";
    TORCH_CHECK(line.compare(0, head.size(), head) == 0, "schedule text: row ", r + 1, " '", line,
                "' does not start with '", head, "' (one row per rank, in order)");
    TORCH_CHECK(r < layout.ranks, "schedule text: ", r + 1, " rows for a layout of ", layout.ranks, " ranks");
    std::istringstream tokens(line.substr(head.size()));
    RankSchedule l;
    for (std::string t; tokens >> t;) l.push_back(parse_action(t, r, layout));
    out.push_back(std::move(l));
  }
  TORCH_CHECK(static_cast<int>(out.size()) == layout.ranks, "schedule text: ", out.size(), " rows for a layout of ",
              layout.ranks, " ranks");
  return out;
}

}  // namespace tl
