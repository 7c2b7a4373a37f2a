// The registry of schedules by name, and building a schedule's lists from it: compute lists from the
// record's generator, lowered (parallel/lowering.h), and kept once built (cached_schedule).
#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <tuple>

#include "parallel/lowering.h"
#include "parallel/schedule.h"
#include "parallel/schedule_generators.h"

namespace tl {

const std::vector<ScheduleKind>& schedule_kinds() {
  // name, placement, stages per rank min..max (0: any), how they sit, generator, help
  static const std::vector<ScheduleKind> kinds = {
      {"gpipe", Placement::RoundRobin, 1, 1, "", gpipe_compute, "GPipe: every forward, then every backward"},
      {"1f1b", Placement::RoundRobin, 1, 1, "", one_f_one_b_compute,
       "1F1B (the default): warm-up forwards, then one forward and one backward in turn, then the cool-down "
       "backwards"},
      {"interleaved", Placement::RoundRobin, 1, 0, "places stages r, r + P, r + 2P, ... on rank r", interleaved_compute,
       "Megatron's interleaved 1F1B over pipeline.virtual_stages stages per rank"},
      {"zbh1", Placement::RoundRobin, 1, 1, "", zbh1_compute,
       "zero-bubble ZB-H1, each backward split into the input's gradient and the weights'"},
      {"zbv", Placement::V, 2, 2, "places two stages on each rank in a V", zbv_compute,
       "zero-bubble ZB-V, two stages per rank in a V (pipeline.virtual_stages = 2)"},
  };
  return kinds;
}

std::string ScheduleKind::virtual_stages_problem(int v) const {
  if (accepts_virtual_stages(v)) return "";
  const std::string got = "pipeline.virtual_stages = " + std::to_string(v);
  if (max_virtual_stages == 1) {
    std::vector<std::string> ok;
    for (const ScheduleKind& k : schedule_kinds())
      if (k.accepts_virtual_stages(v)) ok.emplace_back(k.name);
    std::string list;
    for (size_t i = 0; i < ok.size(); ++i) list += (i == 0 ? "" : i + 1 == ok.size() ? " or " : ", ") + ok[i];
    return got + " needs pipeline.schedule = " + list + " (" + name + " runs one stage per rank)";
  }
  const std::string rule = min_virtual_stages == max_virtual_stages ? "= " + std::to_string(min_virtual_stages)
                                                                    : ">= " + std::to_string(min_virtual_stages);
  return "pipeline.schedule = " + std::string(name) + " " + stages_per_rank + ": it needs pipeline.virtual_stages " +
         rule + " (got " + std::to_string(v) + ")";
}

const ScheduleKind* find_schedule_kind(const std::string& name) {
  for (const ScheduleKind& k : schedule_kinds())
    if (name == k.name) return &k;
  return nullptr;
}

const char* known_schedules() {
  static const std::string text = [] {
    std::string s;
    for (const ScheduleKind& k : schedule_kinds()) s += (s.empty() ? "" : ", ") + std::string(k.name);
    return s;
  }();
  return text.c_str();
}

const ScheduleKind& schedule_kind(const std::string& name) {
  const ScheduleKind* k = find_schedule_kind(name);
  TORCH_CHECK(k, "unknown pipeline schedule '", name, "'; known: ", known_schedules());
  return *k;
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const ScheduleKind& k : schedule_kinds()) out.emplace_back(k.name);
  return out;
}

std::string schedules_help() {
  std::string out;
  for (const ScheduleKind& k : schedule_kinds()) out += (out.empty() ? "" : "; ") + std::string(k.name) + ": " + k.help;
  return out;
}

Placement placement_of(const std::string& schedule) { return schedule_kind(schedule).placement; }

std::vector<RankSchedule> compute_schedule(const std::string& name, const StageLayout& layout, int micro_batches) {
  check_schedule_sizes(layout, micro_batches);
  const ScheduleKind& kind = schedule_kind(name);
  TORCH_CHECK(
      layout.placement == kind.placement, "pipeline.schedule = ", name, " runs on ",
      kind.placement == Placement::V ? "a V placement of the stages" : "the round-robin placement of the stages",
      ", the layout given has the other (StageLayout::of(stages, v, placement_of(schedule)))");
  const std::string problem = kind.virtual_stages_problem(layout.virtual_stages);
  TORCH_CHECK(problem.empty(), problem);
  return kind.generate(layout, micro_batches);
}

std::vector<RankSchedule> make_schedule(const std::string& name, const StageLayout& layout, int micro_batches) {
  return lower(compute_schedule(name, layout, micro_batches), layout);
}

std::vector<RankSchedule> make_schedule(const std::string& name, int stages, int micro_batches) {
  TORCH_CHECK(stages >= 1, "schedule: stages must be >= 1, got ", stages);
  return make_schedule(name, StageLayout{stages, 1}, micro_batches);
}

std::vector<RankSchedule> forward_only_schedule(const StageLayout& layout) {
  check_schedule_sizes(layout, 1);
  std::vector<RankSchedule> compute_lists(layout.ranks);
  for (int r = 0; r < layout.ranks; ++r)
    for (int s : layout.stages_of(r)) compute_lists[r].push_back(Action{ActionType::Forward, s, 0});
  return lower(compute_lists, layout);
}

namespace {

// Plans by (schedule name, ranks, virtual stages, placement, micro-batches); "" names the
// forward-only plan. std::map keeps its values in place, so references stay valid.
using PlanKey = std::tuple<std::string, int, int, Placement, int>;

template <typename Build>
const std::vector<RankSchedule>& cached(const PlanKey& key, Build build) {
  static std::mutex mutex;
  static std::map<PlanKey, std::vector<RankSchedule>> plans;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  std::vector<RankSchedule> plan = build();  // outside the lock; a racing builder's copy is dropped
  std::lock_guard<std::mutex> lock(mutex);
  return plans.emplace(key, std::move(plan)).first->second;
}

}  // namespace

const std::vector<RankSchedule>& cached_schedule(const std::string& name, const StageLayout& layout,
                                                 int micro_batches) {
  const PlanKey key{name, layout.ranks, layout.virtual_stages, layout.placement, micro_batches};
  return cached(key, [&] { return make_schedule(name, layout, micro_batches); });
}

const std::vector<RankSchedule>& cached_forward_only_schedule(const StageLayout& layout) {
  const PlanKey key{"", layout.ranks, layout.virtual_stages, layout.placement, 1};
  return cached(key, [&] { return forward_only_schedule(layout); });
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

}  // namespace tl
