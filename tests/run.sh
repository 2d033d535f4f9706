#!/usr/bin/env bash
# The whole test suite: installs what is missing, runs the quickstart as a
# newcomer would, builds vela and its tests (with CUDA when the toolkit is
# present), runs every Criterion test through ctest, then
# rebuilds the GGUF reader tests under AddressSanitizer + UBSan and runs them.
# GPU tests skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
bash tools/setup.sh --tests # Chromium too, for the chat page (serve_webui)
jobs=$(nproc)

# The newcomer's path, README's first command: on a fresh tree the
# quickstart builds the vela command alone (no test), answers one question
# and names what to try next.
fresh=true
[ -e build ] && fresh=false
if ! out=$(bash tools/quickstart.sh 2>&1); then
  echo "$out"
  echo "tests/run.sh: tools/quickstart.sh failed" >&2
  exit 1
fi
if ! grep -q "quickstart: next: build/vela chat" <<<"$out"; then
  echo "$out"
  echo "tests/run.sh: tools/quickstart.sh printed no next steps" >&2
  exit 1
fi
if $fresh && [ -e build/tests/test_gguf ]; then
  echo "tests/run.sh: tools/quickstart.sh built the tests too (it should build vela alone)" >&2
  exit 1
fi
echo "tests/run.sh: quickstart ok: $(grep -c . <<<"$out") lines, the vela command alone"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# Sanitizers: the file-parsing code meets untrusted input, so its tests run
# again under ASan + UBSan (CPU only, no CUDA, to keep the build small).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DVELA_CUDA=OFF -DVELA_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L sanitize
