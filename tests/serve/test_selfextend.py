"""Exact self-extend in `vela serve` (--self-extend G W), end to end.

Two servers of their own on a synthetic model trained for 128 tokens: one
plain (a slot of 128 cells), one with --self-extend 4 32 (the cache keeps K
without RoPE; each request may use (128 - 32) * 4 + 32 = 416 tokens, slots
of 600 cells). A prompt longer than the trained context is refused by the
plain server and answered by the other, with the tokens `vela run
--self-extend 4 32` gives; a request may choose its own self_extend, also
beside others with other values in the same batches, and on a server started
with --kv-unrotated only; the request fields are checked (grp_attn_n excludes
it, the extended context bounds the prompt and the answer); prompt caching
works under it, across requests with other values too; llama.cpp's
grp_attn_n / grp_attn_w still run per request on the plain server; a window
not below a slot's context is refused at startup.
(tests/serve/run.sh sets VELA_BIN and VELA_SERVE_WORK.)
"""
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
import urllib.error

import pytest

VELA = os.environ["VELA_BIN"]
WORK = os.environ["VELA_SERVE_WORK"]
N_CTX_TRAIN, G, W = 128, 4, 32
EXTENDED = (N_CTX_TRAIN - W) * G + W  # 416


def model_path():
    path = os.path.join(WORK, "tiny128.gguf")
    if not os.path.exists(path):
        subprocess.run([VELA, "mkmodel", "-q", "--preset", "tiny", "--ctx", str(N_CTX_TRAIN),
                        "-o", path], check=True)
    return path


