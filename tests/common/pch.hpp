// The headers every test program parses: GoogleTest, Eigen's Tensor module and attnkit's own.
// They are ~6 s of parsing in a test compile of 8-30 s, so tests/CMakeLists.txt precompiles
// them once per flag set (ATTNKIT_TEST_PCH) and every test program of that set reuses them.
// Tests still include what they use: with ATTNKIT_TEST_PCH=OFF they compile as written.
#pragma once

#include <gtest/gtest.h>

#include "attnkit/attnkit.hpp"
#include "attnkit/eigen.hpp"
