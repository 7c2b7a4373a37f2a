#pragma once
// CPU products of PowerSGD (the fast path of Note [two paths] in common.h): a matrix M (rows,
// cols) of float32 against thin factors of r columns, each product one pass over M in tiles
// (Note [thin products in tiles] in lowrank_kernels.cpp). Results depend neither on the number of
// threads nor on the CPU's vector width.

#include <cstdint>

namespace tl::codec {

/// Whether the products below take factors of r columns (at most kMaxThinRank).
constexpr int64_t kMaxThinRank = 16;

/// p (rows, r) = m (rows, cols) q (cols, r); all row-major and contiguous.
void thin_mq_cpu(const float* m, int64_t rows, int64_t cols, const float* q, int64_t r, float* p);
/// q (cols, r) = m (rows, cols)^T p (rows, r).
void thin_mtp_cpu(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* q);
/// a (rows, r), rows >= r, replaced by the Q of its reduced QR: LAPACK's Householder reflections
/// and signs (geqr2, then org2r), computed in double on the calling thread.
void thin_qr_cpu(float* a, int64_t rows, int64_t r);
/// out (rows, cols) = p (rows, r) q (cols, r)^T.
void thin_pqt_cpu(const float* p, int64_t rows, const float* q, int64_t cols, int64_t r, float* out);

}  // namespace tl::codec
