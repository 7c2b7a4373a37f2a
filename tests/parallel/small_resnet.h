// A ResNet-8 of one-channel 28x28 inputs and the vision task's loss, for the tests of the pipeline
// and of the executors.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "autograd/ops.h"
#include "layers/models/resnet.h"
#include "parallel/step.h"

namespace tl::testing {

/// resnet8, 1 input channel, 10 classes, width 0.5, its weights drawn from `seed`.
inline std::shared_ptr<ResNet> small_resnet(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return make_resnet("resnet8", 1, 10, 0.5, gen);
}

/// Classification as the vision task defines it: mean cross-entropy, tally [loss sum, n, correct].
inline MicroBatchLoss ce(const Variable& logits, const Batch& mb) {
  Variable loss = cross_entropy(logits, mb.target);
  const double n = static_cast<double>(mb.rows());
  at::Tensor correct = logits.data().argmax(1).eq(mb.target).sum().to(at::kDouble);
  return {loss, at::stack({loss.data().to(at::kDouble) * n, at::full({}, n, at::kDouble), correct})};
}

}  // namespace tl::testing
