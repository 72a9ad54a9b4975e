# Script behind the bench_report target: run every benchmark program into JSON, then the report
# tool on each, and concatenate the Markdown into report.md. With the suite and the variants' own
# programs (bench-all), scripts/recheck_twins.py then re-measures side by side each suite row
# more than 10% slower than its twin, and scripts/plot_report.py draws the plots and the summary.
#   cmake -DBENCHES=<exe>|<exe>|... -DREPORT=<report exe> -DOUT_DIR=<dir>
#         [-DFILTER=<regex>] [-DREPETITIONS=<n>] [-DONLY=<regex on program names>]
#         -P run_bench_report.cmake
# The environment variables ATTNKIT_BENCH_FILTER / ATTNKIT_BENCH_REPETITIONS override FILTER /
# REPETITIONS, and ATTNKIT_BENCH_ONLY=<regex> picks programs by name (so
# `ATTNKIT_BENCH_ONLY=taylor ATTNKIT_BENCH_FILTER=decode cmake --build build --target
# bench_report` works without reconfiguring).
foreach(_var BENCHES REPORT OUT_DIR)
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
if(DEFINED ENV{ATTNKIT_BENCH_ONLY})
    set(ONLY "$ENV{ATTNKIT_BENCH_ONLY}")
endif()
if(NOT REPETITIONS MATCHES "^[1-9][0-9]*$")
    set(REPETITIONS 1)
endif()

