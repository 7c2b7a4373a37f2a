#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

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
  return kernels_built() && env_on;
}

void no_cuda_kernels(const char* codec) {
  TORCH_CHECK(false, codec,
              ": this build of tapeline has no CUDA kernels (configure against a CUDA libtorch with nvcc on PATH, "
              "docs/GPU.md); CUDA tensors take the ATen path");
}

#ifndef TAPELINE_CUDA_KERNELS
void quantise_pack_cuda(int, const float*, const QuantGeometry&, const QuantParams&, uint8_t*) {
  no_cuda_kernels("quant");
}
void unpack_dequantise_cuda(int, const uint8_t*, const QuantGeometry&, const DequantParams&, float*) {
  no_cuda_kernels("quant");
}
void quantise_pack_residual_cuda(int, const float*, const QuantGeometry&, const QuantParams&, const DequantParams&,
                                 uint8_t*, float*) {
  no_cuda_kernels("ef(quant)");
}
void quant_scales_cuda(int, const float*, const float*, const ScaleParams&, uint8_t*, float*, float*, float*, float*) {
  no_cuda_kernels("quant");
}
void quant_derive_cuda(int, const uint8_t*, const ScaleParams&, float*, float*) { no_cuda_kernels("quant"); }
#endif

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
