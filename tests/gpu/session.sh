#!/usr/bin/env bash
# tests/gpu/session.sh: all that a session with a lent GPU runs (issue #15),
# in one device call inside a fixed time budget, most important first:
#   1. build vela for sm_90 and run the GPU tests (tests/gpu/run_device.sh);
#      llama.cpp builds beside it on the spare cores when --llama-src is given
#   2. compute-sanitizer memcheck over the GPU test binaries; then, while
#      llama.cpp is still building, racecheck, synccheck and initcheck
#   3. per model, most wanted first: write it (vela mkmodel, the next one in
#      the background), vela bench, llama-bench on the same file, delete it;
#      after the fourth model, bench/kernels: the quick table and exact
#      self-extend against ordinary attention at 4k/16k/64k keys (#13)
#   3b. Nsight Compute: its detailed sections for decode attention and the
#      Q4_K mat-vec, then the first model's decode: each kernel's share of
#      the time and its DRAM GB/s (profile.json, bench/ncu_profile.py)
#   4. the sanitizer runs that are still missing, while time is left
# SUMMARY.json/.md, gpu-tests.json and the logs go into OUT (8 files at most,
# what the device tool brings back) after every step that adds results, so
# that a call cut off at its limit still brings them back. Nothing is timed while something
# else runs on the GPU; vela's benches wait for llama.cpp's build until 300 s
# before the deadline, and past that run beside it (session.json and
# SUMMARY.md name them); the next model is written meanwhile by two
# low-priority threads (mkmodel is mostly disk writes).
#
# usage: VELA_COMMIT=<sha> bash tests/gpu/session.sh [--run all|decide] [--out DIR]
#          [--budget S] [--llama-pkg DIR | --llama-src DIR | --llama-build DIR]
#          [--models LIST] [--work DIR] [--dry-run BUILD_DIR] [--plan]
#   --run decide     a session's first call (issue #29's run 1): only what
#                    decides the variants under test, planned to fit the
#                    budget (default 450): vela and vela-bench-kernels built
#                    alone, then per model of DECIDE_MODELS vela bench
#                    (default, @pdl, @stream4+pdl) and llama-bench when a
#                    prebuilt one runs here, and the kernels stage after the
#                    first; no GPU tests, sanitizers or profile, no llama.cpp
#                    build (it would run beside the timings). --run all (the
#                    default): everything below, most important first
#   --plan           print the time plan of --run decide (JSON) and exit:
#                    1 when it does not fit the budget
#   --budget S       seconds for this call, summary included (default 540,
#                    450 with --run decide: a device command may run 600)
#   --llama-pkg DIR  llama.cpp packed by bench/llamacpp_pkg.sh: its prebuilt
#                    binaries when they run here, else its sources, built
#                    as with --llama-src
#   --llama-src DIR  llama.cpp sources (bench/llamacpp_src.sh makes them)
#   --llama-build D  a llama.cpp build with bin/llama-bench (no build step)
#   --models LIST    comma list of names from MODELS below (default: all)
#   --work DIR       work dir, kept between calls (default build-gpu-session;
#                    build-gpu-decide with --run decide)
#   --dry-run B      no GPU: CPU backend, two tiny models, B's build as it is
#                    (CI runs this; GPU tests there report skipped); no
#                    sanitizer unless VELA_SANITIZER names one to run
# Call it again at once when the budget ran out (a device machine stays warm
# 30 s): whatever is done (the builds, the tests, each sanitizer run, each
# model's benches) is kept in the work dir and not done again.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T0=$(date +%s)
BUDGET=""
RUN=all
PLAN_ONLY=""
OUTDIR=${OUT:-}
LLAMA_SRC=""
LLAMA_BUILT=""
LLAMA_PKG=""
PICK=""
W=""
DRY=""
# name|mkmodel flags|extra: the issue's eight, most used first, then the
# mixtures of experts of issues #32 and #35 (reached when time is left, or
# picked with --models); "f32act" also times decode with f32 activations,
# "par" adds 8 and 64 parallel sequences.
MODELS=(
  "llama3-8b-q4_k_m|--preset llama3-8b --type q4_k_m|f32act par"
  "llama2-7b-q4_0|--preset llama2-7b --type q4_0|f32act"
  "llama2-7b-q8_0|--preset llama2-7b --type q8_0|"
  "llama3-8b-q4_0|--preset llama3-8b --type q4_0|"
  "llama2-7b-f16|--preset llama2-7b --type f16|"
  "llama3-8b-q8_0|--preset llama3-8b --type q8_0|"
  "llama2-7b-q4_k_m|--preset llama2-7b --type q4_k_m|"
  "llama3-8b-f16|--preset llama3-8b --type f16|"
  "qwen3-30b-a3b-q4_k_m|--preset qwen3-30b-a3b --mix q4_k_m|"
  "gpt-oss-20b-mxfp4|--preset gpt-oss-20b|"
)
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUTDIR=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --run) RUN=$2; shift 2 ;;
    --plan) PLAN_ONLY=1; shift ;;
    --llama-pkg) LLAMA_PKG=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --llama-src) LLAMA_SRC=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --llama-build) LLAMA_BUILT=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --models) PICK=$2; shift 2 ;;
    --work) W=$2; shift 2 ;;
    --dry-run) DRY=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "session.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$RUN" in all|decide) ;; *) echo "session.sh: --run '$RUN': all or decide expected" >&2; exit 2 ;; esac
