#!/bin/sh
# Unpacks ggml's sources for the ggml comparison (bench/ggml/ggml_decode_compare.cpp) into DIR
# (default build/_deps/ggml) and prints the directory to pass as -DATTNKIT_GGML_DIR.
#
# ggml comes from the npm registry: the package llama.rn ships llama.cpp's ggml (core and CPU
# backend) as plain sources with its symbols prefixed lm_ggml_. The version is pinned so that a
# recorded comparison can be rerun on the same ggml.
#
#   sh bench/scripts/fetch_ggml.sh
#   cmake --preset bench-all -DATTNKIT_GGML_DIR=$PWD/build/_deps/ggml/cpp
#   cmake --build build/bench-all --target attnkit_ggml_decode_compare
set -eu
version=0.12.9
dir=${1:-build/_deps/ggml}
if [ -f "$dir/cpp/ggml.h" ] && [ -f "$dir/.version" ] && [ "$(cat "$dir/.version")" = "$version" ]; then
    echo "$dir/cpp"
    exit 0
fi
command -v npm > /dev/null || { echo "fetch_ggml.sh: npm not found (Debian: apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "llama.rn@$version" > /dev/null)
mkdir -p "$dir"
rm -rf "$dir/cpp"
tar -xzf "$tmp"/llama.rn-"$version".tgz -C "$tmp"
mv "$tmp/package/cpp" "$dir/cpp"
echo "$version" > "$dir/.version"
echo "$dir/cpp"
