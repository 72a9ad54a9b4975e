// attnkit version: the single source of truth, parsed by CMake.
//
//   #if ATTNKIT_VERSION >= 100   // 0.1.0 or later (MMmmpp)
#pragma once

#define ATTNKIT_VERSION_MAJOR 0
#define ATTNKIT_VERSION_MINOR 1
#define ATTNKIT_VERSION_PATCH 0

// MMmmpp, e.g. 10203 for 1.2.3.
#define ATTNKIT_VERSION (ATTNKIT_VERSION_MAJOR * 10000 + ATTNKIT_VERSION_MINOR * 100 + ATTNKIT_VERSION_PATCH)
