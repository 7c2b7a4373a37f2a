#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

#include "autograd/cuda_plugin.h"
#include "compression/cuda/entries.h"
#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/quant_logic.h"

namespace tl::codec::gpu {
namespace {
thread_local bool t_host_emulation = false;
}  // namespace

bool kernels_built() {
#ifdef TAPELINE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

bool kernels_enabled() {
  static const bool env_on = [] {
    const char* v = std::getenv("TAPELINE_CUDA_KERNELS");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return kernels_built() && env_on && cuda_plugin_loaded();
}

void no_cuda_kernels(const char* codec) {
  TORCH_CHECK(kernels_built(), codec,
              ": this build of tapeline has no CUDA kernels (configure against a CUDA libtorch with nvcc on PATH, "
              "docs/GPU.md); CUDA tensors take the ATen path");
  TORCH_CHECK(false, codec, ": the CUDA kernels are in libtl_cuda.so, which is ", cuda_plugin_status(),
              " (Note [CUDA as a plugin], autograd/cuda_plugin.h)");
}

// The launchers live in the plugin (Note [CUDA as a plugin]); these find and call them.
void quantise_pack_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  TL_CUDA_CALL(tl_cuda_quantise_pack, "quant", device, x, g, q, out);
}
void unpack_dequantise_cuda(int device, const uint8_t* in, const QuantGeometry& g, const DequantParams& q,
                            float* out) {
  TL_CUDA_CALL(tl_cuda_unpack_dequantise, "quant", device, in, g, q, out);
}
void quantise_pack_residual_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q,
                                 const DequantParams& d, uint8_t* out, float* residual) {
  TL_CUDA_CALL(tl_cuda_quantise_pack_residual, "ef(quant)", device, x, g, q, d, out, residual);
}
void quant_scales_cuda(int device, const float* v, const float* mx, const ScaleParams& p, uint8_t* wire, float* a,
                       float* b, float* step, float* lo) {
  TL_CUDA_CALL(tl_cuda_quant_scales, "quant", device, v, mx, p, wire, a, b, step, lo);
}
void quant_derive_cuda(int device, const uint8_t* wire, const ScaleParams& p, float* step, float* lo) {
  TL_CUDA_CALL(tl_cuda_quant_derive, "quant", device, wire, p, step, lo);
}

void quant_scales_host(const float* v, const float* mx, const ScaleParams& p, uint8_t* wire, float* a, float* b,
                       float* step, float* lo) {
  for (int64_t s = 0; s < p.groups; ++s) scales_group(s, v, mx, p, wire, a, b, step, lo);
}

void quant_derive_host(const uint8_t* wire, const ScaleParams& p, float* step, float* lo) {
  for (int64_t s = 0; s < p.groups; ++s) derive_group(s, wire, p, nullptr, nullptr, step, lo);
}

void quantise_pack_residual_host(const float* x, const QuantGeometry& g, const QuantParams& q, const DequantParams& d,
                                 uint8_t* out, float* residual) {
  for (int64_t grp = 0, e = pack_groups(g.n); grp < e; ++grp)
    quantise_pack_residual_group(x, grp, g, q, d, out, residual);
}

void quantise_pack_host(const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  for (int64_t grp = 0, e = pack_groups(g.n); grp < e; ++grp) quantise_pack_group(x, grp, g, q, out);
}

void unpack_dequantise_host(const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out) {
  for (int64_t grp = 0, e = pack_groups(g.n); grp < e; ++grp) unpack_dequantise_group(in, grp, g, q, out);
}

HostEmulationGuard::HostEmulationGuard() : prev_(t_host_emulation) { t_host_emulation = true; }
HostEmulationGuard::~HostEmulationGuard() { t_host_emulation = prev_; }
bool host_emulation() { return t_host_emulation; }

}  // namespace tl::codec::gpu
