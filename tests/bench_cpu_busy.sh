#!/usr/bin/env bash
# bench/cpu_busy.sh end to end on a tiny synthetic model with one load row:
# its JSON must hold a pp and a tg row, with positive tokens/s, for idle and
# for one busy loop.
# usage: tests/bench_cpu_busy.sh VELA_BIN WORK_DIR
set -euo pipefail
vela=$1 work=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
m=$work/cpu-busy-tiny.gguf
trap 'rm -f "$m"' EXIT
"$vela" mkmodel --preset tiny -q -o "$m"
bash "$repo/bench/cpu_busy.sh" -m "$m" --vela "$vela" --loads 1:0 -p 8 -n 4 -r 1 -t 2 \
  | python3 -c '
import json, sys
rows = json.load(sys.stdin)["rows"]
got = sorted((r["busy_loops"], r["test"]) for r in rows)
want = [(0, "pp8"), (0, "tg4"), (1, "pp8"), (1, "tg4")]
bad = [r for r in rows if not r["tps"] > 0]
print(json.dumps(rows))
if got != want or bad:
    sys.exit("rows %s, expected %s; without positive tokens/s: %s" % (got, want, bad))
'
