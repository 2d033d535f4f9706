#!/usr/bin/env bash
# bench/llamacpp_pkg.sh: llama.cpp for a GPU session, packed to be carried
# (tests/gpu/session.sh --llama-pkg DEST). Building llama.cpp on the device
# took ~380 s of a 15-minute session (the first H200 run), so it is built
# here instead, where nvcc compiles for sm_90 without a GPU (about an hour on
# 2 cores), and its sources come along compressed in case the binaries do
# not run there.
#
# usage: bench/llamacpp_pkg.sh SRC DEST [--build DIR] [--src-only]
#   SRC         llama.cpp sources (bench/llamacpp_src.sh makes them)
#   DEST        gets llama-src.tar.xz (SRC, ~5 MB), llama-bin.tar.xz (bin/ of
#               the build with llama-bench, llama-batched-bench and their
#               shared libraries, stripped: ~40 MB) and VELA_LLAMACPP_COMMIT
#   --build DIR the build directory (default: DEST.build); an existing one is
#               built on, not again
#   --src-only  only llama-src.tar.xz and the commit (no build)
# Name DEST under /build*/ (git-ignored) and carry DEST alone: the device
# tool carries 64 MiB with the working tree.
set -euo pipefail
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; }
[ $# -ge 1 ] && case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || { usage >&2; exit 2; }
SRC=$(cd "$1" && pwd) || exit 2
DEST=$2
shift 2
BUILD="" SRC_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --src-only) SRC_ONLY=1; shift ;;
    *) echo "llamacpp_pkg.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -f "$SRC/CMakeLists.txt" ] && [ -d "$SRC/ggml" ] \
  || { echo "llamacpp_pkg.sh: $SRC is not a llama.cpp source tree (no CMakeLists.txt, ggml/)" >&2; exit 1; }
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
BUILD=${BUILD:-$DEST.build}

if [ -s "$SRC/VELA_LLAMACPP_COMMIT" ]; then
  cp "$SRC/VELA_LLAMACPP_COMMIT" "$DEST/VELA_LLAMACPP_COMMIT"
else
  echo "unknown" >"$DEST/VELA_LLAMACPP_COMMIT"
fi
tar -C "$SRC" -cJf "$DEST/llama-src.tar.xz.part" . && mv "$DEST/llama-src.tar.xz.part" "$DEST/llama-src.tar.xz"
echo "llamacpp_pkg: $DEST/llama-src.tar.xz ($(du -h "$DEST/llama-src.tar.xz" | cut -f1))"
[ "$SRC_ONLY" = 1 ] && exit 0

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
# bench/run_gpu.sh's llama-build stage, as on the device, except GGML_NATIVE
# (this machine's CPU is not the device's) and the executables' link:
# without a GPU driver here there is no libcuda.so.1 for libggml-cuda's
# references (the device's driver provides it when they run).
mkdir -p "$BUILD"
VELA_BENCH_WORK="$DEST.work" LLAMA_NICE=10 \
  LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
  bash "$(dirname "$0")/run_gpu.sh" --llama-src "$SRC" --llama-build "$BUILD" llama-build
BUILD=$(cd "$BUILD" && pwd)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/bin"
cp -a "$BUILD/bin/llama-bench" "$BUILD/bin/llama-batched-bench" "$BUILD"/bin/lib*.so* "$stage/bin/"
find "$stage/bin" -type f -exec strip --strip-unneeded {} +
tar -C "$stage" -cJf "$DEST/llama-bin.tar.xz.part" bin && mv "$DEST/llama-bin.tar.xz.part" "$DEST/llama-bin.tar.xz"
echo "llamacpp_pkg: $DEST/llama-bin.tar.xz ($(du -h "$DEST/llama-bin.tar.xz" | cut -f1)), llama.cpp $(cat "$DEST/VELA_LLAMACPP_COMMIT")"
