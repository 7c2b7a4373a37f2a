#pragma once
// TL_HD marks the logic shared by the CUDA kernels and their host loops (Note [one logic, two
// compilers] in quant_logic.h): __host__ __device__ under nvcc, plain inline C++ under g++.

#if defined(__CUDACC__)
#define TL_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define TL_HD inline __attribute__((always_inline))  // the CPU fast path's loops must stay vectorised
#else
#define TL_HD inline
#endif

// TL_UNROLL: unroll the next loop fully under nvcc (a constant trip count: arrays indexed by its
// variable stay in registers, Note [groups in registers] in quant_logic.h); nothing under g++.
#if defined(__CUDACC__)
#define TL_UNROLL _Pragma("unroll")
#else
#define TL_UNROLL
#endif
