#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>

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
void quant_tensor_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q, const ScaleParams& p,
                       float* partials, uint8_t* body, float* residual) {
  TL_CUDA_CALL(tl_cuda_quant_tensor, "quant", device, x, g, q, p, partials, body, residual);
}
void dequant_tensor_cuda(int device, const uint8_t* body, const QuantGeometry& g, const ScaleParams& p, float* out) {
  TL_CUDA_CALL(tl_cuda_dequant_tensor, "quant", device, body, g, p, out);
}
void channel_scales_cuda(int device, const float* x, int64_t outer, int64_t inner, const ScaleParams& p, uint8_t* wire,
                         float* a, float* b, float* step, float* lo) {
  TL_CUDA_CALL(tl_cuda_channel_scales, "quant", device, x, outer, inner, p, wire, a, b, step, lo);
}
void block_scales_cuda(int device, const float* x, int64_t n, int64_t block, const ScaleParams& p, float* partials,
                       uint8_t* wire, float* a, float* b, float* step, float* lo) {
  TL_CUDA_CALL(tl_cuda_block_scales, "quant", device, x, n, block, p, partials, wire, a, b, step, lo);
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

void quant_tensor_host(const float* x, const QuantGeometry& g, const QuantParams& q, const ScaleParams& p,
                       uint8_t* body, float* residual) {
  // Partial minima and maxima over chunks, then over the partials, as the two kernels reduce.
  const int64_t chunk = 1000;
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
  for (int64_t b = 0; b < g.n; b += chunk) {
    float pmn = std::numeric_limits<float>::infinity(), pmx = -pmn;
    fold_minmax(x, b, std::min(b + chunk, g.n), pmn, pmx);
    mn = min_nan(mn, pmn), mx = max_nan(mx, pmx);
  }
  float a = 0, bb = 0, step = 0, lo = 0;
  tensor_scales(mn, mx, p, body, &a, &bb, &step, &lo);
  const QuantParams tq = tensor_quant_params(q, &a, &bb);
  uint8_t* codes = body + wire_bytes(p);
  if (residual) {
    const DequantParams d = tensor_dequant_params(q, &step, &lo);
    quantise_pack_residual_host(x, g, tq, d, codes, residual);
  } else {
    quantise_pack_host(x, g, tq, codes);
  }
}

void dequant_tensor_host(const uint8_t* body, const QuantGeometry& g, const ScaleParams& p, float* out) {
  float step = 0, lo = 0;
  derive_group(0, body, p, nullptr, nullptr, &step, &lo);
  const QuantParams q{p.bits, p.minmax, false, 0, nullptr, nullptr};
  unpack_dequantise_host(body + wire_bytes(p), g, tensor_dequant_params(q, &step, &lo), out);
}

void block_scales_host(const float* x, int64_t n, int64_t block, const ScaleParams& p, uint8_t* wire, float* a,
                       float* b, float* step, float* lo) {
  for (int64_t s = 0; s < p.groups; ++s) {
    float mn = std::numeric_limits<float>::infinity(), mx = -mn;
    fold_minmax(x, s * block, std::min((s + 1) * block, n), mn, mx);
    scales_group_of(s, scale_value(mn, mx, p.minmax), mx, p, wire, a, b, step, lo);
  }
}

void channel_scales_host(const float* x, int64_t outer, int64_t inner, const ScaleParams& p, uint8_t* wire, float* a,
                         float* b, float* step, float* lo) {
  for (int64_t s = 0; s < p.groups; ++s) {
    float mn = std::numeric_limits<float>::infinity(), mx = -mn;
    for (int64_t o = 0; o < outer; ++o) fold_minmax(x, (o * p.groups + s) * inner, (o * p.groups + s + 1) * inner, mn, mx);
    scales_group_of(s, scale_value(mn, mx, p.minmax), mx, p, wire, a, b, step, lo);
  }
}

HostEmulationGuard::HostEmulationGuard() : prev_(t_host_emulation) { t_host_emulation = true; }
HostEmulationGuard::~HostEmulationGuard() { t_host_emulation = prev_; }
bool host_emulation() { return t_host_emulation; }

}  // namespace tl::codec::gpu
