# One compile-failure case (tests/compile_fail/CMakeLists.txt): builds TARGET in BUILD_DIR and
# passes when the build fails, its output matches EXPECT (the static_assert's text) and, with
# MAX_ERRORS set, the compiler printed at most that many "error:" lines: a wrong argument must
# give one clear message, not that message followed by errors from inside the library.
#   cmake -DBUILD_DIR=... -DTARGET=... -DCONFIG=... -DEXPECT=regex [-DMAX_ERRORS=1] -P expect_one_error.cmake
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}" --config "${CONFIG}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
    message(FATAL_ERROR "${TARGET} compiled, but it must fail with: ${EXPECT}")
endif()
if(NOT out MATCHES "${EXPECT}")
    message(FATAL_ERROR "${TARGET} failed without the expected message '${EXPECT}':\n${out}")
endif()
string(REGEX MATCHALL "error:" errors "${out}")
list(LENGTH errors n)
if(DEFINED MAX_ERRORS AND NOT MAX_ERRORS STREQUAL "" AND n GREATER MAX_ERRORS)
    message(FATAL_ERROR "${TARGET}: ${n} compiler errors, expected at most ${MAX_ERRORS}:\n${out}")
endif()
message(STATUS "${TARGET}: failed as expected with ${n} compiler error(s)")
