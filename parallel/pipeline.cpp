#include "parallel/pipeline.h"

#include "autograd/autograd.h"
#include "layers/optim/grad_utils.h"
#include "parallel/executor.h"

namespace tl {

Pipeline::Pipeline(ModulePtr model, std::vector<std::string> cuts, std::vector<BoundaryPtr> boundaries)
    : Module("Pipeline"), model_(std::move(model)), cuts_(std::move(cuts)), boundaries_(std::move(boundaries)) {
  TORCH_CHECK(model_, "Pipeline: model is null");
  auto* splittable = dynamic_cast<Splittable*>(model_.get());
  TORCH_CHECK(splittable != nullptr, "Pipeline: a ", model_->type_name(),
              " cannot be split into stages (it does not implement Splittable)");
  TORCH_CHECK(boundaries_.size() == cuts_.size(), "Pipeline: ", cuts_.size(), " cuts need as many boundaries, got ",
              boundaries_.size());
  stages_ = splittable->split(cuts_);  // validates the cut names
  TORCH_CHECK(stages_.size() == cuts_.size() + 1, "Pipeline: split returned ", stages_.size(), " stages for ",
              cuts_.size(), " cuts");
  register_module("model", model_);
  auto holder = std::make_shared<Module>("Boundaries");
  for (size_t i = 0; i < boundaries_.size(); ++i) {
    TORCH_CHECK(boundaries_[i], "Pipeline: boundary ", i + 1, " is null");
    holder->register_module(std::to_string(i + 1), boundaries_[i]);
  }
  register_module("boundaries", holder);
  set_measure_error(true);
}

void Pipeline::set_measure_error(bool on) {
  measure_.assign(boundaries_.size(), on);
  for (size_t i = 0; i < boundaries_.size(); ++i) {
    const Boundary& b = *boundaries_[i];
    const bool uncompressed = b.forward_codec()->spec() == "identity" && b.backward_codec()->spec() == "identity" &&
                              b.mode() != BackwardMode::None;
    measure_[i] = on && !uncompressed;
    boundaries_[i]->set_measure_error(measure_[i]);
  }
}

std::shared_ptr<Pipeline> Pipeline::build(ModulePtr model, std::vector<std::string> cuts,
                                          const std::vector<BoundarySpec>& specs) {
  TORCH_CHECK(specs.size() == cuts.size(), "Pipeline::build: ", cuts.size(), " cuts but ", specs.size(),
              " boundary specs");
  std::vector<BoundaryPtr> boundaries;
  for (size_t i = 0; i < cuts.size(); ++i) {
    const auto& s = specs[i];
    boundaries.push_back(std::make_shared<Boundary>("boundary " + std::to_string(i + 1) + " (after " + cuts[i] + ")",
                                                    s.forward, s.backward, s.mode, s.active_at_inference));
  }
  return std::make_shared<Pipeline>(std::move(model), std::move(cuts), std::move(boundaries));
}

Variable Pipeline::forward(const Variable& x, const CodecContext& ctx, const StageInputs& inputs) {
  CodecContext c = ctx;
  if (!c.token_ids.defined()) c.token_ids = inputs.token_ids;
  Variable h = x;
  for (size_t i = 0; i < stages_.size(); ++i) {
    h = std::static_pointer_cast<Stage>(stages_[i])->forward(h, inputs);
    if (i < boundaries_.size()) h = boundaries_[i]->forward(h, c);
  }
  return h;
}

std::vector<std::pair<int64_t, int64_t>> Pipeline::micro_batch_slices(int64_t batch, int64_t micro_batches) {
  TORCH_CHECK(micro_batches >= 1, "Pipeline: micro_batches must be >= 1, got ", micro_batches);
  // at::chunk's rule: ceil(B / M) rows per chunk, the last one smaller (so possibly fewer chunks).
  const int64_t size = (batch + micro_batches - 1) / micro_batches;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t start = 0; start < batch; start += size) out.emplace_back(start, std::min(size, batch - start));
  return out;
}

