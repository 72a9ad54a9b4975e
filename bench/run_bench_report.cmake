# Script behind the bench_report target: run the benchmarks into JSON, then print the report.
#   cmake -DBENCH=<bench exe> -DREPORT=<report exe> -DJSON=<out.json> -DMARKDOWN=<out.md>
#         [-DFILTER=<regex>] [-DREPETITIONS=<n>] -P run_bench_report.cmake
# The environment variables ATTNKIT_BENCH_FILTER / ATTNKIT_BENCH_REPETITIONS override FILTER /
# REPETITIONS (so `ATTNKIT_BENCH_FILTER=decode cmake --build build --target bench_report` works
# without reconfiguring).
foreach(_var BENCH REPORT JSON MARKDOWN)
    if(NOT DEFINED ${_var})
        message(FATAL_ERROR "run_bench_report.cmake: -D${_var}=... is required")
    endif()
endforeach()
if(DEFINED ENV{ATTNKIT_BENCH_FILTER})
    set(FILTER "$ENV{ATTNKIT_BENCH_FILTER}")
endif()
if(DEFINED ENV{ATTNKIT_BENCH_REPETITIONS})
    set(REPETITIONS "$ENV{ATTNKIT_BENCH_REPETITIONS}")
endif()
if(NOT REPETITIONS MATCHES "^[1-9][0-9]*$")
    set(REPETITIONS 1)
endif()

set(_args "--benchmark_out=${JSON}" "--benchmark_out_format=json")
if(NOT FILTER STREQUAL "")
    list(APPEND _args "--benchmark_filter=${FILTER}")
endif()
if(REPETITIONS GREATER 1)
    # The program caps heavy cases at 3 repetitions and the reference at 1 (see its header).
    list(APPEND _args "--benchmark_repetitions=${REPETITIONS}"
                      "--benchmark_display_aggregates_only=true")
endif()

message(STATUS "${BENCH} ${_args}")
# Console output (one line per benchmark) goes to the terminal as progress.
execute_process(COMMAND ${CMAKE_COMMAND} -E env "ATTNKIT_BENCH_REPETITIONS=${REPETITIONS}"
                        "${BENCH}" ${_args}
                RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "benchmark run failed (${_rc})")
endif()
execute_process(COMMAND "${REPORT}" "${JSON}" --output "${MARKDOWN}" RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "report failed (${_rc})")
endif()
message(STATUS "JSON: ${JSON}")
message(STATUS "Markdown: ${MARKDOWN}")
