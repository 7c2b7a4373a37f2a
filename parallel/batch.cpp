#include "parallel/batch.h"

namespace tl {

double Batch::weight() const {
  TORCH_CHECK(units.defined() && units.device().is_cpu(), "Batch: units must be a CPU tensor (one entry per row)");
  // Per micro-batch: a loop, not a kernel and a read-back.
  if (units.scalar_type() == at::kLong && units.is_contiguous()) {
    const int64_t* u = units.data_ptr<int64_t>();
    int64_t sum = 0;  // integer counts: exact in any order
    for (int64_t i = 0; i < units.numel(); ++i) sum += u[i];
    return static_cast<double>(sum);
  }
  return static_cast<double>(units.sum().item<int64_t>());
}

Batch Batch::slice(int64_t start, int64_t size) const {
  auto rows = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, start, size) : t; };
  Batch b;
  b.input = rows(input);
  b.target = rows(target);
  b.side = side.slice(start, size);
  b.sample_ids = rows(sample_ids);
  b.units = rows(units);
  b.index = index;
  return b;
}

Batch Batch::to(at::Device device) const {
  auto move = [&](const at::Tensor& t) { return t.defined() ? t.to(device, /*non_blocking=*/true) : t; };
  Batch b = *this;
  b.input = move(input);
  b.target = move(target);
  b.side = side.to(device);
  return b;
}

}  // namespace tl
