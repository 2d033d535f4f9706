"""`vela serve` stopping on SIGTERM / SIGINT while requests run.

A server of its own (a synthetic model trained for 32768 tokens, so that a
request of 30000 tokens is still running when the signal comes) gets one
streamed and one non-streamed request; once both run, the server gets the
signal. The stream must end as a stream does: each choice's last chunk
with finish_reason "error" and an error object, then `data: [DONE]`, and the
chunked body properly closed (curl exit 18 before); the other request gets a
503 JSON error; the server exits 0 within one step plus the 5 s it allows
streams to drain (serve.h, SERVE_DRAIN_MS).
(tests/serve/run.sh sets VELA_BIN and VELA_SERVE_WORK.)
"""
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from serve_helpers import VELA, WORK, tiny_model, wait_ready

# A step plus SERVE_DRAIN_MS (5 s), with room for a loaded test machine.
EXIT_WITHIN_S = 15


def start(name):
    log_path = os.path.join(WORK, name + ".log")
    log = open(log_path, "w")
    p = subprocess.Popen([VELA, "serve", "-m", tiny_model(32768), "--backend", "cpu", "-t", "1",
                          "--port", "0", "--no-progress", "-np", "2", "-c", "65536"],
                         stdout=log, stderr=subprocess.STDOUT)
    return p, wait_ready(p, log_path), log_path


LONG = {"prompt": "hi", "max_tokens": 30000, "ignore_eos": True, "temperature": 1.0}


def running(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = re.search(r"^vela_requests_running (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def post(port, body, out):
    """A non-streamed completion in a thread: (status, json) into out."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out.append((r.status, json.loads(r.read())))
    c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_streams_and_requests_cleanly(sig):
    p, port, log = start("shutdown-%d" % sig)
    try:
        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        stream.request("POST", "/v1/completions", json.dumps(dict(LONG, stream=True)),
                       {"Content-Type": "application/json"})
        resp = stream.getresponse()
        assert resp.status == 200
        first = resp.readline()
        assert first.startswith(b"data: {"), first
        whole = []
        t = threading.Thread(target=post, args=(port, LONG, whole))
        t.start()
        for _ in range(200):  # both requests decoding (bounded: 20 s)
            if running(port) == 2:
                break
            time.sleep(0.1)
        assert running(port) == 2, open(log).read()
        t0 = time.monotonic()
        p.send_signal(sig)
        # The rest of the stream; an unterminated chunked body raises here.
        rest = resp.read().decode()
        stream.close()
        events = [e[len("data: "):] for e in rest.split("\n\n") if e.startswith("data: ")]
        assert events and events[-1] == "[DONE]", rest[-2000:]
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] == "error", last
        assert last["error"]["code"] == "shutting_down", last
        assert last["error"]["type"] == "unavailable_error", last
        t.join(timeout=EXIT_WITHIN_S)
        assert whole, "the non-streamed request got no answer"
        status, body = whole[0]
        assert status == 503, body
        assert body["error"]["code"] == "shutting_down", body
        assert p.wait(timeout=EXIT_WITHIN_S) == 0, open(log).read()
        assert time.monotonic() - t0 < EXIT_WITHIN_S
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
