#!/usr/bin/env bash
# tests/gpu/run_device.sh: the GPU tests on a lent GPU: build vela for one
# architecture, run the test suite (GPU tests included), run compute-sanitizer
# (memcheck, racecheck, synccheck, initcheck) over the GPU test binaries, and
# write gpu-tests.json:
#   {"commit", "date", "device", "driver", "cuda", "passed", "failed", "skipped",
#    "sanitizer": {"memcheck": errors, "racecheck": hazards, "synccheck": errors,
#                  "initcheck": errors}, "sanitizer_runs": {...}}
# and gpu-tests-logs.tar.gz (build, ctest and sanitizer logs) into OUT (default:
# $OUT, the device tool's output folder, which brings back 8 files at most).
# tests/gpu/session.sh runs this and bench/run_gpu.sh within one time budget.
#
# usage: VELA_COMMIT=<sha> tests/gpu/run_device.sh [--arch SM] [--out DIR] [--build-dir DIR]
#          [--gpu-only] [--no-sanitizer] [--sanitizer-only] [--sanitizer-tools LIST]
#          [--sanitizer-timeout S] [--sanitizer-budget S]
#   --gpu-only           build and run only the GPU tests (CI runs the rest)
#   --no-build           use the build dir as it is (e.g. CI's, for a dry run)
#   --sanitizer-only     reuse the build and the test log; run only the sanitizers
#   --sanitizer-tools    comma list (default memcheck,racecheck,synccheck,initcheck)
#   --sanitizer-timeout  at most S seconds per binary and tool (default 150)
#   --sanitizer-budget   at most S seconds for all sanitizer runs of this call
#                        (default 0: no limit); runs that do not fit are listed
#                        in sanitizer_runs.TOOL.not_run
# Each (tool, binary) run keeps its log in BUILD/sanitizer/, so a later call
# with other tools adds to the counts; a run already done is not repeated.
# A run cut short counts in sanitizer_runs.TOOL.timeouts (its count is
# partial). The emulator tests (tests/emu) are not built here: the real GPU
# runs the real thing.
# Needs: nvcc, cmake, a C compiler, python3; Criterion and cJSON either
# installed or carried as .deb files in .devdeps/ (../shared/device/README.md).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ARCH=90
OUTDIR=${OUT:-$ROOT/build-gpu-tests/out}
B=build-gpu-tests
SANITIZE=1
SAN_ONLY=0
GPU_ONLY=0
BUILD=1
SAN_TOOLS=memcheck,racecheck,synccheck,initcheck
SAN_TIMEOUT=150
SAN_BUDGET=0
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    --build-dir) B=$2; shift 2 ;;
    --gpu-only) GPU_ONLY=1; shift ;;
    --no-build) BUILD=0; shift ;;
    --no-sanitizer) SANITIZE=0; shift ;;
    --sanitizer-only) SAN_ONLY=1; shift ;;
    --sanitizer-tools) SAN_TOOLS=$2; shift 2 ;;
    --sanitizer-timeout) SAN_TIMEOUT=$2; shift 2 ;;
    --sanitizer-budget) SAN_BUDGET=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_device.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for n in "$SAN_TIMEOUT" "$SAN_BUDGET" "$ARCH"; do
  case "$n" in ''|*[!0-9]*) echo "run_device.sh: '$n' is not a whole number" >&2; exit 2 ;; esac
done
for t in ${SAN_TOOLS//,/ }; do
  case "$t" in memcheck|racecheck|synccheck|initcheck) ;;
    *) echo "run_device.sh: --sanitizer-tools: unknown tool '$t'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUTDIR"
cd "$ROOT"
LOGS=$B/logs # build.log, ctest.log, run.log; packed into OUTDIR at the end
mkdir -p "$LOGS"

. tests/gpu/devdeps.sh

