#!/usr/bin/env bash
# End-to-end tests of `vela serve` with the official openai Python client and
# pytest, installed into a virtual environment under the build folder (once).
#   tests/serve/run.sh VELA_BINARY BUILD_DIR
# Starts the server on a synthetic model (random weights: the text is
# gibberish, which is all these tests need) on a free loopback port, runs
# tests/serve/test_openai.py against it and stops it; test_selfextend.py,
# test_shutdown.py, test_logging.py and test_llama_flags.py start and stop
# servers of their own. Exit 77 (ctest: skipped) when the Python packages
# cannot be installed (no registry reachable).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vela="$1"
work="$2/serve-e2e"
mkdir -p "$work"
venv="$work/venv"
if [ ! -x "$venv/bin/pytest" ] || ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  python3 -m venv "$venv" || { echo "SKIP: python3 -m venv failed"; exit 77; }
  "$venv/bin/pip" install -q --disable-pip-version-check "openai>=1.0" pytest >"$work/pip.log" 2>&1 ||
    { echo "SKIP: cannot install openai and pytest (see $work/pip.log)"; exit 77; }
fi
model="$work/tiny.gguf"
[ -f "$model" ] || "$vela" mkmodel -q --preset tiny --ctx 512 -o "$model"
log="$work/server.log"
"$vela" serve -m "$model" --backend cpu -t 2 --port 0 -np 4 -c 1024 --api-key test-key \
  --max-body 1048576 --no-progress >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log" | head -1)
  if [ -n "$port" ] && grep -q "ready:" "$log"; then break; fi
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "the server did not start"; cat "$log"; exit 1; }
export VELA_SERVE_URL="http://127.0.0.1:$port" VELA_SERVE_KEY=test-key VELA_SERVE_MODEL=tiny
# test_selfextend.py, test_shutdown.py and test_logging.py start servers of their own
export VELA_BIN="$vela" VELA_SERVE_WORK="$work"
status=0
"$venv/bin/pytest" -q -p no:cacheprovider "$here/test_openai.py" "$here/test_selfextend.py" \
  "$here/test_shutdown.py" "$here/test_logging.py" "$here/test_llama_flags.py" \
  "$here/test_tools.py" "$here/test_harmony.py" || status=$?
# SIGTERM ends the server cleanly: exit status 0.
kill -TERM $pid
wait $pid || { echo "the server did not stop cleanly"; cat "$log"; status=1; }
trap - EXIT
exit $status
