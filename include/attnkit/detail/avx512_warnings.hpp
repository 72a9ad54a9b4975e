// ATTNKIT_AVX512_WARNINGS_OFF / ATTNKIT_AVX512_WARNINGS_ON: around the first inclusion of a
// third-party SIMD header (Eigen in attnkit/eigen.hpp, xsimd in simd/xsimd_compat.hpp).
//
// GCC 12 reports -Wmaybe-uninitialized (and -Wuninitialized) inside its own AVX-512 intrinsic
// headers whenever Eigen's or xsimd's AVX-512 code inlines one of the "undefined register"
// idioms (`__m512 __Y = __Y;`): a false positive, GCC bug 105593, fixed in GCC 13. GCC honours a
// diagnostic pragma when any location of the inlining chain lies inside it, and every such chain
// passes through the wrapped header, so ignoring the two warnings there keeps users' -Werror
// builds clean without hiding warnings about attnkit's or the user's own code.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#define ATTNKIT_AVX512_WARNINGS_OFF                                   \
    _Pragma("GCC diagnostic push")                                    \
    _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")       \
    _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define ATTNKIT_AVX512_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define ATTNKIT_AVX512_WARNINGS_OFF
#define ATTNKIT_AVX512_WARNINGS_ON
#endif
