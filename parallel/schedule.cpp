// The action IR: kinds of actions, the placement of stages on ranks, and the text form of a list.
#include "parallel/schedule.h"

#include <c10/util/Exception.h>

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

std::string format_rows(const std::vector<RankSchedule>& schedule, bool with_comm, bool with_stage) {
  std::ostringstream os;
  for (size_t r = 0; r < schedule.size(); ++r) {
    os << "rank " << r << ":";
    for (const Action& a : schedule[r]) {
      if (!with_comm && !is_compute(a.type)) continue;
      os << " " << action_token(a, with_stage);
    }
    os << "\n";
  }
  return os.str();
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
  return format_rows(schedule, with_comm, several_stages_per_rank(schedule));
}

}  // namespace tl
