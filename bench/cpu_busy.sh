#!/usr/bin/env bash
# bench/cpu_busy.sh: CPU speed on a machine that is not idle. A server or a
# laptop rarely has its cores to itself; a thread pool that waits for every
# thread at every step then runs at the pace of the one the scheduler put
# aside. This runs `vela bench` (and llama-bench, when given) idle and beside
# busy loops that compete for the same cores, and prints one JSON object.
#
# usage: bench/cpu_busy.sh -m MODEL [--vela BIN]... [--llama-bench BIN]
#                          [--loads "1:0 2:5"] [-p N] [-n N] [-r N] [-t N]
#   --vela BIN         a vela binary to measure (repeatable: e.g. an older
#                      build beside the current one; default build/vela)
#   --llama-bench BIN  llama.cpp's llama-bench, same model, same loads
#                      (its own build_commit may name the repository it was
#                      built inside: say which llama.cpp it is in a note)
#   --loads LIST       competing load per row, COUNT:NICE, space separated
#                      ("0:0" is idle, always measured first; default
#                      "1:0 2:5": one busy loop at the same priority, then
#                      two at nice 5, as a background compile)
#   -p, -n, -r, -t     prompt and generated tokens, repetitions, threads
#                      (128, 64, 3, all cores)
# Each row is measured with the loads started 1 s before and stopped after.
set -euo pipefail
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; }
repo=$(cd "$(dirname "$0")/.." && pwd)
MODEL="" VELAS=() LLAMA="" LOADS="1:0 2:5" P=128 N=64 R=3 T=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    -m) MODEL=$2; shift 2 ;;
    --vela) VELAS+=("$2"); shift 2 ;;
    --llama-bench) LLAMA=$2; shift 2 ;;
    --loads) LOADS=$2; shift 2 ;;
    -p) P=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    -r) R=$2; shift 2 ;;
    -t) T=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "cpu_busy.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$MODEL" ] || { echo "cpu_busy.sh: -m MODEL is required" >&2; usage >&2; exit 2; }
[ -r "$MODEL" ] || { echo "cpu_busy.sh: cannot read model '$MODEL'" >&2; exit 1; }
[ ${#VELAS[@]} -gt 0 ] || VELAS=("$repo/build/vela")
for v in "${VELAS[@]}" ${LLAMA:+"$LLAMA"}; do
  [ -x "$v" ] || { echo "cpu_busy.sh: '$v' is not an executable" >&2; exit 1; }
done
for l in $LOADS; do
  [[ "$l" =~ ^[0-9]+:-?[0-9]+$ ]] \
    || { echo "cpu_busy.sh: load '$l': expected COUNT:NICE, e.g. 2:5" >&2; exit 2; }
done

pids=()
stop_load() { [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }
trap stop_load EXIT
start_load() { # COUNT NICE
  for _ in $(seq "$1"); do nice -n "$2" sh -c 'while :; do :; done' & pids+=($!); done
  sleep 1
}

# One tool's pp and tg rows as JSON lines {"tool","test","tps","sd"}.
run_vela() {
  "$1" bench -m "$MODEL" -p "$P" -n "$N" -r "$R" -t "$T" --json 2>/dev/null | python3 -c '
import json, sys
for r in json.load(sys.stdin)["tests"]:
    print(json.dumps({"tool": sys.argv[1], "test": r["test"], "tps": round(r["avg_ts"], 2),
                      "sd": round(r["stddev_ts"], 2)}))
' "vela $("$1" --version | cut -d" " -f2)"
}
run_llama() {
  "$LLAMA" -m "$MODEL" -p "$P" -n "$N" -r "$R" -t "$T" -o json 2>/dev/null | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    t = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print(json.dumps({"tool": "llama.cpp", "test": t, "tps": round(r["avg_ts"], 2),
                      "sd": round(r["stddev_ts"], 2)}))
'
}

rows=$(mktemp)
for l in 0:0 $LOADS; do
  c=${l%%:*} ni=${l##*:}
  start_load "$c" "$ni"
  for v in "${VELAS[@]}"; do
    run_vela "$v" | sed "s/^{/{\"busy_loops\": $c, \"nice\": $ni, /" >>"$rows" \
      || echo "cpu_busy.sh: $v failed under load $l" >&2
  done
  if [ -n "$LLAMA" ]; then
    run_llama | sed "s/^{/{\"busy_loops\": $c, \"nice\": $ni, /" >>"$rows" \
      || echo "cpu_busy.sh: llama-bench failed under load $l" >&2
  fi
  stop_load
  echo "cpu_busy.sh: load $c busy loop(s) at nice $ni done" >&2
done
python3 - "$rows" "$MODEL" "$T" <<'EOF'
import json, os, platform, sys, time
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           platform.processor())
print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "device": "%s, %d cores" % (cpu, os.cpu_count()),
                  "model": os.path.basename(sys.argv[2]), "threads": int(sys.argv[3]),
                  "rows": rows}, indent=1))
EOF
rm -f "$rows"
