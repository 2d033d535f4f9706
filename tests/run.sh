#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds vela (with CUDA when
# the toolkit is present), runs every Criterion test through ctest, then
# rebuilds the GGUF reader tests under AddressSanitizer + UBSan and runs them.
# GPU tests skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
bash tools/setup.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# Sanitizers: the file-parsing code meets untrusted input, so its tests run
# again under ASan + UBSan (CPU only, no CUDA, to keep the build small).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DVELA_CUDA=OFF -DVELA_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L sanitize
