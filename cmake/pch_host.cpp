// An empty translation unit: the target that compiles it builds a precompiled header for one
// flag set (tests/CMakeLists.txt, CMakeLists.txt's examples), which the test and example
// programs built with the same flags reuse.
