// The common kernel instantiations, compiled once for a flag set (include/attnkit/config.hpp,
// "Compiled kernels"): the in-tree tests and examples of that flag set are compiled with
// ATTNKIT_EXTERN_KERNELS and link this unit instead of compiling the kernels in each program.
// A project of its own can do the same with a copy of this file.
#define ATTNKIT_INSTANTIATE_KERNELS
#include <attnkit/attnkit.hpp>
