"""What the server tests that start servers of their own share: a synthetic
model and waiting for a server to be ready. (tests/serve/run.sh sets
VELA_BIN and VELA_SERVE_WORK.)"""
import http.client
import json
import os
import re
import subprocess
import time

VELA = os.environ["VELA_BIN"]
WORK = os.environ["VELA_SERVE_WORK"]


def tiny_model(n_ctx):
    """A tiny synthetic model trained for n_ctx tokens (written once)."""
    path = os.path.join(WORK, "tiny-ctx%d.gguf" % n_ctx)
    if not os.path.exists(path):
        subprocess.run([VELA, "mkmodel", "-q", "--preset", "tiny", "--ctx", str(n_ctx), "-o",
                        path], check=True)
    return path


def wait_ready(p, log_path):
    """The port of server p once its log says it is ready (bounded: 30 s)."""
    text = ""
    for _ in range(300):
        text = open(log_path).read() if os.path.exists(log_path) else ""
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m and "ready:" in text:
            return int(m.group(1))
        if p.poll() is not None:
            break
        time.sleep(0.1)
    if p.poll() is None:
        p.kill()
    raise RuntimeError("the server did not start: " + text)


def request(port, method, path, body=None):
    """One HTTP request to the server on port (body: sent as JSON); (status, bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def stop(p):
    """SIGTERM; the server must exit 0."""
    p.terminate()
    assert p.wait(timeout=30) == 0
