// attnkit_cpu_probe: runs a test program built for a fixed -march only where this CPU can run it.
//
//   attnkit_cpu_probe avx2,fma ./softmax_attention_test_avx2 --gtest_brief=1
//
// Exits with kSkipCode (ctest's SKIP_RETURN_CODE for the multi-arch variants) when a feature is
// missing, and otherwise replaces itself with the program. The check has to happen in a separate
// program built for the baseline ISA: a test built with -march=skylake-avx512 may execute AVX-512
// instructions in its static initialisers, before its own main() could look at the CPU. Deciding
// at run time, not from the configuring machine's /proc/cpuinfo, keeps a build tree portable.
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <string>

#if defined(_WIN32)
#include <process.h>
#else
#include <unistd.h>
#endif

namespace {

constexpr int kSkipCode = 77;

bool cpu_has(const std::string& feature) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    // __builtin_cpu_supports needs string literals, and also checks that the OS saves the
    // AVX / AVX-512 register state.
    if (feature == "sse2") return __builtin_cpu_supports("sse2");
    if (feature == "avx2") return __builtin_cpu_supports("avx2");
    if (feature == "fma") return __builtin_cpu_supports("fma");
    if (feature == "avx512f") return __builtin_cpu_supports("avx512f");
    if (feature == "avx512bw") return __builtin_cpu_supports("avx512bw");
    if (feature == "avx512dq") return __builtin_cpu_supports("avx512dq");
    if (feature == "avx512vl") return __builtin_cpu_supports("avx512vl");
#endif
    std::fprintf(stderr, "attnkit_cpu_probe: cannot check CPU feature '%s'\n", feature.c_str());
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s <feature,...> <program> [args...]\n", argv[0]);
        return 2;
    }
    const std::string features = argv[1];
    std::size_t begin = 0;
    while (begin <= features.size()) {
        std::size_t end = features.find(',', begin);
        if (end == std::string::npos) end = features.size();
        const std::string f = features.substr(begin, end - begin);
        if (!f.empty() && !cpu_has(f)) {
            std::printf("attnkit_cpu_probe: this CPU lacks %s: %s skipped\n", f.c_str(), argv[2]);
            return kSkipCode;
        }
        begin = end + 1;
    }
    std::fflush(stdout);
#if defined(_WIN32)
    const auto rc = _spawnv(_P_WAIT, argv[2], argv + 2);
    if (rc != -1) return static_cast<int>(rc);
#else
    execv(argv[2], argv + 2);
#endif
    std::fprintf(stderr, "attnkit_cpu_probe: cannot run %s: %s\n", argv[2], std::strerror(errno));
    return 1;
}
