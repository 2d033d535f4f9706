#!/usr/bin/env bash
# The GPU session's scripts, kept working without a GPU (issue #15): they
# parse, run_device.sh prints its usage; bench/run_gpu.sh runs its models,
# vela, kernels and summary stages with the CPU backend on a tiny synthetic
# model and writes a SUMMARY.json with the fields a GPU run fills; and
# tests/gpu/session.sh --dry-run runs the whole session (GPU tests, which
# skip, two tiny models, kernels, summary) into at most 8 files, and a
# second call finds everything done.
#   tests/gpu/dry_run.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work="$build/gpu-dry-run"
rm -rf "$work"
bash -n "$root/tests/gpu/run_device.sh"
bash -n "$root/bench/run_gpu.sh"
bash -n "$root/tests/gpu/session.sh"
bash -n "$root/bench/llamacpp_src.sh"
bash "$root/tests/gpu/session.sh" --help | grep -q -- "--llama-src"
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

# The whole session, twice: the second call must find every step done.
bash "$root/tests/gpu/session.sh" --dry-run "$build" --work "$work/session" --budget 240
n_steps=$(wc -l <"$work/session/state/steps.tsv")
bash "$root/tests/gpu/session.sh" --dry-run "$build" --work "$work/session" --budget 240
python3 - "$work/session" "$n_steps" <<'PY'
import json, os, sys
w, n_steps = sys.argv[1], int(sys.argv[2])
out = os.listdir(f"{w}/out")
assert len(out) <= 8, f"{len(out)} files in OUT: the device tool brings back 8"
for f in ("SUMMARY.json", "SUMMARY.md", "gpu-tests.json", "session.json", "logs.tar.gz",
          "kernels.json", "kernels-attn-se.json"):
    assert f in out, f"no {f} in OUT: {out}"
rows = json.load(open(f"{w}/out/SUMMARY.json"))["rows"]
got = {(r["model"], r["test"]) for r in rows}
want = {("tiny", "pp16"), ("tiny", "tg4"), ("tiny", "tg4@f32act"), ("tiny", "tg4 x2"),
        ("tiny-q8", "pp16"), ("tiny-q8", "tg4")}
assert want <= got, f"missing rows: {want - got}"
t = json.load(open(f"{w}/out/gpu-tests.json"))
assert t["build_ok"] is True and t["failed"] == 0 and t["passed"] + t["skipped"] > 0, t
s = json.load(open(f"{w}/out/session.json"))
assert len(s["steps"]) == n_steps, f"the second call ran steps again: {s['steps'][n_steps:]}"
assert not os.listdir(f"{w}/bench/models"), "models left on disk"
print("session dry run: %d rows, %d steps, OUT: %s" % (len(rows), n_steps, " ".join(sorted(out))))
PY

# A build that failed from other sources is tried again: a third call, with
# a failed-build mark left from another tree, runs the GPU tests again.
echo "other sources" >"$work/session/state/test-build-failed.done"
rm -f "$work/session/state/gpu-tests.done"
bash "$root/tests/gpu/session.sh" --dry-run "$build" --work "$work/session" --budget 240
grep -q "sources changed since the failed build" "$work/session/logs/session.log"
[ "$(grep -c '^gpu-tests' "$work/session/state/steps.tsv")" = 2 ]
[ ! -f "$work/session/state/test-build-failed.done" ]
echo "session dry run: a failed build from other sources is built again"
