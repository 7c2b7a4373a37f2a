#include "parallel/executor.h"

#include <sys/resource.h>

namespace tl {

StageLayout ScheduleSettings::layout(int stages) const {
  return StageLayout::of(stages, virtual_stages, schedule_kind(schedule).placement);  // the name, then the placement
}

int64_t peak_resident_bytes() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
}

int64_t parameter_bytes(const Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += static_cast<int64_t>(p.numel() * p.data().element_size());
  return n;
}

int64_t optimizer_state_bytes(const Optimizer& optimizer) {
  int64_t n = 0;
  for (const auto& [k, t] : optimizer.state_dict())
    if (k.rfind("state.", 0) == 0) n += static_cast<int64_t>(t.numel() * t.element_size());
  return n;
}

std::map<std::pair<int, int>, LinkSpec> link_specs_by_rank_pair(const StageLayout& layout,
                                                                const std::vector<LinkSpec>& boundary_links) {
  std::map<std::pair<int, int>, LinkSpec> out;
  std::map<std::pair<int, int>, size_t> first_boundary;
  for (size_t b = 0; b < boundary_links.size(); ++b) {
    const int a = layout.rank_of(static_cast<int>(b)), c = layout.rank_of(static_cast<int>(b) + 1);
    if (a == c) continue;  // both stages on one rank: no link
    const LinkSpec& spec = boundary_links[b];
    for (auto pair : {std::make_pair(a, c), std::make_pair(c, a)}) {
      auto seen = first_boundary.find(pair);
      if (seen == first_boundary.end()) {
        first_boundary[pair] = b;
        out[pair] = spec;
        continue;
      }
      const LinkSpec& other = boundary_links[seen->second];
      TORCH_CHECK(other.bandwidth_mbps == spec.bandwidth_mbps && other.latency_ms == spec.latency_ms, "boundary.",
                  seen->second + 1, " (", other.describe(), ") and boundary.", b + 1, " (", spec.describe(),
                  ") cross the same link, between pipeline ranks ", pair.first, " and ", pair.second,
                  " (pipeline.virtual_stages = ", layout.virtual_stages, "): give them the same bandwidth and latency");
    }
  }
  return out;
}

}  // namespace tl
