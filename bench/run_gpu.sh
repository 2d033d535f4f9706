#!/usr/bin/env bash
# bench/run_gpu.sh: the one script a GPU session runs. It builds vela (CUDA),
# writes the synthetic models, runs `vela bench` on each, runs
# vela-bench-kernels, and, when a llama.cpp source or build dir is given,
# llama-bench / llama-batched-bench on the same files; then it writes
# SUMMARY.json and the raw results into the output dir.
#
# usage: bench/run_gpu.sh [--out DIR] [--llama-src DIR | --llama-build DIR]
#                         [--models SPEC] [--reps N] [--arch SM] [--quick] [STAGE...]
#   STAGE: build models vela kernels llama-build llama summary (default: all,
#   in that order; llama-build and llama need --llama-src or --llama-build).
#   Every stage can run on its own (each device command is limited to 10
#   minutes): later stages read what earlier ones left under the work dir.
#
# Work dir (not committed, ignored by git): $ROOT/build-gpu-bench
#   build/   vela's CUDA build        models/  the GGUF files
#   llama/   llama.cpp's build        raw/     every raw output and log
# Output dir (--out, default $WORK/out): at most 8 files, each small,
# so that it can come back from a device machine whole:
#   SUMMARY.json  vela.json  kernels.json  kernels.md  llamacpp.json  run.log
#   kernels-attn-se.json/.md  attention vs exact self-extend at 4k/16k/64k (#13)
#
# Environment: VELA_DEADLINE (epoch seconds): every bench command is cut at
# it (timeout) and skipped when under 15 s are left, so that a caller with a
# fixed device time (tests/gpu/session.sh) keeps time for the summary, and
# VELA_STEP_MAX (seconds, default 300) bounds each one, so that a hang costs
# that much and no more;
# VELA_F32ACT=0 skips the --matvec-act f32 decode runs; VELA_PDL_RUNS=0
# the decode runs with programmatic dependent launch (VELA_PDL=1);
# VELA_STREAM_RUNS=0 those with the streaming mat-vecs under PDL; MVQ_PIPE_PLANS
# (below) the pipelined mat-vec's runs; LLAMA_JOBS (default
# all cores) and LLAMA_NICE (default 0) for the llama.cpp build.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${VELA_BENCH_WORK:-$ROOT/build-gpu-bench}
OUT=""
ARCH=90
REPS=5
LLAMA_SRC=""
LLAMA_BUILD=""
QUICK=0
# name:mkmodel flags, separated by ';'
MODELS="llama2-7b-q4_0:--preset llama2-7b --type q4_0;\
llama2-7b-q8_0:--preset llama2-7b --type q8_0;\
llama2-7b-f16:--preset llama2-7b --type f16;\
llama3-8b-q4_k_m:--preset llama3-8b --type q4_k_m;\
qwen2-0.5b-f16:--preset qwen2-0.5b"
PARALLEL_MODEL=${PARALLEL_MODEL:-llama3-8b-q4_k_m}
PARALLEL=${PARALLEL:-1,8,32,64,128,256}
N_PROMPT=${N_PROMPT:-512}
N_GEN=${N_GEN:-128}
# Decode on top of DEPTH cached tokens (vela bench / llama-bench -d), on
# DEPTH_MODEL: where decode attention shows, as in a chat with some history
# (tg128 from an empty cache hides it). DEPTH=0 skips it.
DEPTH=${DEPTH:-4096}
DEPTH_MODEL=${DEPTH_MODEL:-} # default: PARALLEL_MODEL (below, after --quick)
# The same decode at depth with quantized KV caches (-ctk T -ctv T on both
# engines; vela's attention rotation on, as llama.cpp's): rows
# "tg128 @ d4096@kv-T". Empty skips them.
KV_TYPES=${KV_TYPES-q8_0 q4_0}
# BACKEND=cpu and VELA_BENCH_BUILD=<a CPU build dir> dry-run the models, vela
# and summary stages on a machine without a GPU (with small --models).
BACKEND=${BACKEND:-cuda}
# Flash attention on (vela's attention is a flash kernel). llama-bench takes
# -fa 1 in early-2025 and in current releases (where 1 means on).
LLAMA_BENCH_ARGS=${LLAMA_BENCH_ARGS:-"-ngl 99 -fa 1"}
# batched-bench's bare -fa (early 2025) became -fa on|off|auto: when unset,
# the llama stage picks the spelling from its --help.
LLAMA_BATCHED_ARGS=${LLAMA_BATCHED_ARGS:-}
VELA_DEADLINE=${VELA_DEADLINE:-}
VELA_STEP_MAX=${VELA_STEP_MAX:-300}
VELA_F32ACT=${VELA_F32ACT:-1}
# Decode (tg) with VELA_PDL=1 beside the default on every model, rows
# "tg128@pdl": programmatic dependent launch inside the decode graph
# (cuda/launch.cuh), a variant under test until these rows decide it.
VELA_PDL_RUNS=${VELA_PDL_RUNS:-1}
# Decode with the streaming mat-vecs (VELA_MATVEC_Q8=stream:4,
# VELA_MATVEC_F16=stream:4) under PDL on every model, rows
# "tg128@stream4+pdl": the decode the performance model predicts fastest
# ("best + PDL" in bench/results/kernels-predicted.md), end to end, beside
# the default and @pdl; variants under test until these rows decide them.
VELA_STREAM_RUNS=${VELA_STREAM_RUNS:-1}
# The dp4a mat-vec's other kernels (variants under test, vela-bench-kernels
# --matvec-q8 pipe:B or stream:B, B blocks per SM) beside the default
# one-pass kernel, before a GPU decides: MVQ_PIPE_PLANS are the plans the
# kernels stage times (rows matvec*@pipe:B, @stream:B). Empty skips them.
# The product (vela bench) runs the default kernel only.
MVQ_PIPE_PLANS=${MVQ_PIPE_PLANS-pipe:4 pipe:8 stream:2 stream:4 stream:8}
# The F16/BF16 mat-vec's streaming kernel (a variant under test,
# vela-bench-kernels --matvec-f16 stream:B) beside the default one warp per
# row: rows matvec*@stream:B of the f16 and bf16 types. Empty skips them.
MVF_PLANS=${MVF_PLANS-stream:2 stream:4 stream:8}
LLAMA_JOBS=${LLAMA_JOBS:-}
LLAMA_NICE=${LLAMA_NICE:-0}
# Extra CMake arguments for the llama.cpp build, after ours (a later -D
# wins): bench/llamacpp_pkg.sh builds it for the device on a machine without one.
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS:-}
# llama.cpp's commit: $LLAMACPP_COMMIT, else the file VELA_LLAMACPP_COMMIT in
# the source dir, else git in the source dir, else llama-bench's build_commit.
LLAMACPP_COMMIT=${LLAMACPP_COMMIT:-}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

