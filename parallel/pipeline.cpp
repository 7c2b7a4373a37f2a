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

Variable Pipeline::forward(const Variable& x, const CodecContext& ctx) {
  Variable h = x;
  for (size_t i = 0; i < stages_.size(); ++i) {
    h = stages_[i]->forward(h);
    if (i < boundaries_.size()) h = boundaries_[i]->forward(h, ctx);
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

StepResult Pipeline::train_step(const at::Tensor& x, const at::Tensor& target, const at::Tensor& sample_ids,
                                int64_t micro_batches, const LossFn& loss_fn, int64_t epoch) {
  TORCH_CHECK(x.dim() >= 1 && target.dim() == 1 && x.size(0) == target.size(0), "Pipeline::train_step: ", x.sizes(),
              " inputs and ", target.sizes(), " targets; expected the same number of rows");
  TORCH_CHECK(!sample_ids.defined() || sample_ids.numel() == x.size(0), "Pipeline::train_step: ", sample_ids.numel(),
              " sample ids for ", x.size(0), " rows");
  GradAccumulator acc(parameters());
  StepResult r;
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(x.device()));
  at::Tensor correct = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(x.device()));
  int64_t index = 0;
  for (const auto& [start, size] : micro_batch_slices(x.size(0), micro_batches)) {
    CodecContext ctx;
    ctx.micro_batch = index++;
    ctx.epoch = epoch;
    if (sample_ids.defined()) ctx.sample_ids = sample_ids.narrow(0, start, size);
    at::Tensor y = target.narrow(0, start, size);
    Tape tape;  // this micro-batch's graph, freed as a unit when the scope ends
    TapeGuard guard(tape);
    Variable logits = forward(Variable(x.narrow(0, start, size)), ctx);  // (b, classes)
    Variable loss = loss_fn(logits, y);
    acc.backward(loss, static_cast<double>(size));
    loss_sum += loss.data().detach().to(at::kDouble) * static_cast<double>(size);
    correct += logits.data().argmax(1).eq(y).sum();
    r.samples += size;
    ++r.micro_batches;
  }
  acc.finish();
  r.loss = loss_sum.item<double>() / static_cast<double>(r.samples);  // one sync per step
  r.correct = correct.item<int64_t>();
  return r;
}

at::Tensor Pipeline::predict(const at::Tensor& x, bool compression) {
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
    out = forward(Variable(x), CodecContext{}).data();
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

BoundaryStats Pipeline::total_stats() const {
  BoundaryStats total;
  for (const auto& b : boundaries_) {
    BoundaryStats s = b->stats();
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

void Pipeline::reset_stats() {
  for (const auto& b : boundaries_) b->reset_stats();
}

}  // namespace tl
