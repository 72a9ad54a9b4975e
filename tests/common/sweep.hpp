// How much of a cross-product sweep a test build runs.
//
// The native build runs every combination. The multi-arch variants and the sanitizer builds
// (tests/CMakeLists.txt defines ATTNKIT_TEST_REDUCED_SWEEP for them) are there for other code
// paths of the same cases: another vector width's main loops and tails, and ASan/UBSan/TSan's
// checks of every access. A sweep's shapes (the lane and tile edges, masks, GQA, lengths) are
// what reaches those paths, not the product of the shapes with a second axis such as the 16-bit
// storage type, so the reduced builds keep every structured shape and take the second axis in
// rotation (shape i with choice i mod n): each choice still meets a third or so of the shapes,
// spread over all of them. Seeded random samples on top of the structured shapes are shortened
// (a prefix of the native sample), and thread-count sweeps keep one pool size past one thread.
// All at a fraction of the run time: the 4-lane SSE2 build and the instrumented ones run several
// times slower than the native one.
#pragma once

#include <cstddef>

namespace attnkit_test {

#ifdef ATTNKIT_TEST_REDUCED_SWEEP
inline constexpr bool kReducedSweep = true;
#else
inline constexpr bool kReducedSweep = false;
#endif
// The sanitizer builds (also reduced) may thin a sweep further where its cases differ only in
// values, not in the code they reach; each test says where.
#ifdef ATTNKIT_TEST_SANITIZER_SWEEP
inline constexpr bool kSanitizerSweep = true;
#else
inline constexpr bool kSanitizerSweep = false;
#endif

// Whether case `index` of a sweep runs with choice `choice` of `n_choices` on the second axis:
// always in the full sweep, in rotation in the reduced one.
inline bool sweep_takes(std::size_t index, std::size_t choice, std::size_t n_choices) {
    return !kReducedSweep || index % n_choices == choice;
}

}  // namespace attnkit_test
