#pragma once
// Fused CUDA kernels of AQ-SGD's cache passes (compression/stateful/aqsgd.cpp), and the same
// per-element logic (aqsgd_logic.h) run serially on the host for the CPU tests
// (HostEmulationGuard in quant_cuda.h). The sender's delta x - m(id) is one gather-subtract pass;
// the update m(id) <- m(id) + C(x - m(id)) (both ends; the receiver also outputs the new m(id)) is
// one read-add-round-write pass over the cache rows in place. Which path a CUDA tensor takes: Note
// [CUDA kernels or ATen ops] in quant_cuda.h.

#include <cstdint>

#include "compression/cuda/sparse_cuda.h"  // WireType: the cache's storage type

namespace tl::codec::gpu {

/// B rows of D values: sample b's cache row is rows + ids[b] * D, stored as `dtype`. ids are
/// distinct (checked_sample_ids), so no two threads touch one row.
struct CacheRows {
  void* rows;
  WireType dtype;
  int64_t d;
  const int64_t* ids;  // (B)
  int64_t batch;
};

/// delta (B, D) = x (B, D) - m(ids), in float32. Pointers on CUDA device `device`, its current stream.
void aqsgd_delta_cuda(int device, const float* x, const CacheRows& m, float* delta);
/// m(ids) <- round_to_dtype(m(ids) + c) for c (B, D) float32; out (B, D), if not null, gets the new
/// m(ids) as float32.
void aqsgd_update_cuda(int device, const float* c, const CacheRows& m, float* out);

void aqsgd_delta_host(const float* x, const CacheRows& m, float* delta);
void aqsgd_update_host(const float* c, const CacheRows& m, float* out);
/// How many times the host loops ran on this thread (tests: that AQ-SGD took the kernels' logic).
int64_t aqsgd_host_runs();

}  // namespace tl::codec::gpu