string(REPLACE "|" ";" _benches "${BENCHES}")
set(_report "${OUT_DIR}/report.md")
file(WRITE "${_report}" "# attnkit benchmark report\n\n")
foreach(_bench IN LISTS _benches)
    get_filename_component(_exe_name "${_bench}" NAME_WE)
    string(REGEX REPLACE "^attnkit_" "" _name "${_exe_name}")
    string(REGEX REPLACE "_bench$" "" _name "${_name}")
    if(DEFINED ONLY AND NOT ONLY STREQUAL "" AND NOT _name MATCHES "${ONLY}")
        continue()
    endif()
    set(_json "${OUT_DIR}/${_name}.json")
    list(APPEND _all_jsons "${_json}")
    set(_md "${OUT_DIR}/${_name}.md")
    set(_args "--benchmark_out=${_json}" "--benchmark_out_format=json")
    if(NOT FILTER STREQUAL "")
        list(APPEND _args "--benchmark_filter=${FILTER}")
    endif()
    if(REPETITIONS GREATER 1)
        list(APPEND _args "--benchmark_repetitions=${REPETITIONS}"
                          "--benchmark_display_aggregates_only=true")
    endif()
    message(STATUS "[bench] ${_name}: ${_bench} ${_args}")
    # Console output (one line per benchmark) goes to the terminal as progress.
    execute_process(COMMAND ${CMAKE_COMMAND} -E env "ATTNKIT_BENCH_REPETITIONS=${REPETITIONS}"
                            "${_bench}" ${_args}
                    RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "benchmark ${_name} failed (${_rc})")
    endif()
    execute_process(COMMAND "${REPORT}" "${_json}" --output "${_md}" RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "report for ${_name} failed (${_rc})")
    endif()
    file(READ "${_md}" _text)
    file(APPEND "${_report}" "## ${_name}\n\n${_text}\n")
    message(STATUS "[bench] ${_name}: ${_json}, ${_md}")
    # Beside the training steps: the same model and optimizer in PyTorch, where Debian's
    # python3-torch is installed (scripts/torch_train_bench.py; it prints an error line without).
    if(_name STREQUAL "decoder_training")
        find_program(_torch_python NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
        get_filename_component(_bench_dir "${CMAKE_CURRENT_LIST_FILE}" DIRECTORY)
        set(_shapes mqar 70m)
        if(DEFINED ENV{ATTNKIT_BENCH_QUICK} AND NOT "$ENV{ATTNKIT_BENCH_QUICK}" STREQUAL "0")
            set(_shapes mqar)
        endif()
        set(_torch_lines "")
        foreach(_shape IN LISTS _shapes)
            foreach(_threads 1 2)
                execute_process(COMMAND "${_torch_python}" "${_bench_dir}/scripts/torch_train_bench.py"
                                        --shape ${_shape} --threads ${_threads}
                                OUTPUT_VARIABLE _line OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
                string(APPEND _torch_lines "${_line}\n")
            endforeach()
        endforeach()
        file(WRITE "${OUT_DIR}/torch_train.jsonl" "${_torch_lines}")
        file(APPEND "${_report}" "### PyTorch, the same training step\n\n```\n${_torch_lines}```\n\n")
    endif()
endforeach()
# The comparison suite's plots and summary (needs /usr/bin/python3 with matplotlib).
if(DEFINED PLOT AND EXISTS "${OUT_DIR}/variants.json")
    find_program(_python NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
    if(NOT _python)
        find_program(_python NAMES python3)
    endif()
    # Every program's JSON of this run: with the variants' own benchmarks (bench-all), the
    # summary also sets each suite row beside its twin there, and recheck_twins.py first
    # measures again, side by side, each pair that came out more than 10% apart.
    list(REMOVE_ITEM _all_jsons "${OUT_DIR}/variants.json")
    file(REMOVE "${OUT_DIR}/twin_recheck.json")
    if(_all_jsons AND _python)
        get_filename_component(_scripts "${PLOT}" DIRECTORY)
        set(_ran_benches "")
        foreach(_bench IN LISTS _benches)
            get_filename_component(_exe_name "${_bench}" NAME_WE)
            string(REGEX REPLACE "^attnkit_(.*)_bench$" "\\1" _name "${_exe_name}")
            if(EXISTS "${OUT_DIR}/${_name}.json")
                list(APPEND _ran_benches "${_bench}")
            endif()
        endforeach()
        execute_process(COMMAND "${_python}" "${_scripts}/recheck_twins.py" "${OUT_DIR}" ${_ran_benches}
                        RESULT_VARIABLE _rc)
        if(_rc EQUAL 0 AND EXISTS "${OUT_DIR}/twin_recheck.json")
            list(APPEND _all_jsons "${OUT_DIR}/twin_recheck.json")
        else()
            message(WARNING "recheck_twins.py failed (${_rc}): the twin table shows the run's ratios only")
        endif()
    endif()
    execute_process(COMMAND "${_python}" "${PLOT}" "${OUT_DIR}/plots" "${OUT_DIR}/variants.json" ${_all_jsons}
                    RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND EXISTS "${OUT_DIR}/plots/suite.md")
        file(READ "${OUT_DIR}/plots/suite.md" _text)
        file(APPEND "${_report}" "${_text}\nPlots: ${OUT_DIR}/plots/*.png\n\n")
    else()
        message(WARNING "plot_report.py failed (${_rc}): is python3-matplotlib installed (cmake/install-deps.sh)?")
    endif()
endif()
if(DEFINED DIAGNOSTICS AND (NOT DEFINED ONLY OR ONLY STREQUAL "" OR "diagnostics" MATCHES "${ONLY}"))
    message(STATUS "[bench] diagnostics: ${DIAGNOSTICS}")
    # The diagnostics are of trained text models (300 steps each; a fifth in quick mode).
    set(_diag_steps 300)
    if(DEFINED ENV{ATTNKIT_BENCH_QUICK} AND NOT "$ENV{ATTNKIT_BENCH_QUICK}" STREQUAL "0")
        set(_diag_steps 60)
    endif()
    execute_process(COMMAND "${DIAGNOSTICS}" --train-steps ${_diag_steps} --output "${OUT_DIR}/diagnostics.md"
                    OUTPUT_QUIET RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "diagnostics report failed (${_rc})")
    endif()
    file(READ "${OUT_DIR}/diagnostics.md" _text)
    file(APPEND "${_report}" "${_text}\n")
endif()
message(STATUS "Report: ${_report}")
