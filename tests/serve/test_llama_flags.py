"""llama-server's habits in `vela serve`: a pasted llama-server command line
runs (-ngl, -fa, --jinja, --no-mmap, --mlock, --metrics, -cb, --no-webui are
taken; --no-webui: / is 404), the server's sampling flags (--temp, --top-k, --top-p, --min-p,
-n) are the defaults of requests that leave those fields out, any model name
is answered by the served model unless --strict-model-name, and the model id
is the file's name without ".gguf" unless --alias; without -c each slot gets
the model's trained context (capped by memory), and a line says so.

Servers of their own on a synthetic model (tests/serve/run.sh sets VELA_BIN
and VELA_SERVE_WORK).
"""
import json
import os
import subprocess
import time

from serve_helpers import VELA, WORK, stop, tiny_model, wait_ready
from serve_helpers import request as raw_request


def start(name, extra, ctx=("-c", "1024")):
    log_path = os.path.join(WORK, name + ".log")
    log = open(log_path, "w")
    p = subprocess.Popen([VELA, "serve", "-m", tiny_model(512), "-t", "1", "--port", "0",
                          "--no-progress", "-np", "2"] + list(ctx) + extra,
                         stdout=log, stderr=subprocess.STDOUT)
    return p, wait_ready(p, log_path), log_path


def request(port, method, path, body=None):
    status, data = raw_request(port, method, path, body)
    return status, json.loads(data)


def test_llama_server_command_line_and_server_sampling_defaults():
    p, port, log_path = start("llama-flags", [
        "-ngl", "0", "-fa", "on", "--jinja", "--no-mmap", "--mlock", "--metrics", "-cb",
        "--no-webui", "--temp", "0", "--top-k", "1", "-n", "5", "--slots"])
    try:
        log = open(log_path).read()
        assert "backend cpu" in log, "-ngl 0: the CPU backend"
        assert "temperature 0, top_k 1" in log and "n_predict 5" in log
        assert raw_request(port, "GET", "/")[0] == 404, "--no-webui: no page at /"
        st, models = request(port, "GET", "/v1/models")
        assert st == 200 and models["data"][0]["id"] == "tiny-ctx512", "no .gguf in the id"
        body = {"model": "gpt-3.5-turbo", "prompt": "hello there", "ignore_eos": True,
                "seed": -1}
        st, a = request(port, "POST", "/v1/completions", body)
        assert st == 200, a
        assert a["model"] == "tiny-ctx512", "any name: the served model answers"
        assert a["usage"]["completion_tokens"] == 5, "-n: the default of max_tokens"
        # --temp 0 is the default: random seeds give the same greedy text
        st, b = request(port, "POST", "/v1/completions", body)
        assert st == 200 and b["choices"][0]["text"] == a["choices"][0]["text"]
        st, c = request(port, "POST", "/v1/completions", dict(body, max_tokens=50))
        assert st == 200 and c["usage"]["completion_tokens"] == 5, "-n caps max_tokens"
        # --slots: it answers. A slot's state is the engine's after its last
        # step, which ends just after the answer went out: idle within a moment.
        for _ in range(100):
            st, slots = request(port, "GET", "/slots")
            assert st == 200 and [x["id"] for x in slots] == [0, 1], slots
            if not any(x["is_processing"] for x in slots):
                break
            time.sleep(0.05)
        assert all(x["n_ctx"] == 512 and x["is_processing"] is False for x in slots), slots
    finally:
        stop(p)


def test_llama_server_defaults_and_context_without_c():
    p, port, log_path = start("llama-defaults", ["--backend", "cpu"], ctx=())
    try:
        log = open(log_path).read()
        assert "temperature 0.8, top_k 40, top_p 0.95, min_p 0.05" in log, log
        # the model is trained for 512 tokens: each of the 2 slots gets them all
        assert "context: -c 1024, 2 slots of 512 tokens" in log, log
        st, models = request(port, "GET", "/v1/models")
        assert models["data"][0]["meta"]["n_ctx_slot"] == 512
    finally:
        stop(p)


def test_strict_model_name_and_alias():
    p, port, _ = start("strict-name", ["--backend", "cpu", "--strict-model-name"])
    try:
        body = {"prompt": "x", "max_tokens": 1}
        st, e = request(port, "POST", "/v1/completions", dict(body, model="gpt-3.5-turbo"))
        assert st == 404 and e["error"]["code"] == "model_not_found"
        assert request(port, "POST", "/v1/completions", dict(body, model="tiny-ctx512"))[0] == 200
    finally:
        stop(p)
    p, port, _ = start("alias", ["--backend", "cpu", "--strict-model-name", "--alias", "my-model"])
    try:
        st, models = request(port, "GET", "/v1/models")
        assert models["data"][0]["id"] == "my-model"
        assert request(port, "POST", "/v1/completions", dict(body, model="my-model"))[0] == 200
        assert request(port, "POST", "/v1/completions", dict(body, model="tiny-ctx512"))[0] == 404
    finally:
        stop(p)


def test_bad_server_flag_values_are_usage_errors():
    for args in (["-ngl", "x"], ["-n", "-5"], ["--temp", "hot"], ["--repeat-penalty", "0"]):
        r = subprocess.run([VELA, "serve", "-m", tiny_model(512), "--port", "0"] + args,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert args[0] in r.stderr, (args, r.stderr)
