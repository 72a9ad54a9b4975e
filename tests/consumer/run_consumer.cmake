# Driver of the consumer smoke tests, run by ctest as `cmake -D... -P run_consumer.cmake`.
#
# MODE=install          install attnkit's build tree into PREFIX (fresh); check the headers,
#                       package files and LICENSE are there
# MODE=find_package     configure, build and run find_package/ against PREFIX; then check the
#                       version file through version_request/ (before 1.0 a request for another
#                       minor version must fail)
# MODE=pkg_config       compile main.cpp with `pkg-config --cflags --libs attnkit` against
#                       PREFIX with -Wall -Wextra -Werror -march=native and run it (and, given
#                       AVX512_MARCH, compile it once more for that -march)
# MODE=examples         configure examples/ on its own (the template a user copies) against
#                       PREFIX, build and run one example
# MODE=add_subdirectory configure, build and run add_subdirectory/ on ATTNKIT_SOURCE_DIR
# MODE=fetchcontent     the same through FetchContent
#
# Inputs: ATTNKIT_SOURCE_DIR ATTNKIT_BINARY_DIR ATTNKIT_VERSION PREFIX WORK_DIR CONSUMER_DIR
#         CMAKE_GENERATOR CMAKE_MAKE_PROGRAM CMAKE_CXX_COMPILER CONFIG [PKG_CONFIG]
#         [AVX512_MARCH]
cmake_minimum_required(VERSION 3.25)

foreach(_var MODE ATTNKIT_SOURCE_DIR ATTNKIT_BINARY_DIR PREFIX WORK_DIR CONSUMER_DIR)
    if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
        message(FATAL_ERROR "run_consumer.cmake: ${_var} is not set")
    endif()
endforeach()
if(NOT CONFIG)
    set(CONFIG Release)
endif()

function(run)
    string(REPLACE ";" " " _pretty "${ARGV}")
    message(STATUS "$ ${_pretty}")
    execute_process(COMMAND ${ARGV} RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "command failed (${_rc}): ${_pretty}")
    endif()
endfunction()

# The generator (and make program) of this build, as arguments for a nested configure.
function(generator_args out)
    set(_args)
    if(CMAKE_GENERATOR)
        list(APPEND _args -G "${CMAKE_GENERATOR}")
    endif()
    if(CMAKE_MAKE_PROGRAM)
        list(APPEND _args "-DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}")
    endif()
    set(${out} "${_args}" PARENT_SCOPE)
endfunction()

# The CMake consumers check packaging (targets, include paths, the version file, a program that
# links and runs), not code generation, which the unit tests cover: they compile at -O0, a
# fraction of an optimised build of the same program. (The pkg-config consumer keeps -O1: its
# -Werror build must see the warnings that only optimisation brings out.)
string(TOUPPER "${CONFIG}" _config_upper)
set(_unoptimised "-DCMAKE_CXX_FLAGS_${_config_upper}=-O0")

# Configure, build and run one consumer CMake project in a fresh build directory.
function(cmake_consumer name source_dir)
    set(_build "${WORK_DIR}/${name}")
    file(REMOVE_RECURSE "${_build}")
    generator_args(_gen)
    run("${CMAKE_COMMAND}" -S "${source_dir}" -B "${_build}" ${_gen}
        "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
        "-DCMAKE_BUILD_TYPE=${CONFIG}" "${_unoptimised}"
        ${ARGN})
    run("${CMAKE_COMMAND}" --build "${_build}" --config "${CONFIG}")
    find_program(_exe NAMES consumer PATHS "${_build}" "${_build}/${CONFIG}"
                 NO_DEFAULT_PATH NO_CACHE REQUIRED)
    run("${_exe}")
endfunction()

# Configure only: find_package(attnkit <request>) must be accepted or rejected as `expect` says.
function(version_request request expect)
    set(_build "${WORK_DIR}/version_request_${request}")
    file(REMOVE_RECURSE "${_build}")
    generator_args(_gen)
    run("${CMAKE_COMMAND}" -S "${CONSUMER_DIR}/version_request" -B "${_build}" ${_gen}
        "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${PREFIX}"
        "-DREQUEST=${request}" "-DEXPECT=${expect}")
