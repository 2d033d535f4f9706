#!/usr/bin/env bash
# The performance model's CI gate (bench/README.md, "Performance model"):
#   bench/kernels/perf_gate.sh BENCH_EMU BUILD_DIR [gate|selfcheck]
# gate: runs the emulated bench at the ci-small shapes (tests/emu), reads the
# sm_90 machine code of BUILD_DIR's vela_cuda objects and fails when a decode
# case's predicted fraction of bandwidth falls more than 5% below
# bench/results/kernels-predicted-ci.json. selfcheck: the same traffic with
# every global load of the machine code waited on at once; the gate must fail.
# cuobjdump and the nvdisasm it runs come from the pinned PyPI packages in a
# venv under BUILD_DIR when PATH and the toolkit lack them (this toolkit ships
# neither); exit 77 (ctest: skipped) when they cannot be had.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench="$1"
build="$2"
mode="${3:-gate}"
work="$build/perf-model"
mkdir -p "$work"
# cuobjdump -sass runs nvdisasm: both packages, one release
pins=(nvidia-cuda-cuobjdump==13.2.86 nvidia-cuda-nvdisasm==13.2.86)
venv="$work/venv"
if { command -v cuobjdump && command -v nvdisasm; } >/dev/null 2>&1 ||
  { [ -x /usr/local/cuda/bin/cuobjdump ] && [ -x /usr/local/cuda/bin/nvdisasm ]; }; then
  py=python3
else
  if ! ls "$venv"/lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm >/dev/null 2>&1; then
    python3 -m venv "$venv" || { echo "SKIP: python3 -m venv failed"; exit 77; }
    "$venv/bin/pip" install -q --disable-pip-version-check "${pins[@]}" >"$work/pip.log" 2>&1 ||
      { echo "SKIP: cannot install ${pins[*]} (see $work/pip.log)"; exit 77; }
  fi
  py="$venv/bin/python"
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
