#!/usr/bin/env bash
# The performance model's CI gate (bench/README.md, "Performance model"):
#   bench/kernels/perf_gate.sh BENCH_EMU BUILD_DIR [gate|selfcheck]
# gate: runs the emulated bench at the ci-small shapes (tests/emu), reads the
# sm_90 machine code of BUILD_DIR's vela_cuda objects and fails when a decode
# case's predicted fraction of bandwidth falls more than 5% below
# bench/results/kernels-predicted-ci.json. selfcheck: the same traffic with
# every global load of the machine code waited on at once; the gate must fail.
# cuobjdump comes from the pinned PyPI package in a venv under BUILD_DIR
# (this toolkit ships none); exit 77 (ctest: skipped) when it cannot be had.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench="$1"
build="$2"
mode="${3:-gate}"
work="$build/perf-model"
mkdir -p "$work"
pin="nvidia-cuda-cuobjdump==13.2.86"
venv="$work/venv"
if ! command -v cuobjdump >/dev/null && [ ! -x /usr/local/cuda/bin/cuobjdump ]; then
  if ! "$venv/bin/python" -c "import nvidia" 2>/dev/null; then
    python3 -m venv "$venv" || { echo "SKIP: python3 -m venv failed"; exit 77; }
    "$venv/bin/pip" install -q --disable-pip-version-check "$pin" >"$work/pip.log" 2>&1 ||
      { echo "SKIP: cannot install $pin (see $work/pip.log)"; exit 77; }
  fi
  py="$venv/bin/python"
else
  py=python3
fi
model=("$py" "$here/perf_model.py" --build "$build")
traffic="$work/traffic-ci.jsonl"
case "$mode" in
  gate)
    "${model[@]}" record --ci --bench "$bench" --dir "$work" >/dev/null
    "${model[@]}" gate --traffic "$traffic"
    ;;
  selfcheck)
    [ -s "$traffic" ] || "${model[@]}" record --ci --bench "$bench" --dir "$work" >/dev/null
    "${model[@]}" gate --traffic "$traffic" --doctor --expect-fail 0.5
    ;;
  *) echo "usage: $0 BENCH_EMU BUILD_DIR [gate|selfcheck]" >&2; exit 2 ;;
esac
