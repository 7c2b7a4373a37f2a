#include "tasks/task.h"

#include "tasks/lm.h"
#include "tasks/text.h"
#include "tasks/vision.h"

namespace tl {

std::unique_ptr<Task> make_task(const Config& config) {
  if (config.task.name == "vision") return std::make_unique<VisionTask>(config);
  if (config.task.name == "text") return std::make_unique<TextClassificationTask>(config);
  if (config.task.name == "lm") return std::make_unique<LanguageModelTask>(config);
  TORCH_CHECK(false, "task.name = ", config.task.name, ": unknown task; known: vision, text, lm");
}

MicroBatchLoss classification_loss(const Variable& logits, const Batch& mb) {
  TORCH_CHECK(logits.dim() == 2 && mb.target.dim() == 1 && logits.size(0) == mb.target.size(0),
              "classification loss: expected logits (b, classes) and targets (b), got ", logits.sizes(), " and ",
              mb.target.sizes());
  Variable loss = cross_entropy(logits, mb.target);
  if (logits.data().is_meta()) return {loss, at::empty({3}, loss.data().options().dtype(at::kDouble))};  // a plan
  const at::Tensor n = at::full({}, static_cast<double>(mb.rows()), logits.data().options().dtype(at::kDouble));
  const at::Tensor correct = logits.data().argmax(1).eq(mb.target).sum().to(at::kDouble);
  return {loss, at::stack({loss.data().detach().to(at::kDouble) * n, n, correct})};
}

MicroBatchLoss next_token_loss(const Variable& logits, const Batch& mb) {
  TORCH_CHECK(logits.dim() == 3 && mb.target.dim() == 2 && logits.size(0) == mb.target.size(0) &&
                  logits.size(1) == mb.target.size(1),
              "next-token loss: expected logits (b, T, V) and targets (b, T), got ", logits.sizes(), " and ",
              mb.target.sizes());
  const int64_t vocab = logits.size(2);
  const at::Tensor target = mb.target.reshape({-1});                         // (b T)
  Variable loss = cross_entropy(reshape(logits, {-1, vocab}), target, kIgnoreIndex);  // mean over counted tokens
  if (logits.data().is_meta()) return {loss, at::empty({3}, loss.data().options().dtype(at::kDouble))};  // a plan
  const at::Tensor counted = target.ne(kIgnoreIndex);
  const at::Tensor n = counted.sum().to(at::kDouble);
  const at::Tensor correct = logits.data().reshape({-1, vocab}).argmax(1).eq(target).logical_and(counted).sum();
  // A micro-batch with no counted token has a NaN mean (0 / 0): it contributes nothing.
  const at::Tensor loss_sum = at::where(n > 0, loss.data().detach().to(at::kDouble) * n, at::zeros_like(n));
  return {loss, at::stack({loss_sum, n, correct.to(at::kDouble)})};
}

}  // namespace tl
