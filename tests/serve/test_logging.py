"""The log of `vela serve`: --log-file, --log-format text|json, -v, the
access log and libmicrohttpd's messages (tools/serve/log.h).

Servers of their own on a synthetic model. With --log-file and --log-format
json every line of the file is one JSON object, each request has one
access line (method, path, status, client, tokens in and out, ms), and
nothing reaches stderr; a second server on the same port reports the bind
failure in vela's words, with libmicrohttpd's message as a debug line of the
log (-v) and never on its own on the terminal (before: "Failed to bind to
port N: Address already in use" printed by libmicrohttpd itself); text lines
on stderr by default; --no-access-log leaves out the access lines.
(tests/serve/run.sh sets VELA_BIN and VELA_SERVE_WORK.)
"""
import json
import os
import re
import subprocess

from serve_helpers import VELA, WORK, request, stop, tiny_model, wait_ready

def serve_args(port="0"):
    return [VELA, "serve", "-m", tiny_model(512), "--backend", "cpu", "-t", "1", "--port", port,
            "--no-progress", "-np", "2", "-c", "1024"]


def test_json_log_file_access_lines_and_libmicrohttpd():
    log_path = os.path.join(WORK, "log-json.jsonl")
    err_path = os.path.join(WORK, "log-json.stderr")
    for f in (log_path, err_path):
        if os.path.exists(f):
            os.unlink(f)
    err = open(err_path, "w")
    p = subprocess.Popen(serve_args() + ["--log-file", log_path, "--log-format", "json", "-v"],
                         stdout=err, stderr=subprocess.STDOUT)
    try:
        port = wait_ready(p, log_path)
        st, _ = request(port, "POST", "/v1/completions",
                        {"prompt": "hi", "max_tokens": 4, "ignore_eos": True})
        assert st == 200
        st, body = request(port, "POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                            "ignore_eos": True, "stream": True})
        assert st == 200 and body.rstrip().endswith(b"data: [DONE]")
        assert request(port, "GET", "/nope")[0] == 404
        # A second server on the same port: vela's error, libmicrohttpd's message
        # only as a debug line of its log.
        log2 = os.path.join(WORK, "log-bind.jsonl")
        if os.path.exists(log2):
            os.unlink(log2)
        second = subprocess.run(serve_args(str(port)) + ["--log-file", log2, "--log-format",
                                                         "json", "-v"],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert second.stderr == "", second.stderr
        lines2 = [json.loads(l) for l in open(log2).read().splitlines()]
        assert any(l["level"] == "error" and l["msg"].startswith(
            "cannot listen on 127.0.0.1:%d: " % port) for l in lines2), lines2
        assert any(l["level"] == "debug" and l["msg"].startswith("libmicrohttpd: ")
                   for l in lines2), lines2
    finally:
        stop(p)
    assert open(err_path).read() == "", "nothing on stderr with --log-file"
    lines = [json.loads(l) for l in open(log_path).read().splitlines()]
    assert all({"ts", "level"} <= set(l) for l in lines), lines
    access = [l for l in lines if l.get("event") == "access"]
    # A stream's line is written once MHD has sent its end, which may come
    # after the client's next request: by path, not in order.
    by_path = {a["path"]: a for a in access}
    assert len(access) == 3 and set(by_path) == {"/v1/completions", "/v1/chat/completions",
                                                 "/nope"}, access
    assert [(by_path[p]["method"], by_path[p]["status"]) for p in sorted(by_path)] == [
        ("GET", 404), ("POST", 200), ("POST", 200)], access
    assert by_path["/v1/completions"]["tokens_in"] > 0, access
    assert by_path["/v1/completions"]["tokens_out"] == 4, access
    assert by_path["/v1/chat/completions"]["tokens_out"] == 3, access
    assert "tokens_in" not in by_path["/nope"], access
    assert all(a["remote"] == "127.0.0.1" and a["ms"] >= 0 for a in access), access


def test_text_log_on_stderr_and_no_access_log():
    for extra, want_access in (([], True), (["--no-access-log"], False)):
        log_path = os.path.join(WORK, "log-text.log")
        log = open(log_path, "w")
        p = subprocess.Popen(serve_args() + extra, stdout=log, stderr=subprocess.STDOUT)
        try:
            port = wait_ready(p, log_path)
            st, _ = request(port, "POST", "/v1/completions",
                            {"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
            assert st == 200
        finally:
            stop(p)
        text = open(log_path).read()
        got = re.findall(r"^vela serve: access: POST /v1/completions 200 127\.0\.0\.1 in \d+ "
                         r"out 2 [0-9.]+ ms$", text, re.M)
        assert len(got) == (1 if want_access else 0), text
        assert ("access:" in text) == want_access, text
