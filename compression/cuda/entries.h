#pragma once
// The extern "C" entries of libtl_cuda.so (Note [CUDA as a plugin], autograd/cuda_plugin.h): the
// CUDA kernels' launchers, each under a C name that cuda_plugin_function finds. Defined only in the
// plugin (compression/cuda/entries.cpp); the executables take their types (decltype) and look
// them up, so nothing in an executable refers to libtorch_cuda.

#include "autograd/cuda_plugin.h"
#include "compression/cuda/aqsgd_cuda.h"
#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/sparse_cuda.h"
#include "compression/cuda/topk_cuda.h"

extern "C" {
void tl_cuda_quantise_pack(int device, const float* x, const tl::codec::QuantGeometry& g,
                           const tl::codec::QuantParams& q, uint8_t* out);
void tl_cuda_unpack_dequantise(int device, const uint8_t* in, const tl::codec::QuantGeometry& g,
                               const tl::codec::DequantParams& q, float* out);
void tl_cuda_quantise_pack_residual(int device, const float* x, const tl::codec::QuantGeometry& g,
                                    const tl::codec::QuantParams& q, const tl::codec::DequantParams& d, uint8_t* out,
                                    float* residual);
void tl_cuda_quant_scales(int device, const float* v, const float* mx, const tl::codec::gpu::ScaleParams& p,
                          uint8_t* wire, float* a, float* b, float* step, float* lo);
void tl_cuda_quant_derive(int device, const uint8_t* wire, const tl::codec::gpu::ScaleParams& p, float* step,
                          float* lo);
void tl_cuda_quant_tensor(int device, const float* x, const tl::codec::QuantGeometry& g,
                          const tl::codec::QuantParams& q, const tl::codec::gpu::ScaleParams& p, float* partials,
                          uint8_t* body, float* residual);
void tl_cuda_dequant_tensor(int device, const uint8_t* body, const tl::codec::QuantGeometry& g,
                            const tl::codec::gpu::ScaleParams& p, float* out);
void tl_cuda_channel_scales(int device, const float* x, int64_t outer, int64_t inner,
                            const tl::codec::gpu::ScaleParams& p, uint8_t* wire, float* a, float* b, float* step,
                            float* lo);
void tl_cuda_block_scales(int device, const float* x, int64_t n, int64_t block, const tl::codec::gpu::ScaleParams& p,
                          float* partials, uint8_t* wire, float* a, float* b, float* step, float* lo);
void tl_cuda_sparse_pack(int device, const float* x, const int64_t* idx, const tl::codec::gpu::SparseLayout& s,
                         uint8_t* body);
void tl_cuda_bitmap_counts(int device, const uint8_t* bitmap, int64_t bytes, int64_t* counts);
void tl_cuda_sparse_unpack(int device, const uint8_t* body, const int64_t* ranks, const tl::codec::gpu::SparseLayout& s,
                           float* out);
void tl_cuda_topk_select(int device, const float* x, const tl::codec::gpu::TopkShape& s, uint8_t* zeroed, uint8_t* rest,
                         int64_t* idx);
void tl_cuda_aqsgd_delta(int device, const float* x, const tl::codec::gpu::CacheRows& m, float* delta);
void tl_cuda_aqsgd_update(int device, const float* c, const tl::codec::gpu::CacheRows& m, float* out);
/// c10's CUDA synchronisation check: 0 off, 2 every host synchronisation is an error (the tests).
void tl_cuda_set_sync_debug_mode(int mode);
}

namespace tl::codec::gpu {

/// The plugin's entry `name` of type F; fails naming `codec` (and why the plugin is absent) when
/// it is not loaded. Callers keep it in a function-local static: found once, then kept (a failed
/// lookup throws, so it is tried again on the next call).
template <class F>
F* cuda_entry(const char* name, const char* codec) {
  F* f = cuda_plugin_function<F>(name);
  if (f == nullptr) no_cuda_kernels(codec);
  return f;
}

/// Calls the plugin's entry NAME (declared above) for CODEC with the arguments that follow.
#define TL_CUDA_CALL(NAME, CODEC, ...)                                                     \
  do {                                                                                     \
    static auto* const entry = ::tl::codec::gpu::cuda_entry<decltype(NAME)>(#NAME, CODEC); \
    entry(__VA_ARGS__);                                                                    \
  } while (false)

}  // namespace tl::codec::gpu
