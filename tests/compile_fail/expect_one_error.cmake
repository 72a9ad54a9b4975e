# One compile-failure case (tests/compile_fail/CMakeLists.txt): compiles TARGET's source with
# its exact command from BUILD_DIR/compile_commands.json, checking only (-fsyntax-only: a
# static_assert is a front-end error, no code need be generated), and passes when the compile
# fails, its output matches EXPECT (the static_assert's text) and, with MAX_ERRORS set, the
# compiler printed at most that many "error:" lines: a wrong argument must give one clear
# message, not that message followed by errors from inside the library.
# The compiler runs directly, not through a nested build of the tree, so cases run side by side.
#   cmake -DBUILD_DIR=... -DTARGET=... -DEXPECT=regex [-DMAX_ERRORS=1] -P expect_one_error.cmake
file(READ "${BUILD_DIR}/compile_commands.json" db)
# Each entry is {"directory", "command", "file"[, "output"]}: the object file in TARGET's object
# directory first appears in its command (-o ...); the entry begins at the "directory" before it.
string(FIND "${db}" "CMakeFiles/${TARGET}.dir/" at)
if(at EQUAL -1)
    message(FATAL_ERROR "${TARGET}: no compile command in ${BUILD_DIR}/compile_commands.json")
endif()
string(SUBSTRING "${db}" 0 ${at} before)
string(FIND "${before}" "\"directory\": \"" entry_at REVERSE)
if(entry_at EQUAL -1)
    message(FATAL_ERROR "${TARGET}: cannot read its entry of compile_commands.json")
endif()
string(SUBSTRING "${db}" ${entry_at} -1 entry)
string(REGEX REPLACE "\n}.*" "" entry "${entry}")
if(NOT entry MATCHES "\"directory\": \"([^\n]*)\",\n")
    message(FATAL_ERROR "${TARGET}: cannot read its entry of compile_commands.json")
endif()
set(directory "${CMAKE_MATCH_1}")
if(NOT entry MATCHES "\"command\": \"([^\n]*)\",?\n")
    message(FATAL_ERROR "${TARGET}: its entry of compile_commands.json has no command")
endif()
set(command "${CMAKE_MATCH_1}")
# JSON string escapes that a compile command can hold.
string(REPLACE "\\\"" "\"" command "${command}")
string(REPLACE "\\\\" "\\" command "${command}")
separate_arguments(args UNIX_COMMAND "${command}")

execute_process(COMMAND ${args} -fsyntax-only WORKING_DIRECTORY "${directory}"
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