STAGES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --llama-src) LLAMA_SRC=$(cd "$2" && pwd); shift 2 ;;
    --llama-build) LLAMA_BUILD=$(cd "$2" && pwd); shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) usage; exit 0 ;;
    build|models|vela|kernels|llama-build|llama|summary) STAGES+=("$1"); shift ;;
    *) echo "run_gpu.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ ${#STAGES[@]} -gt 0 ] || STAGES=(build models vela kernels llama-build llama summary)
if [ "$QUICK" = 1 ]; then
  # One model, fewer repetitions: the whole run in a few minutes.
  MODELS="llama2-7b-q4_0:--preset llama2-7b --type q4_0"
  PARALLEL_MODEL=llama2-7b-q4_0
  PARALLEL=1,8,64
  REPS=3
fi
DEPTH_MODEL=${DEPTH_MODEL:-$PARALLEL_MODEL}

BUILD=${VELA_BENCH_BUILD:-$WORK/build}
MODELS_DIR=$WORK/models
RAW=$WORK/raw
[ -n "$OUT" ] || OUT=$WORK/out
mkdir -p "$WORK" "$MODELS_DIR" "$RAW" "$OUT"
if [ -z "$LLAMA_BUILD" ] && [ -n "$LLAMA_SRC" ]; then LLAMA_BUILD=$WORK/llama; fi
NPROC=$(nproc 2>/dev/null || echo 4)

