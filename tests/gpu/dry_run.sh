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
  PARALLEL=1,2 PARALLEL_MODEL=tiny DEPTH=32 \
  bash "$root/bench/run_gpu.sh" --models "tiny:--preset tiny" --reps 1 models vela kernels summary
python3 - "$work/out/SUMMARY.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("commit", "date", "device", "llamacpp_commit", "rows"):
    assert k in d, "SUMMARY.json has no '%s'" % k
tests = {r["test"] for r in d["rows"]}
assert {"pp16", "tg4", "tg4 x2", "tg4 @ d32", "tg4@pdl", "tg4@stream4+pdl"} <= tests, tests
for r in d["rows"]:
    assert set(r) >= {"model", "test", "vela_tps", "llamacpp_tps", "ratio", "bw_frac"}, r
    assert r["vela_tps"] and r["vela_tps"] > 0, r
print("dry run: %d rows" % len(d["rows"]))
PY
! grep -q "merging the split plans failed" "$work/raw/run.log"

# A stand-in for Nsight Compute: ncu's CSV for three launches of two kernels
# (thousands separators and a scaled unit included) among the application's
# and ncu's own lines.
cat >"$work/fake-ncu" <<'SH'
#!/usr/bin/env bash
echo "==PROF== Connected to process 1 (vela)"
echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
for id in 0 2; do
  printf '"%s","1","vela","h","void matvec_q8_kernel<12, 1>(mvq_args)","1","7","(128, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","%s","%s","%s"\n' \
    $id dram__bytes_read.sum byte "9,437,184" $id dram__bytes_write.sum byte 16384 \
    $id gpu__time_duration.sum nsecond "4,096"
done
printf '"1","1","vela","h","void rms_norm_kernel(float *, const float *, int)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","%s","%s","%s"\n' \
  dram__bytes_read.sum Kbyte 32 dram__bytes_write.sum byte 0 gpu__time_duration.sum usecond 2
echo "| model | test | t/s |"
SH
chmod +x "$work/fake-ncu"
export VELA_NCU="$work/fake-ncu"

# The whole session, twice: the second call must find every step done.
bash "$root/tests/gpu/session.sh" --dry-run "$build" --work "$work/session" --budget 240
n_steps=$(wc -l <"$work/session/state/steps.tsv")
bash "$root/tests/gpu/session.sh" --dry-run "$build" --work "$work/session" --budget 240
python3 - "$work/session" "$n_steps" "$build" <<'PY'
import json, os, sys
w, n_steps, build = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = os.listdir(f"{w}/out")
assert len(out) <= 8, f"{len(out)} files in OUT: the device tool brings back 8"
kernels = os.path.exists(f"{build}/bench/vela-bench-kernels")  # a CUDA build
for f in ("SUMMARY.json", "SUMMARY.md", "gpu-tests.json", "session.json", "logs.tar.gz",
          "profile.json") + (("kernels.json", "kernels-attn-se.json") if kernels else ()):
    assert f in out, f"no {f} in OUT: {out}"
# profile.json from the stand-in's rows: two launches of 4.096 us and one of
# 2 us; 2 x (9437184 + 16384) bytes and 32 KB read.
p = json.load(open(f"{w}/out/profile.json"))
k = {r["kernel"]: r for r in p["kernels"]}
assert p["launches"] == 3 and list(k) == ["matvec_q8_kernel<12, 1>", "rms_norm_kernel"], p
mv = k["matvec_q8_kernel<12, 1>"]
assert mv["launches"] == 2 and abs(mv["us_total"] - 8.192) < 1e-9, mv
assert mv["dram_bytes"] == 2 * (9437184 + 16384) and abs(mv["time_frac"] - 8.192 / 10.192) < 1e-12, mv
assert abs(mv["gbs"] - mv["dram_bytes"] / 8.192e-6 / 1e9) < 1e-6, mv
assert k["rms_norm_kernel"]["dram_bytes"] == 32000, k["rms_norm_kernel"]
assert "Decode profile" in open(f"{w}/out/SUMMARY.md").read()
rows = json.load(open(f"{w}/out/SUMMARY.json"))["rows"]
got = {(r["model"], r["test"]) for r in rows}
want = {("tiny", "pp16"), ("tiny", "tg4"), ("tiny", "tg4@f32act"), ("tiny", "tg4 x2"),
        ("tiny-q8", "pp16"), ("tiny-q8", "tg4")}
assert want <= got, f"missing rows: {want - got}"
t = json.load(open(f"{w}/out/gpu-tests.json"))
gpu_tests = os.path.exists(f"{build}/tests/test_cuda_ops")  # not in a build without CUDA
assert t["build_ok"] is True and t["failed"] == 0 and (t["passed"] + t["skipped"] > 0) == gpu_tests, t
s = json.load(open(f"{w}/out/session.json"))
assert len(s["steps"]) == n_steps, f"the second call ran steps again: {s['steps'][n_steps:]}"
assert not os.listdir(f"{w}/bench/models"), "models left on disk"
print("session dry run: %d rows, %d steps, OUT: %s" % (len(rows), n_steps, " ".join(sorted(out))))
PY