# The GPU test binaries, the ones most worth a sanitizer's minutes first:
# every op, exact self-extend, the quantized mat-vec and the GEMM, then the
# whole-model and pipeline runs (slow under a sanitizer).
GPU_TESTS=(test_cuda_ops test_cuda_selfextend test_cuda_matvec_q8 test_cuda_matmul_tc
  test_cuda_sample test_cuda_graph test_cuda_decode test_forward_cuda test_forward_cuda_arch
  test_pipeline_cuda)
for f in tests/gpu/test_*.c; do # a new test file is run too, last
  n=$(basename "$f" .c)
  [[ " ${GPU_TESTS[*]} " == *" $n "* ]] || GPU_TESTS+=("$n")
done
GPU_RE="^($(IFS='|'; echo "${GPU_TESTS[*]}"))\$"

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [ "$SAN_ONLY" = 1 ] && [ -f "$B/ctest.log" ]; then
  build_rc=0
  ctest_rc=$(cat "$B/ctest.rc" 2>/dev/null || echo 1)
else
  targets=()
  [ "$GPU_ONLY" = 1 ] && targets=(--target "${GPU_TESTS[@]}" vela vela-bench-kernels)
  # Keep going past a failed target: one broken test binary leaves the others
  # (and vela) built and run; build_ok in the JSON says the build failed.
  keep=(-k); [ ${#gen[@]} -gt 0 ] && keep=(-k 0)
  if [ "$BUILD" = 1 ]; then
    {
      cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
        -DVELA_EMU=OFF && cmake --build "$B" -j "$(nproc)" "${targets[@]}" -- "${keep[@]}"
    } >"$LOGS/build.log" 2>&1
    build_rc=$?
  else
    [ -f "$B/CTestTestfile.cmake" ]; build_rc=$?
    echo "--no-build: $B as it is" >"$LOGS/build.log"
  fi
  echo "build rc=$build_rc" | tee -a "$LOGS/run.log"

  # ctest -j1 for the GPU binaries keeps them from fighting over the device,
  # --timeout 180 keeps a hung one from taking the device call's time;
  # -V keeps their Criterion lines ([SKIP], "Tested: ..."), which the counts
  # of gpu-tests.json come from (the other binaries' are not counted).
  if [ "$GPU_ONLY" = 1 ]; then
    (cd "$B" && echo "=== GPU tests ===" && ctest -V -j 1 --timeout 180 -R "$GPU_RE") \
      >"$LOGS/ctest.log" 2>&1
  else
    (cd "$B" && ctest --output-on-failure -j "$(nproc)" -E "$GPU_RE" &&
       echo "=== GPU tests ===" && ctest -V -j 1 --timeout 180 -R "$GPU_RE") >"$LOGS/ctest.log" 2>&1
  fi
  ctest_rc=$?
  [ $build_rc -eq 0 ] || ctest_rc=1
  cp "$LOGS/ctest.log" "$B/ctest.log" 2>/dev/null
  echo $ctest_rc >"$B/ctest.rc"
  echo $build_rc >"$B/build.rc"
fi
echo "ctest rc=$ctest_rc" | tee -a "$LOGS/run.log"

# compute-sanitizer: one run per (tool, binary), its log in $B/sanitizer/.
# The counts come from its summary line ("ERROR SUMMARY: N errors" /
# "RACECHECK SUMMARY: N hazards displayed"); a run killed by the timeout
# gets a TIMEOUT line and keeps what it printed.
SAN=$B/sanitizer
mkdir -p "$SAN"
CS=${VELA_SANITIZER:-compute-sanitizer} # another name: a stand-in, to test this script
if [ "$SANITIZE" = 1 ] && command -v "$CS" >/dev/null && [ $build_rc -eq 0 ]; then
  start=$SECONDS
  for tool in ${SAN_TOOLS//,/ }; do
    for n in "${GPU_TESTS[@]}"; do
      t=$B/tests/$n log=$SAN/$tool-$n.log
      [ -x "$t" ] || continue
      [ -f "$log" ] && continue # done by an earlier call
      # A device the sanitizer refuses (gVisor: "Device not supported")
      # refuses every run: the first says so for all.
      grep -qs "Device not supported" "$SAN"/*.log && break 2
      limit=$SAN_TIMEOUT
      if [ "$SAN_BUDGET" -gt 0 ]; then
        left=$((SAN_BUDGET - (SECONDS - start)))
        [ $left -lt 10 ] && continue # listed as not run
        [ $left -lt $limit ] && limit=$left
      fi
      echo "sanitizer: $tool $n (at most ${limit}s)" | tee -a "$LOGS/run.log"
      timeout "$limit" "$CS" --tool "$tool" --target-processes all "$t" --jobs 1 \
        >"$log.part" 2>&1
      [ $? -eq 124 ] && echo "TIMEOUT after $limit s" >>"$log.part"
      mv "$log.part" "$log"
    done
  done
fi

python3 - "$OUTDIR" "$SAN" "$B" "${GPU_TESTS[@]}" <<'PY'
import datetime, json, os, re, subprocess, sys
out, san, build, tests = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ctest = f"{build}/ctest.log"
log = open(ctest, errors="replace").read() if os.path.exists(ctest) else ""
log = log.split("=== GPU tests ===", 1)[1] if "=== GPU tests ===" in log else ""
# Criterion's per-binary synthesis lines carry the counts of test cases.
passed = failed = 0
for m in re.finditer(r"Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)", log):
    passed += int(m.group(2)); failed += int(m.group(3)) + int(m.group(4))
skipped = len(re.findall(r"\[SKIP\]", log))

def sh(cmd):
    try: return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception: return ""

# Per tool: the summed count over the binaries it ran on (None: ran on none),
# and which binaries were cut short, not run, or refused by the device.
counts, runs = {}, {}
for tool in ("memcheck", "racecheck", "synccheck", "initcheck"):
    total, done, timeouts, not_run, unsupported = 0, [], [], [], []
    for t in tests:
        p = f"{san}/{tool}-{t}.log"
        if not os.path.exists(p):
            not_run.append(t); continue
        text = open(p, errors="replace").read()
        done.append(t)
        if "TIMEOUT after" in text: timeouts.append(t)
        if "Device not supported" in text: unsupported.append(t)
        n = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: (\d+)", text)
        total += int(n[-1]) if n else 0
    counts[tool] = total if done and len(unsupported) < len(done) else None
    runs[tool] = {"ran": done, "timeouts": timeouts, "not_run": not_run, "unsupported": unsupported}

smi = sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader").splitlines()
name, driver = (smi[0].split(", ") + ["", ""])[:2] if smi else ("", "")
res = {
    # The device gets a copy of the tree without .git: pass VELA_COMMIT.
    "commit": os.environ.get("VELA_COMMIT") or sh("git rev-parse HEAD") or "unknown",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "device": name, "driver": driver,
    "cuda": sh("nvcc --version | grep -Eo 'release [0-9.]+' | cut -d' ' -f2"),
    # false: the build failed (build.log); the counts are of the binaries it made
    "build_ok": open(f"{build}/build.rc").read().strip() == "0"
                if os.path.exists(f"{build}/build.rc") else None,
    "passed": passed, "failed": failed, "skipped": skipped,
    "sanitizer": counts,
    # ran / timeouts (counts partial) / not_run (no budget left) / unsupported
    "sanitizer_runs": runs,
}
json.dump(res, open(f"{out}/gpu-tests.json", "w"), indent=1)
print(json.dumps({k: res[k] for k in ("device", "build_ok", "passed", "failed", "skipped",
                                      "sanitizer")}))
PY
tar -czf "$OUTDIR/gpu-tests-logs.tar.gz" -C "$B" logs sanitizer 2>/dev/null
[ $build_rc -eq 0 ] && [ "$ctest_rc" -eq 0 ]