log() { echo "[run_gpu $(date -u +%H:%M:%S)] $*" | tee -a "$RAW/run.log" >&2; }

# timed CMD...: CMD under `timeout`: VELA_STEP_MAX seconds, or less to end
# by VELA_DEADLINE; returns 124 without running it when under 15 s are left.
timed() {
  local left=$VELA_STEP_MAX
  if [ -n "$VELA_DEADLINE" ]; then
    left=$((VELA_DEADLINE - $(date +%s)))
    if [ $left -lt 15 ]; then log "deadline: skipped: ${*:1:3} ..."; return 124; fi
    [ $left -gt "$VELA_STEP_MAX" ] && left=$VELA_STEP_MAX
  fi
  timeout "$left" "$@"
  local rc=$?
  [ $rc -eq 124 ] && log "timeout after ${left}s: ${*:1:3} ..."
  return $rc
}

model_names() {
  local IFS=';'
  for spec in $MODELS; do
    spec=${spec#"${spec%%[! ]*}"} # leading blanks
    [ -n "$spec" ] && echo "${spec%%:*}"
  done
}
model_flags() {
  local IFS=';'
  for spec in $MODELS; do
    spec=${spec#"${spec%%[! ]*}"} # leading blanks
    [ "${spec%%:*}" = "$1" ] && echo "${spec#*:}"
  done
}

# What the build and summary stages need on the GPU machine, which cannot
# reach the network: say what is missing instead of failing inside cmake.
preflight() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v cc >/dev/null || missing+=("a C compiler")
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || missing+=("nvcc (CUDA toolkit)")
  [ -e /usr/include/cjson/cJSON.h ] || missing+=("cJSON (libcjson-dev)")
  command -v python3 >/dev/null || log "build: python3 missing: the summary stage will fail"
  if [ ${#missing[@]} -gt 0 ]; then
    log "build: missing: ${missing[*]} (bench/README.md: 'Dependencies on the GPU machine')"
    exit 1
  fi
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
}

stage_build() {
  preflight
  log "build: vela (CUDA, sm_$ARCH) in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DVELA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DVELA_TESTS=OFF >>"$RAW/build.log" 2>&1
  cmake --build "$BUILD" -j "$NPROC" --target vela vela-bench-kernels >>"$RAW/build.log" 2>&1 \
    || { tail -40 "$RAW/build.log" >&2; exit 1; }
  "$BUILD/vela" --version | tee -a "$RAW/run.log"
}

stage_models() {
  for name in $(model_names); do
    local f=$MODELS_DIR/$name.gguf
    if [ -s "$f" ]; then log "models: $name exists"; continue; fi
    log "models: writing $name ($(model_flags "$name"))"
    # shellcheck disable=SC2046
    "$BUILD/vela" mkmodel $(model_flags "$name") -q -o "$f.part" && mv "$f.part" "$f"
  done
  du -h "$MODELS_DIR"/*.gguf | tee -a "$RAW/run.log"
}

stage_vela() {
  for name in $(model_names); do
    log "vela: bench $name"
    timed "$BUILD/vela" bench -m "$MODELS_DIR/$name.gguf" --backend "$BACKEND" -p "$N_PROMPT" \
      -n "$N_GEN" -r "$REPS" --json >"$RAW/vela-$name.json" 2>>"$RAW/run.log" \
      || log "vela: bench failed on $name"
    # the decode mat-vec with f32 activations too (the default is q8, backend.act_q8)
    case $name in *f16*) ;; *)
      [ "$VELA_F32ACT" = 0 ] ||
      timed "$BUILD/vela" bench -m "$MODELS_DIR/$name.gguf" --backend "$BACKEND" -p 0 -n "$N_GEN" \
        -r "$REPS" --matvec-act f32 --json >"$RAW/vela-$name-f32act.json" 2>>"$RAW/run.log" \
        || log "vela: bench --matvec-act f32 failed on $name" ;;
    esac
    # the same decode with programmatic dependent launch (VELA_PDL=1)
    [ "$VELA_PDL_RUNS" = 0 ] ||
    VELA_PDL=1 timed "$BUILD/vela" bench -m "$MODELS_DIR/$name.gguf" --backend "$BACKEND" -p 0 \
      -n "$N_GEN" -r "$REPS" --json >"$RAW/vela-$name-pdl.json" 2>>"$RAW/run.log" \
      || log "vela: bench with VELA_PDL=1 failed on $name"
    # and with the streaming mat-vecs under PDL
    [ "$VELA_STREAM_RUNS" = 0 ] ||
    VELA_PDL=1 VELA_MATVEC_Q8=stream:4 VELA_MATVEC_F16=stream:4 timed "$BUILD/vela" bench \
      -m "$MODELS_DIR/$name.gguf" --backend "$BACKEND" -p 0 -n "$N_GEN" -r "$REPS" --json \
      >"$RAW/vela-$name-stream4pdl.json" 2>>"$RAW/run.log" \
      || log "vela: bench with VELA_MATVEC_Q8/F16=stream:4 VELA_PDL=1 failed on $name"
  done
  if [ "$DEPTH" != 0 ] && model_names | grep -qx "$DEPTH_MODEL"; then
    log "vela: bench $DEPTH_MODEL tg$N_GEN at depth $DEPTH"
    timed "$BUILD/vela" bench -m "$MODELS_DIR/$DEPTH_MODEL.gguf" --backend "$BACKEND" -p 0 \
      -n "$N_GEN" -d "$DEPTH" -r "$REPS" --json >"$RAW/vela-$DEPTH_MODEL-depth.json" \
      2>>"$RAW/run.log" || log "vela: bench -d $DEPTH failed on $DEPTH_MODEL"
    for kv in $KV_TYPES; do
      log "vela: bench $DEPTH_MODEL tg$N_GEN at depth $DEPTH, KV cache $kv"
      timed "$BUILD/vela" bench -m "$MODELS_DIR/$DEPTH_MODEL.gguf" --backend "$BACKEND" -p 0 \
        -n "$N_GEN" -d "$DEPTH" -ctk "$kv" -ctv "$kv" -r "$REPS" --json \
        >"$RAW/vela-$DEPTH_MODEL-depth-kv-$kv.json" 2>>"$RAW/run.log" \
        || log "vela: bench -d $DEPTH -ctk/-ctv $kv failed on $DEPTH_MODEL"
    done
  fi
  if model_names | grep -qx "$PARALLEL_MODEL"; then
    log "vela: bench $PARALLEL_MODEL --parallel $PARALLEL"
    timed "$BUILD/vela" bench -m "$MODELS_DIR/$PARALLEL_MODEL.gguf" --backend "$BACKEND" -p 0 \
      -n "$N_GEN" -r 3 --parallel "$PARALLEL" --json \
      >"$RAW/vela-$PARALLEL_MODEL-parallel.json" 2>>"$RAW/run.log" \
      || log "vela: bench --parallel failed on $PARALLEL_MODEL"
  fi
}

stage_kernels() {
  log "kernels: vela-bench-kernels"
  local extra=()
  [ "$QUICK" = 1 ] && extra=(--quick)
  timed "$BUILD/bench/vela-bench-kernels" "${extra[@]}" --json "$RAW/kernels.json" >"$RAW/kernels.md" \
    2>>"$RAW/run.log" || log "kernels: some cases failed (see kernels.json)"
  # Exact self-extend (#13) against ordinary attention at 4k, 16k and 64k keys:
  # the same bytes, the rotations and the far scores are the extra work.
  log "kernels: attention, ordinary vs exact self-extend, 4k/16k/64k"
  local reps=()
  [ "$QUICK" = 1 ] && reps=(-r 3)
  timed "$BUILD/bench/vela-bench-kernels" --filter attn_decode,attn_se_decode,attn_prefill,attn_se_prefill,attn_se_mixed \
    --models llama3-8b,llama2-7b --ctx 256,4096,16384,65536 "${reps[@]}" \
    --json "$RAW/kernels-attn-se.json" >"$RAW/kernels-attn-se.md" 2>>"$RAW/run.log" \
    || log "kernels: some attention cases failed (see kernels-attn-se.json)"
  # Decode attention's other kernel and split plans (--attn-kernel splitk:
  # the split-K attn_kernel; --attn-split BxC: blocks per SM aimed at, cells
  # per split at least; the default, attn_dec_kernel's 2x8, is the run
  # above): their rows join kernels-attn-se.json as "attn_decode@PLAN"
  # (splitk, splitk:4x64, 4x8, ...). 256 cells is tg128's regime.
  local plan
  for plan in ${ATTN_SPLIT_PLANS-splitk splitk:4x64 4x8 8x8 2x32}; do
    log "kernels: decode attention, plan $plan"
    local pargs=()
    case "$plan" in
      splitk) pargs=(--attn-kernel splitk) ;;
      splitk:*) pargs=(--attn-kernel splitk --attn-split "${plan#splitk:}") ;;
      *) pargs=(--attn-split "$plan") ;;
    esac
    timed "$BUILD/bench/vela-bench-kernels" "${pargs[@]}" \
      --filter attn_decode,attn_se_decode --models llama3-8b,llama2-7b --ctx 256,4096,16384,65536 \
      "${reps[@]}" --json "$RAW/kernels-attn-split-$plan.json" \
      >"$RAW/kernels-attn-split-$plan.md" 2>>"$RAW/run.log" \
      || log "kernels: split plan $plan: some cases failed"
  done
  merge_plans "$RAW/kernels-attn-se.json" attn_split "$RAW"/kernels-attn-split-*.json \
    || log "kernels: merging the split plans failed"
  # The decode mat-vecs (one token, and 8) through the other dp4a kernels
  # (--matvec-q8 pipe:B, stream:B; the default one-pass kernel's rows are in
  # the first run): rows "matvec@pipe:B" etc. join kernels.json.
  local mvq_models=llama3-8b,llama2-7b
  [ "$QUICK" = 1 ] && mvq_models=llama3-8b # the one the quick run above has
  for plan in $MVQ_PIPE_PLANS; do
    log "kernels: decode mat-vecs, --matvec-q8 $plan"
    timed "$BUILD/bench/vela-bench-kernels" --matvec-q8 "$plan" \
      --filter matvec,matvec_qkv,matvec_swiglu,matvec_add --models "$mvq_models" \
      --types q4_0,q4_K,q6_K,q8_0 --matvec-act q8 --matvec-tok 1,8 "${reps[@]}" \
      --json "$RAW/kernels-mvq-$plan.json" >"$RAW/kernels-mvq-$plan.md" 2>>"$RAW/run.log" \
      || log "kernels: --matvec-q8 $plan: some cases failed"
  done
  merge_plans "$RAW/kernels.json" matvec_q8 "$RAW"/kernels-mvq-*.json \
    || log "kernels: merging the mat-vec plans failed"
  # The same mat-vecs of F16/BF16 weights through the streaming kernel
  # (--matvec-f16 stream:B; the default kernel's f16 rows are in the first
  # run, bf16 in none before): rows "matvec@stream:B" of those types.
  for plan in $MVF_PLANS; do
    log "kernels: decode mat-vecs, --matvec-f16 $plan"
    timed "$BUILD/bench/vela-bench-kernels" --matvec-f16 "$plan" \
      --filter matvec,matvec_qkv,matvec_swiglu,matvec_add --models "$mvq_models" \
      --types f16,bf16 --matvec-tok 1,2,8 "${reps[@]}" \
      --json "$RAW/kernels-mvf-$plan.json" >"$RAW/kernels-mvf-$plan.md" 2>>"$RAW/run.log" \
      || log "kernels: --matvec-f16 $plan: some cases failed"
  done
  [ -n "$MVF_PLANS" ] && {
    timed "$BUILD/bench/vela-bench-kernels" --matvec-f16 pass \
      --filter matvec,matvec_qkv,matvec_swiglu,matvec_add --models "$mvq_models" \
      --types f16,bf16 --matvec-tok 1,2,8 "${reps[@]}" \
      --json "$RAW/kernels-mvf-pass.json" >"$RAW/kernels-mvf-pass.md" 2>>"$RAW/run.log" \
      || log "kernels: --matvec-f16 pass: some cases failed"
  }
  merge_plans "$RAW/kernels.json" matvec_f16 "$RAW"/kernels-mvf-*.json \
    || log "kernels: merging the F16 mat-vec plans failed"
}

# merge_plans MAIN KEY FILE...: the results of each FILE (a vela-bench-kernels
# run under another plan, its params[KEY] naming it) join MAIN's as
# "<kernel>@<plan>"; rows of an earlier merge of that plan are replaced.
merge_plans() {
  python3 - "$@" <<'PY'
import json, sys
path, key, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    main = json.load(open(path))
except (OSError, ValueError):
    sys.exit(0)  # the main run left nothing
if "results" not in main:  # no CUDA device: nothing was timed
    sys.exit(0)
for p in rest:
    try:
        d = json.load(open(p))
    except (OSError, ValueError):
        continue
    plan = d.get("params", {}).get(key)
    if not plan:
        continue
    # rows of the types this file has (the dp4a and F16 variants share plan names)
    types = {r.get("type") for r in d.get("results", [])}
    main["results"] = [r for r in main["results"]
                       if not (r["kernel"].endswith("@" + plan) and r.get("type") in types)]
    for r in d.get("results", []):
        main["results"].append(dict(r, kernel=f"{r['kernel']}@{plan}"))
json.dump(main, open(path, "w"), indent=1)
PY
}

stage_llama_build() {
  if [ -z "$LLAMA_SRC" ]; then log "llama-build: no --llama-src: skipped"; return; fi
  if [ -x "$LLAMA_BUILD/bin/llama-bench" ] && [ -x "$LLAMA_BUILD/bin/llama-batched-bench" ]; then
    log "llama-build: $LLAMA_BUILD is built"
    return
  fi
  log "llama-build: llama.cpp (CUDA, sm_$ARCH) from $LLAMA_SRC into $LLAMA_BUILD"
  # LLAMA_OPENSSL: newer trees only (older ones ignore it, with a warning)
  cmake -S "$LLAMA_SRC" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON $LLAMA_CMAKE_ARGS \
    >>"$RAW/llama-build.log" 2>&1
  nice -n "$LLAMA_NICE" cmake --build "$LLAMA_BUILD" -j "${LLAMA_JOBS:-$NPROC}" \
    --target llama-bench llama-batched-bench \
    >>"$RAW/llama-build.log" 2>&1 || { tail -40 "$RAW/llama-build.log" >&2; exit 1; }
  log "llama-build: done"
}

stage_llama() {
  if [ -z "$LLAMA_BUILD" ]; then log "llama: no --llama-src / --llama-build: skipped"; return; fi
  local lb=$LLAMA_BUILD/bin/llama-bench bb=$LLAMA_BUILD/bin/llama-batched-bench
  if [ ! -x "$lb" ]; then log "llama: $lb missing (run the llama-build stage)"; return; fi
  if [ -n "$LLAMACPP_COMMIT" ]; then
    echo "$LLAMACPP_COMMIT" >"$RAW/llamacpp-commit.txt"
  elif [ -n "$LLAMA_SRC" ] && [ -s "$LLAMA_SRC/VELA_LLAMACPP_COMMIT" ]; then
    cp "$LLAMA_SRC/VELA_LLAMACPP_COMMIT" "$RAW/llamacpp-commit.txt"
  elif [ -n "$LLAMA_SRC" ]; then
    git -C "$LLAMA_SRC" rev-parse HEAD >"$RAW/llamacpp-commit.txt" 2>/dev/null || true
  fi
  for name in $(model_names); do
    log "llama: llama-bench $name"
    # shellcheck disable=SC2086
    timed "$lb" -m "$MODELS_DIR/$name.gguf" -p "$N_PROMPT" -n "$N_GEN" -r "$REPS" $LLAMA_BENCH_ARGS \
      -o json >"$RAW/llamacpp-$name.json" 2>>"$RAW/llama-run.log" \
      || log "llama: llama-bench failed on $name"
  done
  if [ "$DEPTH" != 0 ] && model_names | grep -qx "$DEPTH_MODEL"; then
    log "llama: llama-bench $DEPTH_MODEL tg$N_GEN at depth $DEPTH"
    # shellcheck disable=SC2086
    timed "$lb" -m "$MODELS_DIR/$DEPTH_MODEL.gguf" -p 0 -n "$N_GEN" -d "$DEPTH" -r "$REPS" \
      $LLAMA_BENCH_ARGS -o json >"$RAW/llamacpp-$DEPTH_MODEL-depth.json" 2>>"$RAW/llama-run.log" \
      || log "llama: llama-bench -d $DEPTH failed on $DEPTH_MODEL"
    for kv in $KV_TYPES; do
      log "llama: llama-bench $DEPTH_MODEL tg$N_GEN at depth $DEPTH, KV cache $kv"
      # shellcheck disable=SC2086
      timed "$lb" -m "$MODELS_DIR/$DEPTH_MODEL.gguf" -p 0 -n "$N_GEN" -d "$DEPTH" -ctk "$kv" \
        -ctv "$kv" -r "$REPS" $LLAMA_BENCH_ARGS -o json \
        >"$RAW/llamacpp-$DEPTH_MODEL-depth-kv-$kv.json" 2>>"$RAW/llama-run.log" \
        || log "llama: llama-bench -d $DEPTH -ctk/-ctv $kv failed on $DEPTH_MODEL"
    done
  fi
  if model_names | grep -qx "$PARALLEL_MODEL" && [ -x "$bb" ]; then
    local maxpl bargs=$LLAMA_BATCHED_ARGS
    if [ -z "$bargs" ]; then
      bargs="-ngl 99 -fa"
      "$bb" --help 2>&1 | grep -q 'on|off|auto' && bargs="-ngl 99 -fa on"
    fi
    maxpl=$(echo "$PARALLEL" | tr ',' '\n' | sort -n | tail -1)
    log "llama: llama-batched-bench $PARALLEL_MODEL -npl $PARALLEL"
    # pp 1: batched-bench needs a prompt token; each sequence then decodes N_GEN tokens
    # shellcheck disable=SC2086
    timed "$bb" -m "$MODELS_DIR/$PARALLEL_MODEL.gguf" -c $((maxpl * (N_GEN + 1) + 256)) -b 2048 \
      -ub 512 -npp 1 -ntg "$N_GEN" -npl "$PARALLEL" $bargs --output-format jsonl \
      >"$RAW/llamacpp-$PARALLEL_MODEL-parallel.jsonl" 2>>"$RAW/llama-run.log" \
      || log "llama: llama-batched-bench failed"
  fi
}

stage_summary() {
  log "summary: $OUT"
  local names
  mapfile -t names < <(model_names)
  KV_TYPES="$KV_TYPES" python3 - "$RAW" "$OUT" "$PARALLEL_MODEL" "${names[@]}" <<'EOF'
import glob, json, os, re, sys
raw, out, par_model, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
kv_types = os.environ.get("KV_TYPES", "").split()

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

vela, llama = {}, {}
for n in names:
    vela[n] = load(f"{raw}/vela-{n}.json")
    llama[n] = load(f"{raw}/llamacpp-{n}.json")
vela_par = load(f"{raw}/vela-{par_model}-parallel.json")
# decode at depth (DEPTH_MODEL): both engines' rows join their model's
depth = {n: (load(f"{raw}/vela-{n}-depth.json"), load(f"{raw}/llamacpp-{n}-depth.json"))
         for n in names}
llama_par = []
try:
    with open(f"{raw}/llamacpp-{par_model}-parallel.jsonl") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    llama_par.append(json.loads(line))
                except ValueError:
                    pass
except OSError:
    pass

def llama_tps(n, test, rows_of=None):
    # llama-bench rows: n_prompt / n_gen tell pp from tg, n_depth the cache below
    for r in (llama.get(n) if rows_of is None else rows_of) or []:
        if r.get("n_depth", 0) != test.get("n_depth", 0):
            continue
        if test["kind"] == "pp" and r.get("n_prompt") == test["n_prompt"] and r.get("n_gen") == 0:
            return r.get("avg_ts")
        if test["kind"] == "tg" and r.get("n_gen") == test["n_gen"] and r.get("n_prompt") == 0:
            return r.get("avg_ts")
    return None

rows = []
def add(n, t, ltps):
    v = t.get("avg_ts")
    rows.append({"model": n, "test": t["test"], "vela_tps": v, "llamacpp_tps": ltps,
                 "ratio": (v / ltps) if (v and ltps) else None, "bw_frac": t.get("bw_frac")})

for n in names:
    for t in (vela[n] or {}).get("tests", []):
        add(n, t, llama_tps(n, t))
    # the same decode with f32 activations (--matvec-act f32), named e.g. tg128@f32act
    for t in (load(f"{raw}/vela-{n}-f32act.json") or {}).get("tests", []):
        add(n, dict(t, test=t["test"] + "@f32act"), llama_tps(n, t))
    # and with programmatic dependent launch (VELA_PDL=1), tg128@pdl
    for t in (load(f"{raw}/vela-{n}-pdl.json") or {}).get("tests", []):
        add(n, dict(t, test=t["test"] + "@pdl"), llama_tps(n, t))
    # and with the streaming mat-vecs under PDL, tg128@stream4+pdl
    for t in (load(f"{raw}/vela-{n}-stream4pdl.json") or {}).get("tests", []):
        add(n, dict(t, test=t["test"] + "@stream4+pdl"), llama_tps(n, t))
    vd, ld = depth[n]
    for t in (vd or {}).get("tests", []):
        add(n, t, llama_tps(n, t, ld or []))
    # at depth with quantized KV caches, beside llama-bench with the same types
    for kv in kv_types:
        vk = load(f"{raw}/vela-{n}-depth-kv-{kv}.json")
        lk = load(f"{raw}/llamacpp-{n}-depth-kv-{kv}.json")
        for t in (vk or {}).get("tests", []):
            add(n, dict(t, test=t["test"] + "@kv-" + kv), llama_tps(n, t, lk or []))
def par_tps(t):
    return next((r.get("speed_tg") for r in llama_par
                 if r.get("pl") == t["n_parallel"] and r.get("tg") == t["n_gen"]), None)
for t in (vela_par or {}).get("tests", []):
    if t["n_parallel"] == 1 and any(r["model"] == par_model and r["test"] == t["test"] for r in rows):
        continue
    add(par_model, t, par_tps(t))

first = next((v for v in list(vela.values()) + [vela_par] if v), {}) or {}
lc = None
if os.path.exists(f"{raw}/llamacpp-commit.txt"):
    lc = open(f"{raw}/llamacpp-commit.txt").read().strip() or None
if lc is None:
    lc = next((r.get("build_commit") for v in llama.values() for r in (v or [])), None)
dev = first.get("device", {})
summary = {"commit": first.get("commit"), "date": first.get("date"),
           "device": dev.get("name"), "llamacpp_commit": lc, "rows": rows}
with open(f"{out}/SUMMARY.json", "w") as f:
    json.dump(summary, f, indent=1)
with open(f"{out}/vela.json", "w") as f:
    json.dump({"runs": [v for v in list(vela.values()) + [vela_par] if v]}, f, indent=1)
with open(f"{out}/llamacpp.json", "w") as f:
    json.dump({"commit": lc, "bench": llama, "batched": llama_par}, f, indent=1)
for r in rows:
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
    lt = f"{r['llamacpp_tps']:.1f}" if r["llamacpp_tps"] else "-"
    bw = f"{100 * r['bw_frac']:.0f}%" if r["bw_frac"] else "-"
    print(f"{r['model']:<20} {r['test']:<12} vela {r['vela_tps'] or 0:>10.1f}  llama.cpp {lt:>10}  {ratio:>7}  bw {bw}")
EOF
  [ -f "$RAW/kernels.json" ] && cp "$RAW/kernels.json" "$OUT/kernels.json"
  [ -f "$RAW/kernels.md" ] && cp "$RAW/kernels.md" "$OUT/kernels.md"
  [ -f "$RAW/kernels-attn-se.json" ] && cp "$RAW/kernels-attn-se.json" "$OUT/"
  [ -f "$RAW/kernels-attn-se.md" ] && cp "$RAW/kernels-attn-se.md" "$OUT/"
  cp "$RAW/run.log" "$OUT/run.log"
}

for s in "${STAGES[@]}"; do
  "stage_${s//-/_}"
done
log "done: ${STAGES[*]}"
