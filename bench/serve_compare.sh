#!/usr/bin/env bash
# vela serve against llama.cpp's llama-server on one model, on this machine,
# with the same settings, in the same run. For each N in $PARALLEL, each
# server is started with N slots and N x $CTX_PER_SLOT cells of context,
# waited for (GET /health), loaded by bench/serve_load.py (the same prompts,
# arrivals and seeds for both) and stopped. Nothing is left running.
#
#   bench/serve_compare.sh [MODEL.gguf]    default: the cached SmolLM2-135M-Instruct
#
# Environment (defaults): VELA (build/vela), LLAMA_SERVER
# (../llama.cpp/build/bin/llama-server: bench/build_llama_server.sh builds it),
# PARALLEL ("1 4 8"), REQUESTS (48), RATE (2 requests/s, Poisson),
# MAX_TOKENS (64; every request generates them: ignore_eos), CTX_PER_SLOT
# (1024), THREADS (all cores), TAG (cpu-<model name>), SERVERS ("vela llama").
#
# Writes bench/results/serve-TAG/<server>-p<N>.json (serve_load.py's reports)
# and bench/results/serve-TAG.json: per N both servers' requests/s, output
# tokens/s, TTFT and ITL p50/p99, and the ratios the project targets
# (output tokens/s at the largest N >= 1.2x llama-server's; TTFT p50 no worse).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$(bash "$repo/tools/model_cache.sh")}
VELA=${VELA:-$repo/build/vela}
LLAMA_SERVER=${LLAMA_SERVER:-$(dirname "$repo")/llama.cpp/build/bin/llama-server}
PARALLEL=${PARALLEL:-"1 4 8"}
REQUESTS=${REQUESTS:-48}
RATE=${RATE:-2}
MAX_TOKENS=${MAX_TOKENS:-64}
CTX_PER_SLOT=${CTX_PER_SLOT:-1024}
THREADS=${THREADS:-$(nproc)}
SERVERS=${SERVERS:-"vela llama"}
name=$(basename "$model" .gguf | tr 'A-Z' 'a-z' | tr -c 'a-z0-9.\n-' '-')
TAG=${TAG:-cpu-$name}
out=$repo/bench/results/serve-$TAG
mkdir -p "$out"
port=$((18000 + RANDOM % 2000))

for s in $SERVERS; do
  case $s in
  vela) [ -x "$VELA" ] || { echo "serve_compare: no $VELA (build vela first)" >&2; exit 1; } ;;
  llama) [ -x "$LLAMA_SERVER" ] || {
    echo "serve_compare: no $LLAMA_SERVER: run bench/build_llama_server.sh (or set LLAMA_SERVER)" >&2
    exit 1
  } ;;
  *) echo "serve_compare: unknown server '$s' (vela, llama)" >&2; exit 2 ;;
  esac
done

pid=""
stop_server() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
}
trap stop_server EXIT

for n in $PARALLEL; do
  ctx=$((n * CTX_PER_SLOT))
  for s in $SERVERS; do
    port=$((port + 1))
    log=$out/$s-p$n.log
    if [ "$s" = vela ]; then
      "$VELA" serve -m "$model" --host 127.0.0.1 --port "$port" --parallel "$n" -c "$ctx" \
        -t "$THREADS" --no-progress >"$log" 2>&1 &
    else
      # --no-jinja: llama.cpp's built-in formatters, the ones vela follows, so
      # both servers see the same prompt tokens.
      "$LLAMA_SERVER" -m "$model" --host 127.0.0.1 --port "$port" -np "$n" -c "$ctx" \
        -t "$THREADS" --no-jinja >"$log" 2>&1 &
    fi
    pid=$!
    python3 "$repo/bench/serve_load.py" --url "http://127.0.0.1:$port" --label "$s-p$n" \
      --requests "$REQUESTS" --rate "$RATE" --max-tokens "$MAX_TOKENS" --ignore-eos \
      --out "$out/$s-p$n.json" || echo "serve_compare: $s -p $n had failed requests (see the JSON)" >&2
    stop_server
  done
done

python3 - "$out" "$repo/bench/results/serve-$TAG.json" "$model" "$PARALLEL" "$SERVERS" <<'EOF'
import json, os, sys, time
out, dest, model, pars, servers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
rows = []
for n in pars:
    row = {"parallel": int(n)}
    for s in servers:
        p = os.path.join(out, "%s-p%s.json" % (s, n))
        if os.path.exists(p):
            r = json.load(open(p))["results"]
            row[s] = {k: r[k] for k in ("completed", "errors", "requests_per_s", "output_tokens_per_s",
                                        "ttft_ms", "itl_ms", "latency_ms")}
    if "vela" in row and "llama" in row:
        v, l = row["vela"], row["llama"]
        row["vela_over_llama_output_tokens_per_s"] = (
            round(v["output_tokens_per_s"] / l["output_tokens_per_s"], 3) if l["output_tokens_per_s"] else None)
        row["vela_over_llama_ttft_p50"] = (
            round(v["ttft_ms"]["p50"] / l["ttft_ms"]["p50"], 3) if l["ttft_ms"]["p50"] else None)
    rows.append(row)
top = rows[-1] if rows else {}
summary = {
    "tool": "bench/serve_compare.sh",
    "model": os.path.basename(model),
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "rows": rows,
    "targets": {
        "output_tokens_per_s_ratio_at_max_parallel": top.get("vela_over_llama_output_tokens_per_s"),
        "output_tokens_per_s_ratio_goal": 1.2,
        "ttft_p50_ratio_at_max_parallel": top.get("vela_over_llama_ttft_p50"),
        "ttft_p50_ratio_goal": "<= 1.0",
    },
}
json.dump(summary, open(dest, "w"), indent=1)
print("parallel  server  req/s  out tok/s  TTFT p50/p99 ms  ITL p50/p99 ms")
for row in rows:
    for s in servers:
        if s in row:
            r = row[s]
            print("%8d  %-6s %6.2f  %9.2f  %7s/%-7s  %6s/%-6s" % (
                row["parallel"], s, r["requests_per_s"] or 0, r["output_tokens_per_s"] or 0,
                r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["itl_ms"]["p50"], r["itl_ms"]["p99"]))
print("wrote " + dest, file=sys.stderr)
EOF
