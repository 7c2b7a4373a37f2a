#include "compression/cuda/aqsgd_cuda.h"
#include "compression/cuda/aqsgd_logic.h"
#include "compression/cuda/quant_cuda.h"  // no_cuda_kernels

namespace tl::codec::gpu {
namespace {
thread_local int64_t t_host_runs = 0;
}  // namespace

#ifndef TAPELINE_CUDA_KERNELS
void aqsgd_delta_cuda(int, const float*, const CacheRows&, float*) { no_cuda_kernels("aqsgd"); }
void aqsgd_update_cuda(int, const float*, const CacheRows&, float*) { no_cuda_kernels("aqsgd"); }
#endif

void aqsgd_delta_host(const float* x, const CacheRows& m, float* delta) {
  ++t_host_runs;
  for (int64_t i = 0, e = cache_items(m); i < e; ++i) aqsgd_delta_item(x, m, i, delta);
}

void aqsgd_update_host(const float* c, const CacheRows& m, float* out) {
  ++t_host_runs;
  for (int64_t i = 0, e = cache_items(m); i < e; ++i) aqsgd_update_item(c, m, i, out);
}

int64_t aqsgd_host_runs() { return t_host_runs; }

}  // namespace tl::codec::gpu