[ -n "$BUDGET" ] || { [ "$RUN" = decide ] && BUDGET=450 || BUDGET=540; }
# run 1 keeps its own work dir: run 2, after the defaults moved, measures again
[ -n "$W" ] || { [ "$RUN" = decide ] && W=$ROOT/build-gpu-decide || W=$ROOT/build-gpu-session; }
case "$BUDGET" in ''|*[!0-9]*) echo "session.sh: --budget '$BUDGET': seconds expected" >&2; exit 2 ;; esac
# --run decide's models: one per weight family whose kernel variants are
# undecided (the dp4a mat-vec on Q4_K, Q4_0 and Q8_0, the F16 mat-vec), no
# extra runs (f32 activations and parallel sequences are run 2's).
DECIDE_MODELS=(
  "llama3-8b-q4_k_m|--preset llama3-8b --type q4_k_m|"
  "llama2-7b-q4_0|--preset llama2-7b --type q4_0|"
  "llama3-8b-q8_0|--preset llama3-8b --type q8_0|"
  "llama3-8b-f16|--preset llama3-8b --type f16|"
)
[ "$RUN" = decide ] && MODELS=("${DECIDE_MODELS[@]}")
if [ -n "$DRY" ]; then
  MODELS=("tiny|--preset tiny|f32act par" "tiny-q8|--preset tiny --type q8_0|")
  [ "$RUN" = decide ] && MODELS=("tiny|--preset tiny|" "tiny-q8|--preset tiny --type q8_0|")