def start(name, args):
    log_path = os.path.join(WORK, name + ".log")
    log = open(log_path, "w")
    p = subprocess.Popen([VELA, "serve", "-m", model_path(), "--backend", "cpu", "-t", "2",
                          "--port", "0", "--no-progress"] + args,
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        text = open(log_path).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m and "ready:" in text:
            return p, "http://127.0.0.1:" + m.group(1), log_path
        if p.poll() is not None:
            return p, None, log_path
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("the server did not start: " + open(log_path).read())


def stop(p):
    if p.poll() is None:
        p.terminate()
        assert p.wait(timeout=30) == 0, "the server did not stop cleanly"


@pytest.fixture(scope="module")
def plain():
    p, url, log = start("plain", ["-np", "1", "-c", str(N_CTX_TRAIN)])
    assert url, open(log).read()
    yield url
    stop(p)


@pytest.fixture(scope="module")
def extended():
    p, url, log = start("selfextend", ["-np", "2", "-c", "1200", "--self-extend", str(G), str(W)])
    assert url, open(log).read()
    assert "exact self-extend G 4, W 32: a request may use 416 tokens" in open(log).read()
    yield url
    stop(p)


@pytest.fixture(scope="module")
def unrotated():
    p, url, log = start("unrotated", ["-np", "2", "-c", "1200", "--kv-unrotated"])
    assert url, open(log).read()
    yield url
    stop(p)


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def n_tokens(url, text):
    status, js = post(url, "/tokenize", {"content": text, "add_special": True})
    assert status == 200
    return len(js["tokens"])


def text_of(url, n_min, n_max):
    """A prompt text of n_min .. n_max tokens (BOS included)."""
    words, text = 0, ""
    while True:
        words += 1
        t = text + (" " if text else "") + "w%d" % words
        n = n_tokens(url, t)
        if n > n_max:
            break
        text = t
        if n >= n_min:
            return text, n
    raise AssertionError("no prompt of %d..%d tokens" % (n_min, n_max))


def complete(url, prompt, **kw):
    body = {"prompt": prompt, "temperature": 0, "max_tokens": 8}
    body.update(kw)
    return post(url, "/v1/completions", body)


def test_long_prompt_answered_with_self_extend_and_refused_without(plain, extended):
    prompt, n = text_of(extended, 200, 230)
    assert N_CTX_TRAIN < n < EXTENDED - 4
    status, js = complete(plain, prompt)
    assert status == 400, js
    assert js["error"]["code"] == "context_length_exceeded"
    assert js["error"]["type"] == "invalid_request_error"
    assert str(n) in js["error"]["message"]
    status, js = complete(extended, prompt)
    assert status == 200, js
    assert js["usage"]["prompt_tokens"] == n
    assert js["choices"][0]["finish_reason"] == "length"
    assert js["usage"]["completion_tokens"] == 8
    text = js["choices"][0]["text"]
    # vela run with the same self-extend gives the same tokens (its output is
    # the prompt and then the answer)
    run = subprocess.run([VELA, "run", "-m", model_path(), "--backend", "cpu", "-t", "2",
                          "--self-extend", str(G), str(W), "-c", str(EXTENDED), "--temp", "0",
                          "-n", "8", "-p", prompt],
                         capture_output=True, check=True)
    out = run.stdout.decode("utf-8", errors="replace")
    assert out.startswith(prompt)
    assert out[len(prompt):].rstrip("\n") == text
    # the same values given in the request: the same answer
    status, same = complete(extended, prompt, self_extend={"n": G, "w": W})
    assert status == 200 and same["choices"][0]["text"] == text


def run_answer(prompt, g, w, n=8):
    """What `vela run --self-extend g w` answers to prompt (greedy, n tokens)."""
    ext = (N_CTX_TRAIN - w) * g + w
    run = subprocess.run([VELA, "run", "-m", model_path(), "--backend", "cpu", "-t", "2",
                          "--self-extend", str(g), str(w), "-c", str(ext), "--temp", "0",
                          "-n", str(n), "-p", prompt],
                         capture_output=True, check=True)
    out = run.stdout.decode("utf-8", errors="replace")
    assert out.startswith(prompt)
    return out[len(prompt):].rstrip("\n")


def test_self_extend_per_request_beside_other_values(extended, unrotated):
    # two requests at once in the server's two slots, so their tokens share
    # batches: one with its own values (2, 16: 240 tokens usable), one with
    # the server's (4, 32); each answers as vela run does with its values
    prompt, n = text_of(extended, 200, 230)
    assert N_CTX_TRAIN < n < (N_CTX_TRAIN - 16) * 2 + 16 - 8
    got = {}

    def ask(key, **kw):
        got[key] = complete(extended, prompt, cache_prompt=False, **kw)

    threads = [threading.Thread(target=ask, args=("own",), kwargs={"self_extend": {"n": 2, "w": 16}}),
               threading.Thread(target=ask, args=("server",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["own"][0] == 200 and got["server"][0] == 200, got
    own = got["own"][1]["choices"][0]["text"]
    assert own == run_answer(prompt, 2, 16)
    assert got["server"][1]["choices"][0]["text"] == run_answer(prompt, G, W)
    # a server started with --kv-unrotated only: the request's values
    status, js = complete(unrotated, prompt, self_extend={"n": 2, "w": 16})
    assert status == 200 and js["choices"][0]["text"] == own, js
    # n = 1 turns it off for the request: beyond the trained context then,
    # as a plain server with 600-cell slots would run it
    status, off = complete(extended, prompt, self_extend={"n": 1, "w": 1})
    status2, plain_js = complete(unrotated, prompt)
    assert status == status2 == 200
    assert off["choices"][0]["text"] == plain_js["choices"][0]["text"]


def test_prompt_cache_across_self_extend_values(extended):
    # cells kept from a (4, 32) request serve a (2, 16) one only below
    # position 16: the first 16 positions saw no far key under either rule
    prompt, n = text_of(extended, 180, 200)
    status, a = complete(extended, prompt)
    assert status == 200
    status, b = complete(extended, prompt, self_extend={"n": 2, "w": 16})
    status2, cold = complete(extended, prompt, self_extend={"n": 2, "w": 16},
                             cache_prompt=False)
    assert status == status2 == 200
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 16
    assert b["choices"][0]["text"] == cold["choices"][0]["text"]


def test_request_fields_checked_against_the_server(plain, extended):
    for bad in [{"n": 0, "w": W}, {"n": G, "w": 0}, {"n": G}, {"n": G, "w": W, "x": 1}]:
        status, js = complete(extended, "hello", self_extend=bad)
        assert status == 400 and "self_extend" in js["error"]["message"], (bad, js)
    status, js = complete(extended, "hello", grp_attn_n=2, grp_attn_w=16)
    assert status == 400 and "exclude each other" in js["error"]["message"]
    status, js = complete(plain, "hello", self_extend={"n": G, "w": W})
    assert status == 400 and "--self-extend" in js["error"]["message"]
    assert "--kv-unrotated" in js["error"]["message"]
    # a window not below the slot's 600 cells, or the trained context
    status, js = complete(extended, "hello", self_extend={"n": 2, "w": 600})
    assert status == 400 and "not below the slot's context" in js["error"]["message"], js
    status, js = complete(extended, "hello", self_extend={"n": 2, "w": N_CTX_TRAIN})
    assert status == 400 and "below the trained context" in js["error"]["message"], js
    # chat takes the same fields
    status, js = post(extended, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                       "self_extend": {"n": 3, "w": 600}})
    assert status == 400
    status, js = post(extended, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                       "self_extend": {"n": 3, "w": W}})
    assert status == 200, js
    status, models = 200, json.loads(urllib.request.urlopen(extended + "/v1/models").read())
    meta = models["data"][0]["meta"]
    assert meta["self_extend"] == {"n": G, "w": W, "n_ctx_extended": EXTENDED}
    assert meta["self_extend_per_request"] is True
    assert meta["n_ctx_slot"] == 600
    models = json.loads(urllib.request.urlopen(plain + "/v1/models").read())
    assert models["data"][0]["meta"]["self_extend_per_request"] is False


def test_extended_context_bounds_prompt_and_answer(extended):
    # a prompt the slot (600 cells) holds but the extended context (416) does not
    prompt, n = text_of(extended, EXTENDED - 3, EXTENDED + 40)
    status, js = complete(extended, prompt)
    assert status == 400, js
    assert js["error"]["code"] == "context_length_exceeded"
    msg = js["error"]["message"]
    assert str(n) in msg and str(EXTENDED) in msg and str(N_CTX_TRAIN) in msg, msg
    # a prompt that fits: the answer ends where the extended context does
    prompt, n = text_of(extended, EXTENDED - 30, EXTENDED - 10)
    status, js = complete(extended, prompt, max_tokens=100, ignore_eos=True)
    assert status == 200, js
    assert js["choices"][0]["finish_reason"] == "length"
    assert js["usage"]["completion_tokens"] == EXTENDED - n


def test_prompt_cache_under_self_extend(extended):
    prompt, n = text_of(extended, 180, 200)
    status, a = complete(extended, prompt)
    status2, b = complete(extended, prompt)
    status3, cold = complete(extended, prompt, cache_prompt=False)
    assert status == status2 == status3 == 200
    assert a["choices"][0]["text"] == b["choices"][0]["text"] == cold["choices"][0]["text"]
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
    assert b["timings"]["prompt_n"] == 1
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_llamacpp_self_extend_per_request_on_the_plain_server(plain):
    prompt, n = text_of(plain, 90, 100)
    status, js = complete(plain, prompt, grp_attn_n=2, grp_attn_w=32, max_tokens=20,
                          ignore_eos=True)
    assert status == 200, js
    assert js["usage"]["completion_tokens"] == 20
    status, js = complete(plain, prompt, grp_attn_n=3, grp_attn_w=32)
    assert status == 400, js  # w must be a multiple of n (llama.cpp's rule)


def test_window_not_below_the_slot_is_refused_at_startup():
    p, url, log = start("badwindow", ["-np", "4", "-c", "128", "--self-extend", str(G), str(W)])
    if url:
        stop(p)
    assert url is None
    assert p.wait(timeout=30) != 0
    assert "not below a slot's context of 32 cells" in open(log).read()
