// libtl_cuda.so's C entries (compression/cuda/entries.h, Note [CUDA as a plugin] in
// autograd/cuda_plugin.h): each calls the launcher of the same name in the .cu files. The plugin is
// linked with -Bsymbolic, so these calls stay inside it whatever else the process defines.
#include "compression/cuda/entries.h"

#include <c10/cuda/CUDAFunctions.h>

using namespace tl::codec;
using namespace tl::codec::gpu;

extern "C" {

void tl_cuda_quantise_pack(int device, const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  quantise_pack_cuda(device, x, g, q, out);
}
void tl_cuda_unpack_dequantise(int device, const uint8_t* in, const QuantGeometry& g, const DequantParams& q,
                               float* out) {
  unpack_dequantise_cuda(device, in, g, q, out);
}
void tl_cuda_quantise_pack_residual(int device, const float* x, const QuantGeometry& g, const QuantParams& q,
                                    const DequantParams& d, uint8_t* out, float* residual) {
  quantise_pack_residual_cuda(device, x, g, q, d, out, residual);
}
void tl_cuda_quant_scales(int device, const float* v, const float* mx, const ScaleParams& p, uint8_t* wire, float* a,
                          float* b, float* step, float* lo) {
  quant_scales_cuda(device, v, mx, p, wire, a, b, step, lo);
}
void tl_cuda_quant_derive(int device, const uint8_t* wire, const ScaleParams& p, float* step, float* lo) {
  quant_derive_cuda(device, wire, p, step, lo);
}
void tl_cuda_quant_tensor(int device, const float* x, const QuantGeometry& g, const QuantParams& q,
                          const ScaleParams& p, float* partials, uint8_t* body, float* residual) {
  quant_tensor_cuda(device, x, g, q, p, partials, body, residual);
}
void tl_cuda_dequant_tensor(int device, const uint8_t* body, const QuantGeometry& g, const ScaleParams& p, float* out) {
  dequant_tensor_cuda(device, body, g, p, out);
}
void tl_cuda_channel_scales(int device, const float* x, int64_t outer, int64_t inner, const ScaleParams& p,
                            uint8_t* wire, float* a, float* b, float* step, float* lo) {
  channel_scales_cuda(device, x, outer, inner, p, wire, a, b, step, lo);
}
void tl_cuda_block_scales(int device, const float* x, int64_t n, int64_t block, const ScaleParams& p, float* partials,
                          uint8_t* wire, float* a, float* b, float* step, float* lo) {
  block_scales_cuda(device, x, n, block, p, partials, wire, a, b, step, lo);
}
void tl_cuda_sparse_pack(int device, const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body) {
  sparse_pack_cuda(device, x, idx, s, body);
}
void tl_cuda_bitmap_counts(int device, const uint8_t* bitmap, int64_t bytes, int64_t* counts) {
  bitmap_counts_cuda(device, bitmap, bytes, counts);
}
void tl_cuda_sparse_unpack(int device, const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out) {
  sparse_unpack_cuda(device, body, ranks, s, out);
}
void tl_cuda_topk_select(int device, const float* x, const TopkShape& s, uint8_t* zeroed, uint8_t* rest, int64_t* idx) {
  topk_select_cuda(device, x, s, zeroed, rest, idx);
}
void tl_cuda_aqsgd_delta(int device, const float* x, const CacheRows& m, float* delta) {
  aqsgd_delta_cuda(device, x, m, delta);
}
void tl_cuda_aqsgd_update(int device, const float* c, const CacheRows& m, float* out) {
  aqsgd_update_cuda(device, c, m, out);
}
void tl_cuda_set_sync_debug_mode(int mode) {
  c10::cuda::warning_state().set_sync_debug_mode(mode == 0   ? c10::cuda::SyncDebugMode::L_DISABLED
                                                 : mode == 1 ? c10::cuda::SyncDebugMode::L_WARN
                                                             : c10::cuda::SyncDebugMode::L_ERROR);
}

}  // extern "C"