# --run decide (issue #29's run 1): its time plan fits the default budget
# (and one too small is refused), and a dry run of it runs no GPU tests,
# sanitizers or profile and gives each model's variant rows.
bash "$root/tests/gpu/session.sh" --run decide --plan >"$work/plan.json"
! bash "$root/tests/gpu/session.sh" --run decide --plan --budget 300 >/dev/null
! bash "$root/tests/gpu/session.sh" --run decide --budget 300 --dry-run "$build" \
  --work "$work/decide-small" 2>"$work/decide-small.err"
grep -q "pick fewer --models" "$work/decide-small.err"
bash "$root/tests/gpu/session.sh" --run decide --dry-run "$build" --work "$work/decide"
python3 - "$work/plan.json" "$work/decide" "$build" <<'PY'
import json, os, sys
plan, w, build = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
assert plan["budget_s"] == 450 and plan["total_s"] <= plan["budget_s"], plan
assert sum(s for _, s in plan["steps"]) == plan["total_s"], plan
names = [n for n, _ in plan["steps"]]
assert names[0] == "build" and names[-2:] == ["kernels", "summary"] and len(names) == 7, names
s = json.load(open(f"{w}/out/session.json"))
assert s["run"] == "decide" and s["plan_s"] <= s["budget_s"], s
ran = [x["step"] for x in s["steps"]]
assert not [x for x in ran if x.startswith(("gpu-tests", "sanitizer", "profile"))], ran
if os.path.exists(f"{build}/bench/vela-bench-kernels"):
    assert "kernels" in ran, ran
got = {(r["model"], r["test"]) for r in json.load(open(f"{w}/out/SUMMARY.json"))["rows"]}
for m in ("tiny", "tiny-q8"):
    for t in ("tg4", "tg4@pdl", "tg4@stream4+pdl"):
        assert (m, t) in got, f"no {m} {t}: {sorted(got)}"
assert not [t for _, t in got if t.endswith("@f32act") or " x" in t], sorted(got)
print("session dry run, --run decide: plan %d of %d s, steps %s" % (plan["total_s"],
      plan["budget_s"], " ".join(ran)))
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

# --llama-pkg (bench/llamacpp_pkg.sh's layout). A prebuilt llama-bench that
# runs (a stand-in printing llama-bench's JSON rows) is used as it is, and its
# numbers reach SUMMARY.json; one that does not load falls back to the
# packed sources (here a tree whose CMake fails at once: the build is tried
# and the session goes on).
pkg=$work/pkg
mkdir -p "$pkg/ok/bin" "$pkg/bad/bin" "$pkg/src"
cat >"$pkg/ok/bin/llama-bench" <<'SH'
#!/usr/bin/env bash
[ "$1" = --help ] && { echo "usage: llama-bench [options]"; exit 0; }
p=0 n=0 d=0
while [ $# -gt 0 ]; do case $1 in -p) p=$2; shift ;; -n) n=$2; shift ;; -d) d=$2; shift ;; esac; shift; done
echo "[{\"n_prompt\": $p, \"n_gen\": 0, \"n_depth\": $d, \"avg_ts\": 1234.5}, {\"n_prompt\": 0, \"n_gen\": $n, \"n_depth\": $d, \"avg_ts\": $((56 + d)).5}]"
SH
printf '#!/bin/sh\necho "llama-bench: error while loading shared libraries: libggml.so.0" >&2\nexit 127\n' \
  >"$pkg/bad/bin/llama-bench"
chmod +x "$pkg/ok/bin/llama-bench" "$pkg/bad/bin/llama-bench"
echo 'message(FATAL_ERROR "not llama.cpp")' >"$pkg/src/CMakeLists.txt"
for k in ok bad; do
  mkdir -p "$pkg/$k.pkg"
  tar -C "$pkg/$k" -cJf "$pkg/$k.pkg/llama-bin.tar.xz" bin
  tar -C "$pkg/src" -cJf "$pkg/$k.pkg/llama-src.tar.xz" .
  echo "0c1e57098bba43ac29e6e3b677cdceebdd22334f" >"$pkg/$k.pkg/VELA_LLAMACPP_COMMIT"
  bash "$root/tests/gpu/session.sh" --dry-run "$build" --work "$pkg/w-$k" --models tiny \
    --budget 120 --llama-pkg "$pkg/$k.pkg" >"$pkg/$k.log" 2>&1
done
grep -q "prebuilt llama.cpp 0c1e570.* runs here" "$pkg/w-ok/logs/session.log"
python3 - "$pkg/w-ok/out/SUMMARY.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["llamacpp_commit"].startswith("0c1e570"), d["llamacpp_commit"]
got = {r["test"]: r["llamacpp_tps"] for r in d["rows"] if r["model"] == "tiny"}
# tg4 @ d32: the stand-in's depth row (56 + 32), not its depth-0 one
assert got.get("pp16") == 1234.5 and got.get("tg4") == 56.5 and got.get("tg4 @ d32") == 88.5, got
PY
grep -q "does not run here (llama-bench: error while loading" "$pkg/w-bad/logs/session.log"
[ -f "$pkg/w-bad/llama-pkg/src/CMakeLists.txt" ]
echo "session dry run: --llama-pkg uses binaries that run, else the packed sources"
