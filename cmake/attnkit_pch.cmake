# Whether attnkit's own tests and examples may use a precompiled header with the given compile
# flags (e.g. -march=native or -march=skylake-avx512; none: the compiler's default target).
#
# GCC 12 reports false -Wmaybe-uninitialized inside its own AVX-512 intrinsic headers (GCC bug
# 105593). attnkit silences them with diagnostic pragmas around its xsimd and Eigen includes
# (include/attnkit/simd/xsimd_compat.hpp, include/attnkit/eigen.hpp), and GCC does not keep
# those pragmas' effect for code that comes from a precompiled header: the -Werror builds fail.
# So a flag set whose target has AVX-512 compiles its headers as written, without one.
function(attnkit_pch_allowed out)
    execute_process(COMMAND "${CMAKE_CXX_COMPILER}" ${ARGN} -dM -E -x c++ -
                    INPUT_FILE /dev/null OUTPUT_VARIABLE _defs ERROR_QUIET RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0 OR _defs MATCHES "#define __AVX512F__ ")
        set(${out} OFF PARENT_SCOPE)
    else()
        set(${out} ON PARENT_SCOPE)
    endif()
endfunction()
