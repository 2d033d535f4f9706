#!/usr/bin/env bash
# bench/llamacpp_src.sh: a llama.cpp source tree small enough to carry to a
# GPU machine (which reaches no network), for bench/run_gpu.sh --llama-src.
# It is never committed and never built into vela: the benchmark builds it
# beside vela, on the device, and runs llama-bench on the same files.
#
# usage: bench/llamacpp_src.sh DEST [--pypi VERSION | --git GITDIR]
#   --pypi VERSION  the llama.cpp that the llama-cpp-python VERSION sdist
#                   vendors, from the Python package index (default 0.3.36:
#                   llama.cpp 0c1e570 of 2026-10-01)
#   --git GITDIR    HEAD of a bare llama.cpp repository (the search library's
#                   fetch: github:ggerganov/llama.cpp is the Feb 2025 one)
# DEST gets the sources CMake needs for llama-bench and llama-batched-bench
# with the CPU and CUDA backends (no models, docs, web UI or other backends:
# about 30 MB) and VELA_LLAMACPP_COMMIT, the commit it came from. Name DEST
# under /build*/ (git-ignored) and in the device call's carry.
set -euo pipefail
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
DEST=$1; shift
PYPI=0.3.36 GIT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pypi) PYPI=$2; GIT=""; shift 2 ;;
    --git) GIT=$2; shift 2 ;;
    *) echo "llamacpp_src.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ ! -e "$DEST" ] || [ -z "$(ls -A "$DEST")" ] \
  || { echo "llamacpp_src.sh: $DEST exists and is not empty" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "$GIT" ]; then
  git -C "$GIT" rev-parse --verify HEAD >/dev/null \
    || { echo "llamacpp_src.sh: $GIT is not a git repository" >&2; exit 1; }
  mkdir -p "$tmp/src"
  # Only tracked paths that exist in that version (older trees have no tools/ or vendor/).
  paths=$(git -C "$GIT" ls-tree --name-only HEAD | grep -E \
    '^(CMakeLists.txt|cmake|common|ggml|include|src|examples|pocs|tools|vendor|licenses|LICENSE)$')
  # shellcheck disable=SC2086
  git -C "$GIT" archive HEAD -- $paths | tar -x -C "$tmp/src"
  commit=$(git -C "$GIT" rev-parse HEAD)
  src=$tmp/src
else
  echo "llamacpp_src.sh: llama-cpp-python==$PYPI sdist from the package index" >&2
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$PYPI" -d "$tmp" >&2
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  top=$(echo "$tmp"/llama_cpp_python-*/)
  src=$top/vendor/llama.cpp
  [ -f "$src/CMakeLists.txt" ] || { echo "llamacpp_src.sh: no vendor/llama.cpp in the sdist" >&2; exit 1; }
  commit=$(cat "$top/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || echo "unknown")
fi

mkdir -p "$DEST"
# What llama-bench and llama-batched-bench do not need: model vocabularies,
# docs, the web UI, and the backends other than CPU and CUDA (each backend's
# folder is added only when enabled).
tar -C "$src" -c \
  --exclude=./models --exclude=./docs --exclude=./media --exclude=./tests --exclude=./benches \
  --exclude=./.github --exclude=./.devops --exclude=./gguf-py --exclude=./scripts \
  --exclude=./tools/ui --exclude=./tools/server/webui --exclude=./tools/server/public \
  --exclude=./.git . | tar -x -C "$DEST"
find "$DEST/ggml/src" -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' \
  ! -name ggml-cpu ! -name ggml-cuda -exec rm -rf {} +
echo "$commit" >"$DEST/VELA_LLAMACPP_COMMIT"
echo "llamacpp_src.sh: $DEST: llama.cpp $commit, $(du -sh "$DEST" | cut -f1)" >&2
