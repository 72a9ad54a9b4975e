// The Eigen headers for programs that pass Eigen tensors: Eigen/Core and the Tensor module,
// included with GCC 12's false AVX-512 warnings silenced (detail/avx512_warnings.hpp).
//
//   #include "attnkit/eigen.hpp"
//   Eigen::Tensor<float, 4, Eigen::RowMajor> q(1, 128, 8, 64);
//
// The kernel headers include only attnkit/eigen_core.hpp (the bfloat16 and half types) and accept
// Eigen::Tensor and Eigen::TensorMap through declarations (attnkit/view.hpp); the reference
// implementations, the decoder template and the umbrella attnkit.hpp include this header. A
// translation unit that includes Eigen itself before attnkit gets Eigen's declarations from that
// earlier inclusion, outside this region.
#pragma once

#include "attnkit/eigen_core.hpp"
#include "attnkit/view.hpp"

ATTNKIT_AVX512_WARNINGS_OFF
#include <unsupported/Eigen/CXX11/Tensor>
ATTNKIT_AVX512_WARNINGS_ON

static_assert(attnkit::detail::kEigenRowMajor == Eigen::RowMajor,
              "attnkit/view.hpp spells Eigen::RowMajor differently from this Eigen");
