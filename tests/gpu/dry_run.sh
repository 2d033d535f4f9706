#!/usr/bin/env bash
# The GPU session's two scripts, kept working without a GPU (issue #15):
# both parse, run_device.sh prints its usage, and bench/run_gpu.sh runs its
# models, vela, kernels and summary stages with the CPU backend on a tiny
# synthetic model and writes a SUMMARY.json with the fields a GPU run fills.
#   tests/gpu/dry_run.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work="$build/gpu-dry-run"
rm -rf "$work"
bash -n "$root/tests/gpu/run_device.sh"
bash -n "$root/bench/run_gpu.sh"
bash "$root/tests/gpu/run_device.sh" --help | grep -q "gpu-tests.json"
BACKEND=cpu VELA_BENCH_BUILD="$build" VELA_BENCH_WORK="$work" N_PROMPT=16 N_GEN=4 \
  PARALLEL=1,2 PARALLEL_MODEL=tiny \
  bash "$root/bench/run_gpu.sh" --models "tiny:--preset tiny" --reps 1 models vela kernels summary
python3 - "$work/out/SUMMARY.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("commit", "date", "device", "llamacpp_commit", "rows"):
    assert k in d, "SUMMARY.json has no '%s'" % k
tests = {r["test"] for r in d["rows"]}
assert {"pp16", "tg4", "tg4 x2"} <= tests, tests
for r in d["rows"]:
    assert set(r) >= {"model", "test", "vela_tps", "llamacpp_tps", "ratio", "bw_frac"}, r
    assert r["vela_tps"] and r["vela_tps"] > 0, r
print("dry run: %d rows" % len(d["rows"]))
PY
