// The Eigen headers attnkit uses, included once, here, with GCC 12's false AVX-512 warnings
// silenced (detail/avx512_warnings.hpp). A translation unit that includes Eigen itself before
// attnkit gets Eigen's declarations from that earlier inclusion, outside this region.
#pragma once

#include "attnkit/detail/avx512_warnings.hpp"

ATTNKIT_AVX512_WARNINGS_OFF
#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>
ATTNKIT_AVX512_WARNINGS_ON
