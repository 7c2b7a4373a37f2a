#include "parallel/pipeline.h"

#include "autograd/autograd.h"
#include "layers/optim/grad_utils.h"

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
