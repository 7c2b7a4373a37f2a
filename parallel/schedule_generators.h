#pragma once
// The compute schedules: per rank, the order of its forwards and backwards (no messages; lower()
// in parallel/lowering.h adds those). Each is the generator of one record of the registry
// (schedule_kinds() in parallel/schedule.h), which checks the layout and the micro-batch count
// against the record before calling it; callers go through compute_schedule / make_schedule.

#include "parallel/schedule.h"

namespace tl {

/// GPipe, one stage per rank: every forward (0..M-1), then every backward (0..M-1).
std::vector<RankSchedule> gpipe_compute(const StageLayout& layout, int micro_batches);
/// 1F1B, one stage per rank: min(S - s - 1, M) warm-up forwards, one forward and one backward in
/// turn, then the cool-down backwards.
std::vector<RankSchedule> one_f_one_b_compute(const StageLayout& layout, int micro_batches);
/// Megatron's interleaved 1F1B over layout.virtual_stages round-robin stages per rank (1F1B with
/// one); micro_batches a multiple of layout.ranks when v > 1.
std::vector<RankSchedule> interleaved_compute(const StageLayout& layout, int micro_batches);
/// ZB-H1, one stage per rank: 1F1B with every backward split into I and W (Note [ZB-H1]).
std::vector<RankSchedule> zbh1_compute(const StageLayout& layout, int micro_batches);
/// ZB-V: two stages per rank in a V placement, every backward split (Note [ZB-V]).
std::vector<RankSchedule> zbv_compute(const StageLayout& layout, int micro_batches);

}  // namespace tl
