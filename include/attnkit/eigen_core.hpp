// Eigen/Core, included here with GCC 12's false AVX-512 warnings silenced: what attnkit's kernels
// need from Eigen (the Eigen::bfloat16 and Eigen::half storage types; Eigen has no smaller header
// that declares them). The Tensor module is attnkit/eigen.hpp's.
//
//   #include "attnkit/eigen_core.hpp"
//   Eigen::bfloat16 x(1.5f);
//
// A translation unit that includes Eigen itself before attnkit gets Eigen's declarations from that
// earlier inclusion, outside this region.
#pragma once

#include "attnkit/detail/avx512_warnings.hpp"

ATTNKIT_AVX512_WARNINGS_OFF
#include <Eigen/Core>
ATTNKIT_AVX512_WARNINGS_ON
