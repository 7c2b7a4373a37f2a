#include "parallel/step.h"

#include <algorithm>

namespace tl {

Tally Tally::from(const at::Tensor& t) {
  TORCH_CHECK(t.defined() && t.numel() == kTallySize, "Tally: expected ", kTallySize, " sums, got ",
              t.defined() ? t.numel() : 0);
  at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
  const double* p = c.data_ptr<double>();
  return {p[0], p[1], p[2]};
}

double StepTiming::bubble() const {
  double compute = 0;
  for (double c : compute_s) compute += c;
  const double total = step_s * static_cast<double>(compute_s.size());
  return total > 0 ? std::max(0.0, 1.0 - compute / total) : 0.0;
}

}  // namespace tl