endfunction()

if(MODE STREQUAL "install")
    file(REMOVE_RECURSE "${PREFIX}")
    run("${CMAKE_COMMAND}" --install "${ATTNKIT_BINARY_DIR}" --prefix "${PREFIX}"
        --config "${CONFIG}")
    file(GLOB_RECURSE _config "${PREFIX}/*/attnkitConfig.cmake")
    file(GLOB_RECURSE _pc "${PREFIX}/*/attnkit.pc")
    if(NOT _config OR NOT _pc OR NOT EXISTS "${PREFIX}/include/attnkit/attnkit.hpp")
        message(FATAL_ERROR "install into ${PREFIX} is missing attnkitConfig.cmake, attnkit.pc "
                            "or include/attnkit/attnkit.hpp")
    endif()
    # The license travels with the headers (share/doc/attnkit/LICENSE by default).
    file(GLOB_RECURSE _license "${PREFIX}/share/*/LICENSE")
    if(NOT _license)
        message(FATAL_ERROR "install into ${PREFIX} has no LICENSE under share/")
    endif()
    list(GET _license 0 _license)
    file(SHA256 "${_license}" _installed)
    file(SHA256 "${ATTNKIT_SOURCE_DIR}/LICENSE" _source)
    if(NOT _installed STREQUAL _source)
        message(FATAL_ERROR "${_license} differs from ${ATTNKIT_SOURCE_DIR}/LICENSE")
    endif()

elseif(MODE STREQUAL "find_package")
    cmake_consumer(find_package "${CONSUMER_DIR}/find_package"
        "-DCMAKE_PREFIX_PATH=${PREFIX}"
        "-DEXPECTED_PREFIX=${PREFIX}"
        "-DEXPECTED_VERSION=${ATTNKIT_VERSION}")
    # The version file: the same major.minor is accepted; before 1.0 another minor version is
    # not (a 0.y release may break the API), from 1.0 on an older minor version is.
    if(NOT ATTNKIT_VERSION MATCHES "^([0-9]+)\\.([0-9]+)")
        message(FATAL_ERROR "cannot parse ATTNKIT_VERSION '${ATTNKIT_VERSION}'")
    endif()
    set(_major "${CMAKE_MATCH_1}")
    set(_minor "${CMAKE_MATCH_2}")
    math(EXPR _next_minor "${_minor} + 1")
    math(EXPR _next_major "${_major} + 1")
    version_request("${_major}.${_minor}" accept)
    version_request("${_next_major}.0" reject)
    if(_major EQUAL 0)
        version_request("0.${_next_minor}" reject)
        if(_minor GREATER 0)
            math(EXPR _prev_minor "${_minor} - 1")
            version_request("0.${_prev_minor}" reject)
        endif()
    elseif(_minor GREATER 0)
        math(EXPR _prev_minor "${_minor} - 1")
        version_request("${_major}.${_prev_minor}" accept)
    endif()

elseif(MODE STREQUAL "examples")
    # examples/CMakeLists.txt copied out of the tree must work with an installed attnkit alone.
    set(_build "${WORK_DIR}/examples")
    file(REMOVE_RECURSE "${_build}")
    generator_args(_gen)
    run("${CMAKE_COMMAND}" -S "${ATTNKIT_SOURCE_DIR}/examples" -B "${_build}" ${_gen}
        "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${CONFIG}" "${_unoptimised}"
        "-DCMAKE_PREFIX_PATH=${PREFIX}")
    # One example is enough to show the template links: they all use the same two lines.
    run("${CMAKE_COMMAND}" --build "${_build}" --config "${CONFIG}" --target example_quickstart)
    find_program(_exe NAMES quickstart PATHS "${_build}" "${_build}/${CONFIG}"
                 NO_DEFAULT_PATH NO_CACHE REQUIRED)
    run("${_exe}")