fi
if [ -n "$PICK" ]; then
  kept=()
  for n in ${PICK//,/ }; do
    m=$(printf '%s\n' "${MODELS[@]}" | grep "^$n|") \
      || { echo "session.sh: --models: unknown model '$n'" >&2; exit 2; }
    kept+=("$m")
  done
  MODELS=("${kept[@]}")
fi
# A model spec "name|flags|extra" and its parts.
m_name() { echo "${1%%|*}"; }
m_flags() { local r=${1#*|}; echo "${r%%|*}"; }
m_extra() { echo "${1##*|}"; }
spec_of() { printf '%s\n' "${MODELS[@]}" | grep "^$1|"; }
DEADLINE=$((T0 + BUDGET))
RESERVE=25 # seconds kept for the summary and packing
# --run decide's time plan on an H200, in seconds (assumed; session.json
# records what each step took, to plan the next run by): vela and
# vela-bench-kernels built alone on all cores, per model its mkmodel, vela
# bench (pp512 and tg128, then tg128 @pdl and @stream4+pdl) and llama-bench,
# the kernels stage once, and RESERVE for the summary.
PLAN_BUILD=150
PLAN_MODEL=45
PLAN_KERNELS=60
plan_total() { echo $((PLAN_BUILD + ${#MODELS[@]} * PLAN_MODEL + PLAN_KERNELS + RESERVE)); }
if [ -n "$PLAN_ONLY" ]; then
  python3 -c 'import json, sys; a = sys.argv; n = int(a[3])
print(json.dumps({"run": "decide", "budget_s": int(a[1]), "total_s": int(a[2]),
                  "steps": [["build", int(a[4])]] + [[m, int(a[5])] for m in a[8:8 + n]]
                  + [["kernels", int(a[6])], ["summary", int(a[7])]]}))' \
    "$BUDGET" "$(plan_total)" "${#MODELS[@]}" "$PLAN_BUILD" "$PLAN_MODEL" "$PLAN_KERNELS" \
    "$RESERVE" $(for m in "${MODELS[@]}"; do m_name "$m"; done)
  [ "$(plan_total)" -le "$BUDGET" ]
  exit
fi
if [ "$RUN" = decide ] && [ "$(plan_total)" -gt "$BUDGET" ]; then
  echo "session.sh: --run decide plans $(plan_total) s (build $PLAN_BUILD, ${#MODELS[@]} models" \
    "x $PLAN_MODEL, kernels $PLAN_KERNELS, summary $RESERVE) but --budget is $BUDGET s:" \
    "pick fewer --models" >&2
  exit 2
fi
mkdir -p "$W/state" "$W/logs"
W=$(cd "$W" && pwd)
[ -n "$OUTDIR" ] || OUTDIR=$W/out
mkdir -p "$OUTDIR"
cd "$ROOT"
LOG=$W/logs/session.log
STEPS=$W/state/steps.tsv # step, seconds, result: session.json's rows
log() { echo "[session +$(($(date +%s) - T0))s] $*" | tee -a "$LOG" >&2; }
left() { echo $((DEADLINE - RESERVE - $(date +%s))); }
# step NAME CMD...: runs CMD, records its seconds and exit status.
step() {
  local name=$1 t=$(date +%s) rc
  shift
  log "$name: start"
  "$@"
  rc=$?
  printf '%s\t%s\t%s\n' "$name" $(($(date +%s) - t)) "$rc" >>"$STEPS"
  log "$name: rc=$rc, $(($(date +%s) - t)) s"
  return $rc
}
# quiet FILE CMD...: CMD with its output dropped and its errors added to FILE
# (inside a step, whose own lines still reach the console).
quiet() {
  local f=$1
  shift
  "$@" >/dev/null 2>>"$f"
}
done_mark() { touch "$W/state/$1.done"; }
is_done() { [ -f "$W/state/$1.done" ]; }
# What a build is made from (sources, CMake files, carried packages): a build
# that failed is not tried again in a later call unless this changed.
tree_id() {
  find CMakeLists.txt cuda host gguf kv tests tools bench .devdeps -type f \
    ! -path 'tests/data/*' 2>/dev/null | LC_ALL=C sort | xargs cat 2>/dev/null | cksum
}

. tests/gpu/devdeps.sh
NPROC=$(nproc 2>/dev/null || echo 4)
log "budget ${BUDGET}s, $NPROC cores, $(nvidia-smi --query-gpu=name,driver_version \
  --format=csv,noheader 2>/dev/null || echo 'no GPU'), commit ${VELA_COMMIT:-unknown}, \
$(df -P -BG "$W" | awk 'NR==2 {print $4}') free, $(nvcc --version 2>/dev/null | grep -Eo 'release [0-9.]+' \
  || echo 'no nvcc'), $(command -v compute-sanitizer >/dev/null && echo sanitizer || echo 'no sanitizer')"

# --llama-pkg: the prebuilt llama-bench if it loads and answers here (a
# library or glibc it needs could be missing), else the packed sources.
if [ -n "$LLAMA_PKG" ]; then
  P=$W/llama-pkg
  if [ -s "$LLAMA_PKG/llama-bin.tar.xz" ] && [ ! -x "$P/bin/llama-bench" ]; then
    mkdir -p "$P" && tar -C "$P" -xJf "$LLAMA_PKG/llama-bin.tar.xz" \
      || log "llama-pkg: llama-bin.tar.xz did not unpack"
  fi
  if [ -x "$P/bin/llama-bench" ] &&
    LD_LIBRARY_PATH="$P/bin:${LD_LIBRARY_PATH:-}" "$P/bin/llama-bench" --help \
      >/dev/null 2>"$W/logs/llama-pkg.err"; then
    export LD_LIBRARY_PATH="$P/bin:${LD_LIBRARY_PATH:-}"
    export LLAMACPP_COMMIT="$(cat "$LLAMA_PKG/VELA_LLAMACPP_COMMIT" 2>/dev/null || echo unknown)"
    LLAMA_BUILT=$P
    log "llama-pkg: prebuilt llama.cpp $LLAMACPP_COMMIT runs here"
  elif [ -s "$LLAMA_PKG/llama-src.tar.xz" ]; then
    log "llama-pkg: the prebuilt llama-bench does not run here ($(head -c 200 \
      "$W/logs/llama-pkg.err" 2>/dev/null | tr '\n' ' ')): building its sources"
    if [ ! -f "$P/src/CMakeLists.txt" ]; then
      mkdir -p "$P/src" && tar -C "$P/src" -xJf "$LLAMA_PKG/llama-src.tar.xz" \
        || log "llama-pkg: llama-src.tar.xz did not unpack"
    fi
    [ -f "$P/src/CMakeLists.txt" ] && LLAMA_SRC=$P/src
  else
    log "llama-pkg: $LLAMA_PKG has neither a working llama-bin.tar.xz nor llama-src.tar.xz"
  fi
fi

if [ "$RUN" = decide ] && [ -n "$LLAMA_SRC" ] && [ -z "$LLAMA_BUILT" ]; then
  log "run decide: llama.cpp from sources is not built here (it would run beside the timings):" \
    "vela only; --run all builds it"
  LLAMA_SRC=""
fi
B=$W/build
[ "$RUN" = decide ] && B=$W/build-bench
[ -n "$DRY" ] && B=$DRY
DEV=(bash tests/gpu/run_device.sh --build-dir "$B" --out "$W/device-out" --gpu-only)
[ -n "$DRY" ] && DEV+=(--no-build)
BENCH_ENV=(VELA_BENCH_BUILD="$B" VELA_BENCH_WORK="$W/bench" VELA_DEADLINE=$((DEADLINE - RESERVE))
  VELA_STEP_MAX=180 N_PROMPT=512 N_GEN=128 PARALLEL=8,64)
[ -n "$DRY" ] && BENCH_ENV+=(BACKEND=cpu N_PROMPT=16 N_GEN=4 PARALLEL=2 DEPTH=32)
RUN_GPU=(bash bench/run_gpu.sh --out "$W/bench-out" --reps 3)
LLAMA_BIN=$W/bench/llama/bin
[ -n "$LLAMA_SRC" ] && RUN_GPU+=(--llama-src "$LLAMA_SRC")
if [ -n "$LLAMA_BUILT" ]; then
  RUN_GPU+=(--llama-build "$LLAMA_BUILT")
  LLAMA_BIN=$LLAMA_BUILT/bin
  LLAMA_SRC=$LLAMA_BUILT # "llama.cpp wanted" below; never built again
fi

# publish print|quiet: SUMMARY.json/.md, gpu-tests.json, the kernels JSON,
# session.json and logs.tar.gz into OUT from what is done so far (again after
# each step that adds results, so that a call cut off at its limit still
# brings them back); print: SUMMARY.md on the console too.
publish() {
  local mnames="" s
  for s in "${MODELS[@]}"; do mnames+="$(m_name "$s"):$(m_flags "$s");"; done
  env "${BENCH_ENV[@]}" VELA_DEADLINE= PARALLEL_MODEL="$(m_name "${MODELS[0]}")" "${RUN_GPU[@]}" \
    --models "$mnames" summary >"$W/logs/summary.out" 2>&1 || log "summary failed (logs/summary.out)"
  python3 - "$W" "$OUTDIR" "$T0" "$BUDGET" "$1" "$RUN" "$(plan_total)" <<'PY'
import glob, json, os, sys, tarfile, time
w, out, t0, budget, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
run, plan_s = sys.argv[6], int(sys.argv[7])
def load(p):
    try: return json.load(open(p))
    except (OSError, ValueError): return None
tests = load(f"{w}/device-out/gpu-tests.json") or {}
summ = load(f"{w}/bench-out/SUMMARY.json") or {"rows": []}
steps = []
if os.path.exists(f"{w}/state/steps.tsv"):
    for line in open(f"{w}/state/steps.tsv"):
        name, secs, rc = line.rstrip("\n").split("\t")
        steps.append({"step": name, "seconds": int(secs), "rc": int(rc)})
session = {"commit": tests.get("commit") or os.environ.get("VELA_COMMIT"), "date": tests.get("date"), "device": tests.get("device"),
           "run": run, "plan_s": plan_s if run == "decide" else None,
           "budget_s": budget, "elapsed_s": int(time.time()) - t0, "steps": steps,
           "done": sorted(os.path.basename(p)[:-5] for p in glob.glob(f"{w}/state/*.done")),
           # vela benches timed while llama.cpp was still building (nice 10)
           "timed_beside_llama_build": sorted(os.path.basename(p)[len("beside-llama-build-"):]
                                              for p in glob.glob(f"{w}/state/beside-llama-build-*"))}
json.dump(session, open(f"{out}/session.json", "w"), indent=1)
for name in ("gpu-tests.json",):
    if os.path.exists(f"{w}/device-out/{name}"):
        open(f"{out}/{name}", "w").write(open(f"{w}/device-out/{name}").read())
for name in ("SUMMARY.json", "kernels.json", "kernels-attn-se.json", "profile.json"):
    if os.path.exists(f"{w}/bench-out/{name}"):
        open(f"{out}/{name}", "w").write(open(f"{w}/bench-out/{name}").read())
# SUMMARY.md: what a person reads first.
fmt = lambda v, f: (f % v) if isinstance(v, (int, float)) else "-"
md = [f"# GPU session: {tests.get('device') or 'no GPU'}", "",
      f"commit {tests.get('commit')}, {tests.get('date')}, driver {tests.get('driver')}, "
      f"CUDA {tests.get('cuda')}, llama.cpp {summ.get('llamacpp_commit')}", "",
      (f"Run 1 (--run decide, planned {plan_s} s of {budget}): the variants' rows only; no GPU "
       "tests or sanitizers in this call. " if run == "decide" else "")
      + ("**The build failed** (logs.tar.gz: build-logs/build.log); the counts are of the "
         "binaries it made. " if tests.get("build_ok") is False else "")
      + ("" if run == "decide" else
         f"GPU tests: {tests.get('passed')} passed, {tests.get('failed')} failed, "
         f"{tests.get('skipped')} skipped. Sanitizer: {json.dumps(tests.get('sanitizer'))}"
         + (" (compute-sanitizer refused the device: 'Device not supported')"
            if any(r.get("unsupported") for r in (tests.get("sanitizer_runs") or {}).values())
            else "")),
      "",
      "| model | test | vela t/s | llama.cpp t/s | ratio | bw |", "|---|---|---:|---:|---:|---:|"]
for r in summ.get("rows", []):
    md.append(f"| {r['model']} | {r['test']} | {fmt(r['vela_tps'], '%.1f')} | "
              f"{fmt(r['llamacpp_tps'], '%.1f')} | {fmt(r['ratio'], '%.2fx')} | "
              f"{fmt(r['bw_frac'] and 100 * r['bw_frac'], '%.0f%%')} |")
prof = load(f"{w}/bench-out/profile.json")
if prof:
    md += ["", f"Decode profile ({prof.get('what')}; kernels one at a time): "
           f"{prof['launches']} launches, {prof['us_total']:.0f} us", "",
           "| kernel | share | launches | us | GB/s | bw |", "|---|---:|---:|---:|---:|---:|"]
    for k in prof["kernels"][:10]:
        md.append(f"| `{k['kernel']}` | {fmt(k['time_frac'] and 100 * k['time_frac'], '%.1f%%')} | "
                  f"{k['launches']} | {k['us_total']:.0f} | {fmt(k['gbs'], '%.0f')} | "
                  f"{fmt(k['bw_frac'] and 100 * k['bw_frac'], '%.0f%%')} |")
if session["timed_beside_llama_build"]:
    md += ["", "vela timed while llama.cpp was still building: "
           + ", ".join(session["timed_beside_llama_build"])]
md += ["", "Steps: " + ", ".join(f"{s['step']} {s['seconds']}s" + ("" if s["rc"] == 0 else f" (rc {s['rc']})")
                                  for s in steps)]
open(f"{out}/SUMMARY.md", "w").write("\n".join(md) + "\n")
with tarfile.open(f"{out}/logs.tar.gz", "w:gz") as tar:
    for d in ("logs", "device-out", "bench-out", "bench/raw", "build/logs", "build/sanitizer"):
        if os.path.isdir(f"{w}/{d}"):
            tar.add(f"{w}/{d}", arcname=d.replace("/", "-"))
if mode == "print":
    print("\n".join(md))
PY
}

# --- 1. llama.cpp in the background, vela and the GPU tests in front --------
llama_pid=""
if [ -n "$LLAMA_SRC" ] && [ ! -x "$LLAMA_BIN/llama-bench" ]; then
  # At low priority on all but two cores: vela's build and tests come first.
  (env "${BENCH_ENV[@]}" LLAMA_NICE=10 LLAMA_JOBS=$((NPROC > 4 ? NPROC - 2 : NPROC)) \
     timeout $(($(left) > 0 ? $(left) : 1)) "${RUN_GPU[@]}" llama-build \
     >"$W/logs/llama-build.out" 2>&1) &
  llama_pid=$!
  log "llama-build: started (pid $llama_pid)"
fi
llama_building() { [ -n "$llama_pid" ] && kill -0 "$llama_pid" 2>/dev/null; }

# A build that failed in an earlier call, from other sources (a fix, or the
# packages carried again): built again from a fresh CMake cache, which would
# otherwise keep what the failed configure found.
if is_done test-build-failed && [ "$(cat "$W/state/test-build-failed.done")" != "$(tree_id)" ]; then
  log "sources changed since the failed build: building again"
  rm -f "$W/state/test-build-failed.done" "$W/state/gpu-tests.done"
  [ -z "$DRY" ] && rm -f "$B/CMakeCache.txt" "$W/build-bench/CMakeCache.txt"
fi
if [ "$RUN" = all ] && ! is_done gpu-tests && ! is_done test-build-failed; then
  step gpu-tests timeout $(($(left) > 0 ? $(left) : 1)) env VELA_COMMIT="${VELA_COMMIT:-}" \
    "${DEV[@]}" --no-sanitizer
  [ -f "$B/ctest.log" ] && done_mark gpu-tests
  [ -x "$B/vela" ] || tree_id >"$W/state/test-build-failed.done"
  publish quiet
fi
# The test build failed (Criterion, say), or --run decide: the benches run
# on a build of vela and vela-bench-kernels alone.
if [ ! -x "$B/vela" ] && [ -z "$DRY" ]; then
  B=$W/build-bench
  BENCH_ENV[0]=VELA_BENCH_BUILD=$B
  [ "$RUN" = decide ] && log "run decide: vela and vela-bench-kernels alone in $B" ||
    log "no vela from the test build (logs.tar.gz: build-logs/build.log): vela alone in $B"
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  [ -x "$B/vela" ] || step build-bench quiet "$W/logs/build-bench.err" bash -c \
    'cmake -S . -B "$1" "${@:2}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
       -DVELA_TESTS=OFF && cmake --build "$1" -j "$(nproc)" --target vela vela-bench-kernels' \
    _ "$B" "${gen[@]}"
fi
if [ ! -x "$B/vela" ]; then
  log "no vela binary in $B (build failed: logs.tar.gz, build-logs/build.log): summary only"
  DEADLINE=$(date +%s) # every later step sees no time left
  RESERVE=0
fi

# --- 2. sanitizers: memcheck first, the others while llama.cpp builds -------
sanitize() { # TOOLS SECONDS (--sanitizer-only needs the tests' log: it would build otherwise)
  { [ -z "$DRY" ] || [ -n "${VELA_SANITIZER:-}" ]; } && [ -f "$B/ctest.log" ] &&
    command -v "${VELA_SANITIZER:-compute-sanitizer}" >/dev/null || return 0
  local s=$2
  [ "$s" -gt "$(left)" ] && s=$(left)
  [ "$s" -ge 10 ] || return 0
  step "sanitizer:$1" quiet "$W/logs/sanitizer.err" env VELA_COMMIT="${VELA_COMMIT:-}" \
    "${DEV[@]}" --sanitizer-only --sanitizer-tools "$1" --sanitizer-budget "$s" \
    --sanitizer-timeout 60
}
[ "$RUN" = all ] && sanitize memcheck 120
publish quiet
while llama_building && [ "$(left)" -gt 300 ]; do
  before=$(ls "$B/sanitizer" 2>/dev/null | wc -l)
  sanitize racecheck,synccheck,initcheck 60
  [ "$(ls "$B/sanitizer" 2>/dev/null | wc -l)" -gt "$before" ] || break # all done
done
if llama_building; then
  log "llama-build: waiting (at most until 300 s before the deadline)"
  while llama_building && [ "$(left)" -gt 300 ]; do sleep 2; done
fi
llama_building && log "llama-build: still building; benches run without llama.cpp for now"

# --- 3. models: write, vela bench, llama-bench, delete ------------------------
MODELS_DIR=$W/bench/models
mkdir -p "$MODELS_DIR"
# Writes model $1 unless it exists (a half-written file is removed; extra
# mkmodel flags, e.g. --threads, follow the name).
write_model() {
  local s n f
  s=$(spec_of "$1"); n=$(m_name "$s"); f=$MODELS_DIR/$n.gguf
  shift
  [ -s "$f" ] && return 0
  # shellcheck disable=SC2046
  "$B/vela" mkmodel $(m_flags "$s") "$@" -q -o "$f.part" >>"$W/logs/mkmodel.log" 2>&1 \
    && mv "$f.part" "$f" || { rm -f "$f.part"; return 1; }
}
# make_room IN_USE: while under 30 GB are free (the largest model is 16 GB),
# models kept for a llama.cpp run that has not happened yet are dropped,
# oldest first, never IN_USE. Fails when that does not free enough.
make_room() {
  local k
  for k in "${names[@]}"; do
    [ "$(df -P -BG "$MODELS_DIR" | awk 'NR==2 {print int($4)}')" -ge 30 ] && return 0
    [ "$k" != "$1" ] && [ -s "$MODELS_DIR/$k.gguf" ] || continue
    log "disk: under 30 GB free: $k deleted before llama.cpp ran on it"
    rm -f "$MODELS_DIR/$k.gguf"
  done
  [ "$(df -P -BG "$MODELS_DIR" | awk 'NR==2 {print int($4)}')" -ge 30 ]
}
# Whether model $1 still has benches to run.
needs_work() { ! is_done "vela-$1" || { [ -n "$LLAMA_SRC" ] && ! is_done "llama-$1"; }; }
prefetch_pid=""
bench_model() { # NAME
  local s n extra f32=0 par=PARALLEL_MODEL=none
  s=$(spec_of "$1"); n=$(m_name "$s"); extra=$(m_extra "$s")
  [[ " $extra " == *" f32act "* ]] && f32=1
  [[ " $extra " == *" par "* ]] && par=PARALLEL_MODEL=$n
  if ! is_done "vela-$n"; then
    llama_building && touch "$W/state/beside-llama-build-$n"
    step "vela:$n" quiet "$W/logs/bench.err" env "${BENCH_ENV[@]}" VELA_F32ACT=$f32 "$par" \
      "${RUN_GPU[@]}" --models "$n:$(m_flags "$s")" vela
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$W/bench/raw/vela-$n.json" \
      2>/dev/null && done_mark "vela-$n"
  fi
  if [ -x "$LLAMA_BIN/llama-bench" ] && ! llama_building && ! is_done "llama-$n"; then
    step "llama:$n" quiet "$W/logs/bench.err" env "${BENCH_ENV[@]}" "$par" "${RUN_GPU[@]}" \
      --models "$n:$(m_flags "$s")" llama
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$W/bench/raw/llamacpp-$n.json" \
      2>/dev/null && done_mark "llama-$n"
  fi
}
# GPU events: a llama.cpp build on the CPU does not disturb them.
run_kernels() {
  is_done kernels || [ "$(left)" -lt 60 ] && return 0
  # a build without CUDA (the dry run on such a build) has no kernel bench
  [ -x "$B/bench/vela-bench-kernels" ] || { log "kernels: no $B/bench/vela-bench-kernels"; return 0; }
  step kernels quiet "$W/logs/bench.err" env "${BENCH_ENV[@]}" "${RUN_GPU[@]}" --quick kernels \
    && [ -s "$W/bench/raw/kernels-attn-se.json" ] && done_mark kernels
}
names=()
for s in "${MODELS[@]}"; do names+=("$(m_name "$s")"); done
for i in "${!names[@]}"; do
  n=${names[$i]}
  # the kernel rows decide variants too: after the first model in run 1
  [ "$i" = "$([ "$RUN" = decide ] && echo 1 || echo 4)" ] && run_kernels
  needs_work "$n" || continue
  [ "$(left)" -gt 40 ] || { log "models: no time left for $n and after"; break; }
  [ -n "$prefetch_pid" ] && wait "$prefetch_pid"
  prefetch_pid=""
  make_room "$n" # else mkmodel may fail on a full disk, cleanly
  step "mkmodel:$n" write_model "$n" || { log "mkmodel: $n failed (logs/mkmodel.log)"; continue; }
  nxt=${names[$((i + 1))]:-}
  if [ -n "$nxt" ] && needs_work "$nxt" && make_room "$n"; then
    (renice -n 19 -p $BASHPID >/dev/null; write_model "$nxt" --threads 2) &
    prefetch_pid=$!
  fi
  bench_model "$n"
  publish quiet
  # Keep the file only while llama.cpp still has to run on it.
  if ! { [ -n "$LLAMA_SRC" ] && ! is_done "llama-$n"; }; then rm -f "$MODELS_DIR/$n.gguf"; fi
done
[ -n "$prefetch_pid" ] && wait "$prefetch_pid"
run_kernels

# llama.cpp finished late: the models it has not run yet, while they are on disk.
if [ -n "$LLAMA_SRC" ]; then
  while llama_building && [ "$(left)" -gt 60 ]; do sleep 2; done
  for n in "${names[@]}"; do
    [ -s "$MODELS_DIR/$n.gguf" ] && [ "$(left)" -gt 30 ] && bench_model "$n" \
      && is_done "llama-$n" && rm -f "$MODELS_DIR/$n.gguf"
  done
fi

# --- 3b. where a decode step's time goes: ncu on the first model ------------
# Per-kernel time and DRAM bytes of `vela bench -p 0 -n 8` (warm-up and one
# repetition) under Nsight Compute, summed per kernel by bench/ncu_profile.py
# into profile.json. VELA_NCU names a stand-in (the dry run's).
run_profile() {
  local n=${names[0]} ncu=${VELA_NCU:-ncu} lim peak csv=$W/bench/raw/ncu-${names[0]}.csv
  is_done profile && return 0
  [ "$(left)" -ge 100 ] || { log "profile: no time left"; return 0; }
  make_room "$n" && step "mkmodel:$n" write_model "$n" || return 0
  lim=$(($(left) - 30 < 120 ? $(left) - 30 : 120))
  step "profile:$n" quiet "$W/logs/profile.err" bash -c '"${@:3}" >"$1" 2>>"$2"' _ "$csv" \
    "$W/logs/profile.err" timeout "$lim" "$ncu" --clock-control none --print-units base --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --launch-count 2000 "$B/vela" bench -m "$MODELS_DIR/$n.gguf" -p 0 -n 8 -r 1
  peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"]["peak_bw_gbs"])' \
    "$W/bench-out/kernels.json" 2>/dev/null) || peak=""
  python3 bench/ncu_profile.py "$csv" "$W/bench-out/profile.json" ${peak:+--peak-gbs "$peak"} \
    --what "vela bench -p 0 -n 8 -r 1 on $n under ncu" >>"$LOG" 2>&1 && done_mark profile
  if ! { [ -n "$LLAMA_SRC" ] && ! is_done "llama-$n"; }; then rm -f "$MODELS_DIR/$n.gguf"; fi
}
# Why the decode kernels are slow: ncu's detailed sections (occupancy,
# memory throughput, warp stalls) for one launch each of decode attention
# at 4k keys and the Q4_K dp4a mat-vec (both kernels: one-pass, then
# pipelined), as text in logs.tar.gz. First: it takes about a minute and
# says the most per second.
run_kernel_detail() {
  local ncu=${VELA_NCU:-ncu}
  is_done profile-kernels || [ "$(left)" -lt 60 ] || [ ! -x "$B/bench/vela-bench-kernels" ] && return 0
  step "profile:kernels" quiet "$W/logs/profile.err" bash -c '"${@:2}" >"$1" 2>&1' _ \
    "$W/bench/raw/ncu-kernels-detail.txt" timeout 45 "$ncu" --clock-control none --set detailed \
    -k 'regex:attn_kernel|attn_combine|matvec_q8_kernel|quantize_q8_1' --launch-count 8 \
    "$B/bench/vela-bench-kernels" --filter attn_decode,matvec --models llama3-8b --types q4_K \
    --ctx 4096 --matvec-tok 1 --matvec-act q8 -r 1 --warmup 0 && done_mark profile-kernels
  # the pipelined mat-vec (--matvec-q8 pipe) on the same shapes, appended
  [ "$(left)" -ge 40 ] && step "profile:kernels-pipe" quiet "$W/logs/profile.err" \
    bash -c '"${@:2}" >>"$1" 2>&1' _ "$W/bench/raw/ncu-kernels-detail.txt" \
    timeout 30 "$ncu" --clock-control none --set detailed -k 'regex:matvec_q8_pipe_kernel' \
    --launch-count 4 "$B/bench/vela-bench-kernels" --matvec-q8 pipe --filter matvec \
    --models llama3-8b --types q4_K --matvec-tok 1 --matvec-act q8 -r 1 --warmup 0
  return 0
}
if [ "$RUN" = decide ]; then
  log "run decide: no profile, no sanitizers (--run all)"
elif command -v "${VELA_NCU:-ncu}" >/dev/null; then
  run_kernel_detail
  run_profile
else
  log "profile: no ncu"
fi
publish quiet

# --- 4. the sanitizer runs still missing ------------------------------------
[ "$RUN" = all ] && sanitize memcheck,racecheck,synccheck,initcheck $(($(left) - 5))

# --- summary --------------------------------------------------------------------
llama_building && { log "llama-build: still running at the deadline: stopped"; kill "$llama_pid" 2>/dev/null; }
publish print
log "done: $(ls "$OUTDIR" | tr '\n' ' ')"
