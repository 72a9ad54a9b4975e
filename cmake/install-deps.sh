#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages that attnkit's build, tests and benchmarks need.
#   cmake/install-deps.sh        exit 0 when everything is there (installing it as root),
#                                exit 1 with the exact command to run when not root
set -euo pipefail

# clang: the asan preset (CI's sanitizer run) builds with Clang, whose instrumented builds compile
# faster than GCC's and run as fast.
# libopenmpi-dev, openmpi-bin: the optional attnkit::distributed (ring attention over MPI) and its tests.
# nlohmann-json3-dev: the JSON header of safetensors checkpoints (model/checkpoint.hpp).
# fortunes: a small English text corpus (/usr/share/games/fortunes) for the character-level task of
# the training comparison.
# ninja-build: the presets' generator (it schedules the whole build graph at once, where make
# builds target by target).
packages=(cmake g++ clang make ninja-build libeigen3-dev libxsimd-dev libgtest-dev libbenchmark-dev pkg-config
          python3-matplotlib libopenmpi-dev openmpi-bin nlohmann-json3-dev fortunes)

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "install-deps: dpkg-query not found (not a Debian-based system); please install" \
         "CMake >= 3.25, a C++17 compiler, Eigen >= 3.4, xsimd >= 8.1, GoogleTest," \
         "Google Benchmark, pkg-config and (for the plots) matplotlib yourself." >&2
    exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    if [[ "$status" != "installed" ]]; then
        missing+=("$pkg")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-deps: all dependencies are installed (${packages[*]})"
    exit 0
fi

echo "install-deps: missing packages: ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y --no-install-recommends "${missing[@]}"
    echo "install-deps: installed ${missing[*]}"
else
    echo "install-deps: run this, then try again:" >&2
    echo "sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
