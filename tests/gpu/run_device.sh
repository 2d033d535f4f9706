#!/usr/bin/env bash
# tests/gpu/run_device.sh: what a session with a lent GPU runs first, in one
# device call: build vela for one architecture, run the whole test suite (GPU
# tests included), run compute-sanitizer (memcheck, racecheck, synccheck) over
# the GPU test binaries, and write gpu-tests.json:
#   {"commit", "date", "device", "driver", "cuda", "passed", "failed", "skipped",
#    "sanitizer": {"memcheck": errors, "racecheck": hazards, "synccheck": errors}}
# plus the logs, into OUT (default: $OUT, the device tool's output folder).
#
# usage: VELA_COMMIT=<sha> tests/gpu/run_device.sh [--arch SM] [--out DIR] [--no-sanitizer]
#          [--sanitizer-only] [--sanitizer-timeout S]
# One device command may run 10 minutes: the build and the tests take a few;
# compute-sanitizer runs each binary under each tool for at most S seconds
# (default 150; a run cut short counts in "sanitizer_timeouts"). On a warm
# machine a second call with --sanitizer-only reuses the build and the ctest
# log and runs only the sanitizers. The emulator tests (tests/emu) are not
# built here: the real GPU runs the real thing.
# Needs: nvcc, cmake, a C compiler, python3; Criterion and cJSON either
# installed or carried as .deb files in .devdeps/ (../shared/device/README.md).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ARCH=90
OUTDIR=${OUT:-$ROOT/build-gpu-tests/out}
SANITIZE=1
SAN_ONLY=0
SAN_TIMEOUT=150
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    --no-sanitizer) SANITIZE=0; shift ;;
    --sanitizer-only) SAN_ONLY=1; shift ;;
    --sanitizer-timeout) SAN_TIMEOUT=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_device.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUTDIR"
cd "$ROOT"

if [ -d .devdeps ] && ls .devdeps/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/deps && for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
  L=/opt/deps/usr/lib/x86_64-linux-gnu
  export CMAKE_PREFIX_PATH=/opt/deps/usr PKG_CONFIG_PATH=$L/pkgconfig
  export LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-} LDFLAGS="-Wl,-rpath-link,$L"
  export CPATH=/opt/deps/usr/include:${CPATH:-} LIBRARY_PATH=$L:${LIBRARY_PATH:-}
fi
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH

B=build-gpu-tests
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [ "$SAN_ONLY" = 1 ] && [ -f "$B/ctest.log" ]; then
  build_rc=0
  cp "$B/ctest.log" "$OUTDIR/ctest.log"
  ctest_rc=$(cat "$B/ctest.rc" 2>/dev/null || echo 1)
else
  {
    cmake -S . -B $B "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
      -DVELA_EMU=OFF && cmake --build $B -j "$(nproc)"
  } >"$OUTDIR/build.log" 2>&1
  build_rc=$?
  echo "build rc=$build_rc" | tee -a "$OUTDIR/run.log"

  # ctest -j1 for the GPU binaries keeps them from fighting over the device;
  # -V keeps their Criterion lines ([SKIP], "Tested: ..."), which the counts
  # of gpu-tests.json come from (the other binaries' are not counted).
  (cd $B && ctest --output-on-failure -j "$(nproc)" -E '^test_(cuda|forward_cuda|pipeline_cuda)' &&
     echo "=== GPU tests ===" &&
     ctest -V -j 1 -R '^test_(cuda|forward_cuda|pipeline_cuda)') >"$OUTDIR/ctest.log" 2>&1
  ctest_rc=$?
  cp "$OUTDIR/ctest.log" "$B/ctest.log" 2>/dev/null
  echo $ctest_rc >"$B/ctest.rc"
fi
echo "ctest rc=$ctest_rc" | tee -a "$OUTDIR/run.log"

# compute-sanitizer over every GPU test binary; counts come from its summary
# line ("ERROR SUMMARY: N errors" / "RACECHECK SUMMARY: N hazards displayed").
declare -A san=([memcheck]=null [racecheck]=null [synccheck]=null)
san_timeouts=0
if [ "$SANITIZE" = 1 ] && command -v compute-sanitizer >/dev/null && [ $build_rc -eq 0 ]; then
  for tool in memcheck racecheck synccheck; do
    total=0
    for t in $B/tests/test_cuda_* $B/tests/test_forward_cuda $B/tests/test_pipeline_cuda; do
      [ -x "$t" ] || continue
      log="$OUTDIR/sanitizer-$tool-$(basename "$t").log"
      timeout "$SAN_TIMEOUT" compute-sanitizer --tool "$tool" "$t" --jobs 1 >"$log" 2>&1
      [ $? -eq 124 ] && san_timeouts=$((san_timeouts + 1)) && echo "TIMEOUT after $SAN_TIMEOUT s" >>"$log"
      n=$(grep -Eo '(ERROR|RACECHECK) SUMMARY: [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -n 1)
      total=$((total + ${n:-0}))
    done
    san[$tool]=$total
  done
fi

python3 - "$OUTDIR" "$B" "${san[memcheck]}" "${san[racecheck]}" "${san[synccheck]}" "$san_timeouts" <<'PY'
import json, re, subprocess, sys, datetime
out, build, mc, rc, sc, sto = sys.argv[1:7]
log = open(f"{out}/ctest.log", errors="replace").read()
log = log.split("=== GPU tests ===", 1)[1] if "=== GPU tests ===" in log else ""
# Criterion's per-binary synthesis lines carry the counts of test cases.
passed = failed = skipped = 0
for m in re.finditer(r"Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)", log):
    passed += int(m.group(2)); failed += int(m.group(3)) + int(m.group(4))
skipped = len(re.findall(r"\[SKIP\]", log))
def sh(cmd):
    try: return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception: return ""
smi = sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader").splitlines()
name, driver = (smi[0].split(", ") + ["", ""])[:2] if smi else ("", "")
cuda = sh("nvcc --version | grep -Eo 'release [0-9.]+' | cut -d' ' -f2")
num = lambda s: None if s == "null" else int(s)
res = {
    # The device gets a copy of the tree without .git: pass VELA_COMMIT.
    "commit": __import__("os").environ.get("VELA_COMMIT") or sh("git rev-parse HEAD") or "unknown",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "device": name, "driver": driver, "cuda": cuda,
    "passed": passed, "failed": failed, "skipped": skipped,
    "sanitizer": {"memcheck": num(mc), "racecheck": num(rc), "synccheck": num(sc)},
    # sanitizer runs cut short by --sanitizer-timeout: their counts are partial
    "sanitizer_timeouts": int(sto),
}
json.dump(res, open(f"{out}/gpu-tests.json", "w"), indent=1)
print(json.dumps(res))
PY
[ $build_rc -eq 0 ] && [ $ctest_rc -eq 0 ]
