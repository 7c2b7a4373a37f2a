#pragma once
// Batch: what a task hands to the pipeline for one optimizer step (or one evaluation batch), in
// the task-neutral form every executor understands. The pipeline splits it into micro-batches by
// rows; it never looks inside `target` (the task's loss does).

#include <ATen/ATen.h>

#include <cstdint>

#include "layers/models/splittable.h"

namespace tl {

struct Batch {
  at::Tensor input;       // (B, ...) the first stage's input: images (B, C, H, W) float, token ids (B, T) int64
  at::Tensor target;      // (B, ...) task-defined: class ids (B), next-token ids (B, T) with -100 ignored
  StageInputs side;       // travels to every stage with the micro-batch (attention mask, token ids)
  at::Tensor sample_ids;  // (B) int64 on the CPU: dataset indices (AQ-SGD caches key on them); may be undefined
  at::Tensor units;       // (B) int64 on the CPU: loss units per row (1 per sample, or counted tokens)
  int64_t index = 0;      // position of the batch in its epoch

  int64_t rows() const { return input.defined() ? input.size(0) : 0; }
  /// Loss units of the whole batch: the weight of its gradient among micro-batches (no device sync:
  /// `units` lives on the CPU).
  double weight() const;
  /// Rows [start, start + size) of every tensor (views).
  Batch slice(int64_t start, int64_t size) const;
  /// input, target and side moved to `device` (sample_ids and units stay on the CPU).
  Batch to(at::Device device) const;
};

}  // namespace tl
