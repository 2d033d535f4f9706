#!/usr/bin/env bash
# Builds llama.cpp's llama-server beside vela (never into it), for
# bench/serve_compare.sh: the llama.cpp that llama-cpp-python 0.3.36 vendors
# (its source distribution on PyPI), CPU backend, no web UI.
#   bench/build_llama_server.sh [DIR]     default DIR: ../llama.cpp next to the repo
# LLAMA_CPP_SRC=/path/to/llama.cpp uses a checkout you have instead. Prints
# the llama-server path.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$(dirname "$repo")/llama.cpp}
src=${LLAMA_CPP_SRC:-$dir/src}
if [ ! -f "$src/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "build_llama_server: fetching the llama-cpp-python 0.3.36 sdist (vendors llama.cpp)" >&2
  python3 -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$tmp" >&2
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  mkdir -p "$dir"
  rm -rf "$src"
  mv "$tmp/llama_cpp_python-0.3.36/vendor/llama.cpp" "$src"
fi
jobs=${JOBS:-$(nproc)}
cmake -S "$src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON >&2
cmake --build "$dir/build" -j "$jobs" --target llama-server >&2
echo "$dir/build/bin/llama-server"
