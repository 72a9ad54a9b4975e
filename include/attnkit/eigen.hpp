// The Eigen headers attnkit uses, included once, here.
#pragma once

// GCC 12 reports -Wmaybe-uninitialized (and -Wuninitialized) inside its own AVX-512 intrinsic
// headers whenever Eigen's AVX-512 packet code (GEMM packing, ptranspose, broadcasts) inlines one
// of the "undefined register" idioms (`__m512 __Y = __Y;`): a false positive, GCC bug 105593,
// fixed in GCC 13, seen with -march=native on AVX-512 machines. GCC honours a diagnostic pragma
// when any location of the inlining chain lies inside it, so ignoring the two warnings around the
// first inclusion of Eigen keeps users' -Werror builds clean without hiding warnings in their own
// code. (A translation unit that includes Eigen itself before attnkit gets Eigen's declarations
// from that earlier inclusion, outside this region.) The same is done for xsimd in
// simd/xsimd_compat.hpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