StepResult Pipeline::train_step(const Batch& batch, int64_t micro_batches, const LossFn& loss_fn, const StepPosition& at) {
  // One GradAccumulator over every parameter, so tied parameters (registered in two stages) are
  // divided once: each stage's backward adds its part, seeded with the micro-batch's units.
  GradAccumulator acc(parameters());
  LocalExecutor executor(*this);
  if (!links_.empty()) executor.set_links(links_);
  executor.set_device_model(device_);
  if (!timing_) timing_ = std::make_shared<StepTiming>();
  StepResult r = executor.train_step(batch, micro_batches, schedule_, loss_fn, at, timing_.get());
  acc.add_weight(r.units);
  acc.finish();
  return r;
}

void Pipeline::set_schedule(const std::string& name) {
  schedule_kind(name);  // validates the name
  schedule_ = name;
}

StageLayout Pipeline::layout() const {
  return StageLayout::of(static_cast<int>(num_stages()), virtual_stages_, placement_of(schedule_));
}

void Pipeline::set_virtual_stages(int virtual_stages) {
  StageLayout::of(static_cast<int>(num_stages()), virtual_stages);  // validates the count
  virtual_stages_ = virtual_stages;
}

at::Tensor Pipeline::evaluate_batch(const Batch& batch, bool compression, const LossFn& loss_fn) {
  LocalExecutor executor(*this);
  return executor.evaluate_batch(batch, compression, loss_fn);
}

void Pipeline::set_links(const std::vector<LinkSpec>& links) {
  TORCH_CHECK(links.size() == boundaries_.size(), "Pipeline: ", links.size(), " link specs for ", boundaries_.size(),
              " boundaries");
  links_ = links;
}

const StepTiming& Pipeline::last_timing() const {
  TORCH_CHECK(timing_, "Pipeline: no train_step has run yet");
  return *timing_;
}

at::Tensor Pipeline::predict(const at::Tensor& x, bool compression, const StageInputs& inputs) {
  NoGradGuard no_grad;
  std::vector<bool> saved;
  for (const auto& b : boundaries_) {
    saved.push_back(b->active_at_inference());
    b->set_active_at_inference(compression);
    b->set_measure_error(false);
  }
  auto restore = [&] {
    for (size_t i = 0; i < boundaries_.size(); ++i) {
      boundaries_[i]->set_active_at_inference(saved[i]);
      boundaries_[i]->set_measure_error(measure_[i]);
    }
  };
  at::Tensor out;
  try {
    out = forward(Variable(x), CodecContext{}, inputs).data();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return out;
}

void Pipeline::after_optimizer_step() {
  for (const auto& b : boundaries_) b->after_optimizer_step();
}

BoundaryStats sum_boundary_stats(const std::vector<BoundaryStats>& all) {
  BoundaryStats total;
  for (const BoundaryStats& s : all) {
    for (auto [dst, src] : {std::make_pair(&total.forward, &s.forward), std::make_pair(&total.backward, &s.backward)}) {
      dst->messages += src->messages;
      dst->bytes += src->bytes;
      dst->raw_bytes += src->raw_bytes;
      dst->last_bytes += src->last_bytes;
      dst->last_raw_bytes += src->last_raw_bytes;
      // Means over measured messages: accumulate sums here, divide below.
      dst->rel_error_mean += src->rel_error_mean * static_cast<double>(src->measured);
      dst->density_mean += src->density_mean * static_cast<double>(src->measured);
      dst->measured += src->measured;
    }
  }
  for (DirectionStats* d : {&total.forward, &total.backward}) {
    if (d->measured > 0) {
      d->rel_error_mean /= static_cast<double>(d->measured);
      d->density_mean /= static_cast<double>(d->measured);
    }
  }
  return total;
}

BoundaryStats Pipeline::total_stats() const {
  std::vector<BoundaryStats> all;
  for (const auto& b : boundaries_) all.push_back(b->stats());
  return sum_boundary_stats(all);
}

void Pipeline::reset_stats() {
  for (const auto& b : boundaries_) b->reset_stats();
}

}  // namespace tl
