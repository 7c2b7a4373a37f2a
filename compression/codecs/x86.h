#pragma once
// The x86-64 intrinsics (<immintrin.h>) for the CPU fast paths; nothing on other targets.
//
// GCC 12 reports "'__Y' (may be) used uninitialized" inside avx512fintrin.h wherever an AVX-512
// intrinsic whose unmasked form passes _mm512_undefined_*() is inlined (GCC bug 105593, fixed in
// GCC 13). They are false positives; a file that includes this header has both warnings off from
// here on.
#if defined(__x86_64__)
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif
