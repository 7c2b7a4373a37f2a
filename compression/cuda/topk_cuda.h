#pragma once
// TopK's selection on a device: the k largest magnitudes of each row, as sorted flat indices, by a
// radix select over the keys' bits and an ordered compaction (Note [radix top-k on a device] in
// topk_logic.h), with no read-back to the host. The fused packing kernels (sparse_cuda.h) then
// write the payload from those indices. The same steps run serially on the host for the CPU tests
// (HostEmulationGuard in quant_cuda.h).

#include <cstdint>

#include "compression/cuda/topk_logic.h"

namespace tl::codec::gpu {

/// x: (rows * D) float32 on CUDA device `device`; zeroed: topk_zeroed_bytes(s) bytes of zeros;
/// rest: topk_rest_bytes(s) bytes; idx: (rows * k) int64, row r's kept flat indices, increasing,
/// at r * k. On the device's current stream. Requires topk_fits_radix(s). Error in a build
/// without the kernels.
void topk_select_cuda(int device, const float* x, const TopkShape& s, uint8_t* zeroed, uint8_t* rest, int64_t* idx);
/// The same steps on host pointers, one after another.
void topk_select_host(const float* x, const TopkShape& s, uint8_t* zeroed, uint8_t* rest, int64_t* idx);
/// How many times topk_select_host ran on this thread (tests: that a codec took this path).
int64_t topk_host_runs();

}  // namespace tl::codec::gpu