elseif(MODE STREQUAL "add_subdirectory")
    cmake_consumer(add_subdirectory "${CONSUMER_DIR}/add_subdirectory"
        "-DATTNKIT_SOURCE_DIR=${ATTNKIT_SOURCE_DIR}")

elseif(MODE STREQUAL "fetchcontent")
    cmake_consumer(fetchcontent "${CONSUMER_DIR}/add_subdirectory"
        "-DATTNKIT_SOURCE_DIR=${ATTNKIT_SOURCE_DIR}" -DUSE_FETCHCONTENT=ON)

elseif(MODE STREQUAL "pkg_config")
    if(NOT PKG_CONFIG)
        message(FATAL_ERROR "PKG_CONFIG is not set")
    endif()
    file(GLOB_RECURSE _pc "${PREFIX}/*/attnkit.pc")
    if(NOT _pc)
        message(FATAL_ERROR "no attnkit.pc under ${PREFIX}")
    endif()
    get_filename_component(_pcdir "${_pc}" DIRECTORY)
    if(DEFINED ENV{PKG_CONFIG_PATH} AND NOT "$ENV{PKG_CONFIG_PATH}" STREQUAL "")
        set(ENV{PKG_CONFIG_PATH} "${_pcdir}:$ENV{PKG_CONFIG_PATH}")
    else()
        set(ENV{PKG_CONFIG_PATH} "${_pcdir}")
    endif()
    foreach(_what modversion cflags libs)
        execute_process(COMMAND "${PKG_CONFIG}" --print-errors "--${_what}" attnkit
                        OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE
                        RESULT_VARIABLE _rc)
        if(NOT _rc EQUAL 0)
            message(FATAL_ERROR "pkg-config --${_what} attnkit failed (${_rc})")
        endif()
        message(STATUS "pkg-config --${_what} attnkit: ${_out}")
        set(_pc_${_what} "${_out}")
    endforeach()
    if(NOT _pc_modversion STREQUAL ATTNKIT_VERSION)
        message(FATAL_ERROR "attnkit.pc says ${_pc_modversion}, expected ${ATTNKIT_VERSION}")
    endif()
    separate_arguments(_cflags UNIX_COMMAND "${_pc_cflags}")
    # One -I must lead to the installed headers (the prefix in attnkit.pc is relative).
    file(REAL_PATH "${PREFIX}/include" _inc)
    set(_found_inc OFF)
    foreach(_flag IN LISTS _cflags)
        if(_flag MATCHES "^-I(.+)$")
            set(_dir "${CMAKE_MATCH_1}")
            if(EXISTS "${_dir}")
                file(REAL_PATH "${_dir}" _dir)
                if(_dir STREQUAL _inc)
                    set(_found_inc ON)
                endif()
            endif()
        endif()
    endforeach()
    if(NOT _found_inc)
        message(FATAL_ERROR "pkg-config --cflags attnkit has no -I for ${_inc}: ${_pc_cflags}")
    endif()
    separate_arguments(_libs UNIX_COMMAND "${_pc_libs}")
    set(_build "${WORK_DIR}/pkg_config")
    file(REMOVE_RECURSE "${_build}")
    file(MAKE_DIRECTORY "${_build}")
    # A user's strict build: warnings inside Eigen or xsimd (which attnkit.pc passes as -isystem)
    # must not fail it, also where -march=native turns on Eigen's AVX/AVX-512 packets.
    set(_strict -Wall -Wextra -Werror)
    run("${CMAKE_CXX_COMPILER}" -std=c++17 -O1 ${_strict} -march=native ${_cflags}
        "${CONSUMER_DIR}/main.cpp" -o "${_build}/consumer" ${_libs})
    run("${_build}/consumer")
    if(AVX512_MARCH)
        # Compile only: this machine need not run AVX-512 code.
        run("${CMAKE_CXX_COMPILER}" -std=c++17 -O1 ${_strict} "-march=${AVX512_MARCH}" ${_cflags}
            -c "${CONSUMER_DIR}/main.cpp" -o "${_build}/consumer_avx512.o")
    endif()

else()
    message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()
