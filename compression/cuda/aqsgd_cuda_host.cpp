#include "compression/cuda/aqsgd_cuda.h"
#include "compression/cuda/aqsgd_logic.h"
#include "compression/cuda/entries.h"
#include "compression/cuda/quant_cuda.h"  // no_cuda_kernels

namespace tl::codec::gpu {
namespace {
thread_local int64_t t_aqsgd_host_runs = 0;
}  // namespace

// The launchers live in the plugin (Note [CUDA as a plugin], autograd/cuda_plugin.h).
void aqsgd_delta_cuda(int device, const float* x, const CacheRows& m, float* delta) {
  TL_CUDA_CALL(tl_cuda_aqsgd_delta, "aqsgd", device, x, m, delta);
}
void aqsgd_update_cuda(int device, const float* c, const CacheRows& m, float* out) {
  TL_CUDA_CALL(tl_cuda_aqsgd_update, "aqsgd", device, c, m, out);
}

void aqsgd_delta_host(const float* x, const CacheRows& m, float* delta) {
  ++t_aqsgd_host_runs;
  for (int64_t i = 0, e = cache_items(m); i < e; ++i) aqsgd_delta_item(x, m, i, delta);
}

void aqsgd_update_host(const float* c, const CacheRows& m, float* out) {
  ++t_aqsgd_host_runs;
  for (int64_t i = 0, e = cache_items(m); i < e; ++i) aqsgd_update_item(c, m, i, out);
}

int64_t aqsgd_host_runs() { return t_aqsgd_host_runs; }

}  // namespace tl::codec::gpu
