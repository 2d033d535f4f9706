#!/usr/bin/env python3
"""Soak and chaos test of `vela serve` (issue #31): bounded, loopback only.

    tests/serve/soak.py VELA_BINARY BUILD_DIR [--long] [--seed N] [--np 1,4,8]
                        [--model GGUF] [--actions N] [--seconds S]

A reference server (-np 1) answers each request of a seeded catalogue alone
(greedy, or sampled with a seed; fixed max_tokens). Then, for each -np N, a
server of its own takes a seeded random mix at random rates from N + 2
client threads: plain and streamed completions and chats, streams the client
drops after a few chunks (disconnects), plain requests it drops before the
answer (cancellations; half of the drops are resets), and hostile input
(invalid JSON, wrong types, huge and negative values, unknown roles, a body
over --max-body, a wrong key, truncated bodies and headers). A warm-up
quarter of the mix comes first, then the rest; then every slot is taken by a
stream that is dropped, so that the cells the prompt cache kept are freed;
then N + 1 streams and a plain request are open (one stream and the plain
request queued) when the server gets SIGTERM.

Invariants (each a check; a failure names the request and the seed):
- every completed answer (text and finish_reason of each choice; logprobs
  and completion tokens of plain answers) equals the same request alone:
  the CPU backend is batch-invariant, so any difference is a bug;
- every valid request gets exactly one answer: a 200, a stream ending in one
  final chunk per choice and one [DONE], ids never repeated; /metrics
  agrees: requests_total = ok + failed + cancelled, and the totals fit what
  the clients sent (a drop may come after the answer, a reset drop before
  the server read the request);
- every hostile input gets a 4xx (an error object when the server parsed
  the request; no answer, or a 4xx, for a truncated one), never a 5xx, a
  hang or a crash;
- no error outside the hostile ones: no valid request fails, the log has
  no error line and no 5xx access line before the SIGTERM;
- once idle: nothing running or queued, and KV cells in use 0 after the
  drops that free the kept cells;
- RSS flat after warm-up: at the end at most max(RSS_GROW_FRAC, RSS_GROW_MB)
  above the RSS after warm-up (both idle);
- SIGTERM: each open stream ends with a final chunk (finish_reason "error"
  and an error object shutting_down) and [DONE], the plain request gets
  503, and the server exits 0 within EXIT_WITHIN_S.

The seed fixes the catalogue and each client's actions and pauses (--seed
replays them; the threads interleave as the machine schedules them).
CI mode takes about a minute on a loaded 2-core machine (-np 1, 4, 8);
--long runs a longer mix for benches (and --model a real model, e.g. the
path `bash tools/model_cache.sh` prints). Exit 0: every check passed; 1: a
check failed; 77 (ctest: skipped): the binary cannot run. The last line:
`N passed, M failed` and the counts.
"""
import argparse
import collections
import http.client
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
KEY = "soak-key"
SLOT_CTX = 256          # cells per slot, the same at every -np (answers must not depend on it)
MAX_BODY = 65536        # --max-body: the oversized hostile body is just above it
# A step plus the server's 5 s drain (serve.h, SERVE_DRAIN_MS), with room for
# a loaded machine (test_shutdown.py allows the same).
EXIT_WITHIN_S = 15
# RSS after the soak, idle, against RSS after the warm-up, idle: growth
# within 10 % or 16 MiB (glibc may keep a few more arenas and free lists for
# the connection threads of a busier moment; a leak per request grows past
# it in the long mode).
RSS_GROW_FRAC = 0.10
RSS_GROW_MB = 16
IDLE_WITHIN_S = 30      # the server goes idle after the last request
HTTP_TIMEOUT_S = 120    # any one answer (bounded; a hang is a failure)

WORDS = ("the a of river stone quiet seven blue market engine winter lamp harbor "
         "silver road morning window paper cloud garden iron north letter clock "
         "forest bridge candle music orange thunder salt mirror 1 2 3 42 ; , . ?").split()


# --- checks and counts ------------------------------------------------------------

class Report:
    """Checks (passed / failed / expected failures) and counts, thread-safe."""

    def __init__(self, seed):
        self.seed = seed
        self.lock = threading.Lock()
        self.passed = 0
        self.failed = []
        self.xfailed = []
        self.counts = collections.Counter()
        self.log = None  # every failure, in full

    def check(self, ok, name, detail=""):
        with self.lock:
            if ok:
                self.passed += 1
                return True
            line = "%s: %s (seed %d)" % (name, detail, self.seed)
            self.failed.append(line)
            shown = sum(1 for f in self.failed if f.startswith(name + ":")) <= 5
        if shown:  # the first few of each kind; the summary counts them all
            print("FAIL " + line, flush=True)
        if self.log:
            with open(self.log, "a") as f:
                f.write("FAIL " + line + "\n")
        return False

    def xfail(self, name, detail):
        """A failure of a known bug (it does not fail the run)."""
        line = "%s: %s (seed %d)" % (name, detail, self.seed)
        with self.lock:
            self.xfailed.append(line)
            shown = len(self.xfailed) <= 3
        if shown:
            print("XFAIL " + line, flush=True)

    def count(self, what, n=1):
        with self.lock:
            self.counts[what] += n


# --- HTTP -------------------------------------------------------------------------

def headers(key=KEY):
    return {"Content-Type": "application/json", "Authorization": "Bearer " + key}


def call(port, method, path, body=None, timeout=HTTP_TIMEOUT_S):
    """(status, body bytes) of one request on its own connection."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request(method, path, body, headers())
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metrics(port):
    """/metrics' plain samples: {name: value}."""
    status, text = call(port, "GET", "/metrics", timeout=30)
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


def path_of(kind):
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def raw_head(method, path, n_body, key=KEY, extra=""):
    return ("%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n"
            % (method, path, HOST, key, n_body, extra)).encode()


def raw_open(port, data):
    """A connection that has sent data (bytes)."""
    s = socket.create_connection((HOST, port), timeout=HTTP_TIMEOUT_S)
    s.sendall(data)
    return s


def raw_close(s, reset):
    """Closes s: a reset (RST, SO_LINGER 0) or an orderly FIN."""
    if reset:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def raw_answer(s):
    """The whole answer on s until the server closes it (b"" when none)."""
    got = b""
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        got += b
    return got


def status_of(answer):
    """The status of a raw HTTP answer, 0 when there is none."""
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[1].isdigit() else 0


# --- answers ----------------------------------------------------------------------

def plain_answer(kind, obj):
    """What must equal the request alone: [(text, finish)] of each choice, the
    logprobs and the completion tokens."""
    chs = sorted(obj["choices"], key=lambda c: c["index"])
    texts = [(c["text"] if kind == "cmpl" else c["message"]["content"], c["finish_reason"])
             for c in chs]
    return texts, json.dumps([c.get("logprobs") for c in chs], sort_keys=True), \
        obj["usage"]["completion_tokens"]


def stream_call(port, kind, body):
    """(status, SSE events, the body of a refusal) of a streamed request."""
    c = http.client.HTTPConnection(HOST, port, timeout=HTTP_TIMEOUT_S)
    try:
        c.request("POST", path_of(kind), json.dumps(body), headers())
        r = c.getresponse()
        if r.status != 200:
            return r.status, [], r.read()
        return 200, read_events(r, time.monotonic() + HTTP_TIMEOUT_S), b""
    finally:
        c.close()


def read_events(resp, deadline):
    """The data of each SSE event of a streamed answer (to its end)."""
    events, data = [], []
    while time.monotonic() < deadline:
        line = resp.readline()
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if line.startswith("data: "):
            data.append(line[len("data: "):])
        elif not line and data:
            events.append("\n".join(data))
            data = []
    if data:
        events.append("\n".join(data))
    return events


def stream_answer(kind, events, n):
    """[(text, finish)] of n choices from a stream's events, the ids of its
    chunks and the error objects; raises ValueError where the stream breaks
    the protocol (no [DONE] last, anything after it, a choice without one
    final chunk or with text after it)."""
    if not events or events[-1] != "[DONE]" or events.count("[DONE]") != 1:
        raise ValueError("the stream does not end with one [DONE]: %r" % events[-3:])
    texts = [""] * n
    finish = [None] * n
    ids, errors = set(), []
    for e in events[:-1]:
        o = json.loads(e)
        ids.add(o.get("id"))
        if o.get("error"):
            errors.append(o["error"])
        for c in o.get("choices") or []:
            i = c["index"]
            if finish[i] is not None:
                raise ValueError("choice %d has a chunk after its final one: %r" % (i, e))
            part = c.get("text") if kind == "cmpl" else (c.get("delta") or {}).get("content")
            texts[i] += part or ""
            finish[i] = c.get("finish_reason")
    if None in finish:
        raise ValueError("a choice has no final chunk: %r" % finish)
    return list(zip(texts, finish)), ids, errors


# --- the catalogue ----------------------------------------------------------------

def words(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def catalogue(rng, n):
    """n distinct (kind, body) requests: completions and chats, greedy or
    sampled with a seed, some sharing a prompt prefix (the prompt cache), some
    with stop strings, n = 2, logprobs, ignore_eos or cache_prompt off."""
    out, bases = [], []
    while len(out) < n:
        if bases and rng.random() < 0.3:
            prompt = rng.choice(bases) + " " + words(rng, 1, 6)
        else:
            prompt = words(rng, 1, 24)
            bases.append(prompt)
        body = {"max_tokens": rng.randint(1, 32), "temperature": 0,
                "cache_prompt": rng.random() < 0.6}
        kind = "chat" if rng.random() < 0.3 else "cmpl"
        if kind == "chat":
            msgs = [{"role": "user", "content": prompt}]
            if rng.random() < 0.3:
                msgs.insert(0, {"role": "system", "content": words(rng, 1, 6)})
            body["messages"] = msgs
        else:
            body["prompt"] = prompt
            if rng.random() < 0.15:
                body["logprobs"] = rng.randint(0, 3)
        if rng.random() < 0.2:
            body.update(temperature=0.8, top_k=40, seed=rng.randrange(1 << 30))
        if rng.random() < 0.2:
            body["stop"] = [rng.choice(["e", " ", "th", "o", "\n"])]
        if rng.random() < 0.1:
            body["n"] = 2
        if rng.random() < 0.2:
            body["ignore_eos"] = True
        if (kind, json.dumps(body, sort_keys=True)) not in [(k, json.dumps(b, sort_keys=True))
                                                           for k, b in out]:
            out.append((kind, body))
    return out


def long_body(rng, stream, forever=False):
    """A request that runs a while (dropped by its client, or open at the
    SIGTERM). forever: n_keep 0 asks for context shifts, so it never ends by
    itself; cache_prompt off: its cells are freed when it ends."""
    body = {"prompt": words(rng, 2, 12), "temperature": 0, "ignore_eos": True,
            "stream": stream, "cache_prompt": forever or rng.random() < 0.5,
            "max_tokens": 100000 if forever else rng.randint(64, 200)}
    if forever:
        body.update(n_keep=0, cache_prompt=False)
    return body


def hostile_inputs(slot_ctx):
    """(name, raw bytes sent, how it ends, expected status or None): "answer":
    the request is whole and must get that 4xx with an error object; "cut":
    the connection is half-closed after the bytes (a truncated request):
    no answer or a 4xx."""
    cases = []

    def body(name, kind, b, status=400, method="POST", path=None, key=KEY):
        b = b if isinstance(b, bytes) else json.dumps(b).encode()
        cases.append((name, raw_head(method, path or path_of(kind), len(b), key) + b, "answer",
                      status))

    msg = [{"role": "user", "content": "hi"}]
    body("invalid JSON", "cmpl", b'{"prompt": "hi", "max_tokens": 4')
    body("not an object", "cmpl", b"[1, 2, 3]")
    body("NaN", "cmpl", b'{"prompt": "hi", "temperature": NaN}')
    body("deep nesting", "chat", b"[" * 40000)
    body("invalid UTF-8", "cmpl", b'{"prompt": "\xff\xfe hi"}')
    body("wrong type: prompt", "cmpl", {"prompt": 5})
    body("wrong type: max_tokens", "cmpl", {"prompt": "hi", "max_tokens": "8"})
    body("wrong type: stream", "cmpl", {"prompt": "hi", "stream": "yes"})
    body("wrong type: messages", "chat", {"messages": "hi"})
    body("wrong type: content", "chat", {"messages": [{"role": "user", "content": 5}]})
    body("huge max_tokens", "cmpl", {"prompt": "hi", "max_tokens": 10 ** 12})
    body("huge n", "chat", {"messages": msg, "n": 1000})
    body("negative max_tokens", "chat", {"messages": msg, "max_tokens": -5})
    body("negative temperature", "cmpl", {"prompt": "hi", "temperature": -1})
    body("negative top_k", "cmpl", {"prompt": "hi", "top_k": -3})
    body("negative token id", "cmpl", {"prompt": [1, -2, 3]})
    body("unknown role", "chat", {"messages": [{"role": "wizard", "content": "hi"}]})
    body("token id out of range", "cmpl", {"prompt": [1, 2, 10 ** 9]})
    body("prompt longer than a slot", "cmpl", {"prompt": [65] * (slot_ctx + 50),
                                                "max_tokens": 1})
    body("body over --max-body", "cmpl", {"prompt": "x" * (MAX_BODY + 100)}, 413)
    body("wrong API key", "cmpl", {"prompt": "hi"}, 401, key="not-the-key")
    body("unknown model", "cmpl", {"prompt": "hi", "model": "no-such-model"}, 404)
    body("wrong method", "cmpl", b"", 405, method="GET")
    body("unknown path", "cmpl", {"prompt": "hi"}, 404, path="/v1/engines/x/completions")
    whole = json.dumps({"prompt": "hi", "max_tokens": 4}).encode()
    cases.append(("truncated body", raw_head("POST", "/v1/completions", len(whole) + 100)
                  + whole, "cut", None))
    cases.append(("truncated headers", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
                  "cut", None))
    cases.append(("garbage request line", b"\x16\x03\x01\x02\x00 hello\r\n\r\n", "cut", None))
    cases.append(("bad chunked body", raw_head("POST", "/v1/completions", 0).replace(
        b"Content-Length: 0\r\n", b"Transfer-Encoding: chunked\r\n") + b"zz\r\n{}\r\n", "cut",
        None))
    return cases


# --- the server -------------------------------------------------------------------

class Server:
    def __init__(self, name, model, n_par):
        from serve_helpers import VELA, WORK, wait_ready
        self.log_path = os.path.join(WORK, name + ".log")
        with open(self.log_path, "w") as log:
            self.p = subprocess.Popen(
                [VELA, "serve", "-m", model, "--backend", "cpu", "-t", "2", "--port", "0",
                 "-np", str(n_par), "-c", str(SLOT_CTX * n_par), "--max-body", str(MAX_BODY),
                 "--api-key", KEY, "--strict-model-name", "--no-progress", "--log-format",
                 "json"], stdout=log, stderr=subprocess.STDOUT)
        self.port = wait_ready(self.p, self.log_path)
        self.n_par = n_par

    def rss_kb(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def log_lines(self):
        out = []
        with open(self.log_path, errors="replace") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    out.append({"level": "text", "msg": line.rstrip()})
        return out

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def wait_idle(port, need=lambda m: True):
    """/metrics once nothing runs or waits (and need(m) holds), bounded."""
    deadline = time.monotonic() + IDLE_WITHIN_S
    while True:
        m = metrics(port)
        if (m["vela_requests_running"] == 0 and m["vela_requests_queued"] == 0 and need(m)) \
                or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


# --- the soak ---------------------------------------------------------------------

class Soak:
    """The mix of one server: client threads share an action budget and a deadline."""

    ACTIONS = [("plain", 28), ("stream", 28), ("disconnect", 10), ("cancel", 9),
               ("hostile", 20), ("metrics", 5)]

    def __init__(self, rep, srv, cat, refs, hostile, seed):
        self.rep, self.srv, self.cat, self.refs, self.hostile = rep, srv, cat, refs, hostile
        self.seed = seed
        self.c = collections.Counter()  # this server's counts (the metrics' deltas)
        self.ids = set()
        self.lock = threading.Lock()

    def count(self, what, n=1):
        with self.lock:
            self.c[what] += n
        self.rep.count(what, n)

    def new_id(self, rid, what):
        with self.lock:
            dup = rid in self.ids
            self.ids.add(rid)
        self.rep.check(not dup, "answered once", "id %s seen twice (%s)" % (rid, what))

    def run(self, n_actions, seconds, n_threads, tag):
        left = [n_actions]
        deadline = time.monotonic() + seconds
        threads = [threading.Thread(target=self.client, args=(t, left, deadline, tag))
                   for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def client(self, t, left, deadline, tag):
        rng = random.Random("%d/%d/%s/%d" % (self.seed, self.srv.n_par, tag, t))
        names = [a for a, _ in self.ACTIONS]
        weights = [w for _, w in self.ACTIONS]
        rate = None
        while time.monotonic() < deadline:
            with self.lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            if rate is None or rng.random() < 0.1:  # bursts and calm spells
                rate = rng.choice([2.0, 10.0, 50.0, 0.0])
            if rate:
                time.sleep(min(0.5, rng.expovariate(rate)))
            action = rng.choices(names, weights)[0]
            try:
                getattr(self, "do_" + action)(rng)
            except Exception as e:  # a valid request that broke: a failure, never a crash
                self.count("errors")
                self.rep.check(False, "no error outside the hostile ones",
                               "-np %d %s: %s: %s" % (self.srv.n_par, action,
                                                      type(e).__name__, e))

    def pick(self, rng):
        i = rng.randrange(len(self.cat))
        return i, self.cat[i]

    def compare(self, i, got, what):
        ref = self.refs[i]
        same = got == ref if what == "plain" else got == ref[0]
        kind, body = self.cat[i]
        if not same:
            self.count("mismatches")
        self.rep.check(same, "equals the request alone",
                       "-np %d %s %s %s: got %r, alone %r" % (
                           self.srv.n_par, what, kind, json.dumps(body), got,
                           ref if what == "plain" else ref[0]))

    def do_plain(self, rng):
        i, (kind, body) = self.pick(rng)
        self.count("requests")
        status, data = call(self.srv.port, "POST", path_of(kind), json.dumps(body))
        if not self.rep.check(status == 200, "valid requests answered 200",
                              "-np %d: %d %s for %s" % (self.srv.n_par, status, data[:300],
                                                        json.dumps(body))):
            self.count("errors")
            return
        self.count("completed")
        obj = json.loads(data)
        self.new_id(obj["id"], "plain")
        self.compare(i, plain_answer(kind, obj), "plain")

    def do_stream(self, rng):
        i, (kind, body) = self.pick(rng)
        body = dict(body, stream=True)
        if rng.random() < 0.3:
            body["stream_options"] = {"include_usage": True}
        self.count("requests")
        self.count("streamed")
        status, events, data = stream_call(self.srv.port, kind, body)
        if status != 200:
            self.count("errors")
            self.rep.check(False, "valid requests answered 200", "-np %d stream: %d %s" % (
                self.srv.n_par, status, data[:300]))
            return
        try:
            got, ids, errors = stream_answer(kind, events, body.get("n", 1))
        except (ValueError, KeyError, IndexError) as e:
            self.count("errors")
            self.rep.check(False, "a stream ends properly", "-np %d %s: %s" % (
                self.srv.n_par, json.dumps(body), e))
            return
        self.rep.check(len(ids) == 1 and not errors, "a stream ends properly",
                       "-np %d: ids %r errors %r" % (self.srv.n_par, ids, errors))
        self.count("completed")
        self.new_id(ids.pop(), "stream")
        self.compare(i, got, "stream")

    def do_disconnect(self, rng):
        """A stream dropped after 1..4 chunks; a reset half of the time."""
        body = json.dumps(long_body(rng, True)).encode()
        self.count("requests")
        self.count("streamed")
        s = raw_open(self.srv.port, raw_head("POST", "/v1/completions", len(body)) + body)
        k = rng.randint(1, 4)
        got = b""
        while got.count(b"data: ") < k and b"[DONE]" not in got:
            b = s.recv(4096)
            if not b:
                break
            got += b
        raw_close(s, rng.random() < 0.5)
        if not self.rep.check(status_of(got) == 200, "valid requests answered 200",
                              "-np %d disconnect: %r" % (self.srv.n_par, got[:300])):
            self.count("errors")
            return
        self.count("disconnects")

    def do_cancel(self, rng):
        """A plain request dropped before its answer (unless it came first)."""
        body = json.dumps(long_body(rng, False)).encode()
        self.count("requests")
        s = raw_open(self.srv.port, raw_head("POST", "/v1/completions", len(body)) + body)
        time.sleep(rng.uniform(0.0, 0.3))
        late = select.select([s], [], [], 0)[0]
        if late:  # the answer came before the drop: it must be a 200
            got = raw_answer(s)
            self.rep.check(status_of(got) == 200, "valid requests answered 200",
                           "-np %d cancel: %r" % (self.srv.n_par, got[:300]))
        raw_close(s, rng.random() < 0.5)
        self.count("cancellations")

    def do_hostile(self, rng):
        name, data, how, want = rng.choice(self.hostile)
        self.count("hostile inputs")
        s = raw_open(self.srv.port, data)
        if how == "cut":
            s.shutdown(socket.SHUT_WR)
        got = raw_answer(s)
        s.close()
        status = status_of(got)
        if how == "cut":
            self.rep.check(status == 0 or 400 <= status < 500, "hostile input gets a 4xx",
                           "-np %d %s: %r" % (self.srv.n_par, name, got[:300]))
            return
        ok = status == want
        if ok:
            try:
                err = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
                ok = isinstance(err, dict) and bool(err.get("message"))
            except (ValueError, KeyError, IndexError, TypeError):
                ok = False
        self.rep.check(ok, "hostile input gets a 4xx", "-np %d %s: want %d, got %r" % (
            self.srv.n_par, name, want, got[:300]))
        if status == 400 and b"context_length_exceeded" in got:
            self.count("hostile refused by the worker")  # counted in requests_failed

    def do_metrics(self, rng):
        m = metrics(self.srv.port)
        self.rep.check(m["vela_kv_cells_used"] <= m["vela_kv_cells_total"], "KV cells in range",
                       "%r" % m)


def references(rep, model, cat):
    """Each catalogue request alone (non-streamed) on a fresh -np 1 server;
    its stream alone must give the same text (a generated NUL byte included:
    the tiny model has a byte token 0x00, seeds 158289675 and 1419818011 make
    one)."""
    srv = Server("soak-reference", model, 1)
    try:
        refs = []
        for kind, body in cat:
            status, data = call(srv.port, "POST", path_of(kind), json.dumps(body))
            if status != 200:
                raise RuntimeError("the reference of %s: %d %s" % (json.dumps(body), status,
                                                                   data[:300]))
            refs.append(plain_answer(kind, json.loads(data)))
        # streamed alone: the same text and finish_reason
        for i, (kind, body) in enumerate(cat):
            status, events, data = stream_call(srv.port, kind, dict(body, stream=True))
            try:
                got = stream_answer(kind, events, body.get("n", 1))[0]
            except (ValueError, KeyError, IndexError) as e:
                got = "%d %s %s" % (status, data[:300], e)
            detail = "the reference server, streamed: %s: got %r, plain %r" % (
                json.dumps(body), got, refs[i][0])
            rep.check(got == refs[i][0], "a stream equals the plain answer", detail)
        # the same again: greedy answers are deterministic run to run
        for (kind, body), ref in zip(cat, refs):
            status, data = call(srv.port, "POST", path_of(kind), json.dumps(body))
            rep.check(status == 200 and plain_answer(kind, json.loads(data)) == ref,
                      "equals the request alone", "the reference server, twice: %s"
                      % json.dumps(body))
        return refs
    finally:
        srv.stop()


def check_counts(rep, srv, soak, m0, m1):
    """/metrics' deltas against what the clients sent (at idle)."""
    d = {k: m1[k] - m0.get(k, 0) for k in m1}
    c = soak.c
    total, ok, failed, cancelled = (d["vela_requests_total"], d["vela_requests_ok_total"],
                                    d["vela_requests_failed_total"],
                                    d["vela_requests_cancelled_total"])
    tag = "-np %d: metrics %r, clients %r" % (srv.n_par, {k: v for k, v in d.items()
                                                          if "requests" in k}, dict(c))
    worker_refused = c["hostile refused by the worker"]
    rep.check(total == ok + failed + cancelled, "no request lost (total = ok+failed+cancelled)",
              tag)
    # A prompt longer than a slot is refused when the worker submits it (it
    # counts as received and failed) or, were it checked sooner, before.
    rep.check(failed <= worker_refused, "no request failed but hostile ones", tag)
    # Completed answers are ok; a drop may come after its answer (ok) or, a
    # reset, before the server read the request (never counted).
    dropped = c["disconnects"] + c["cancellations"]
    rep.check(c["completed"] <= ok <= c["completed"] + dropped, "ok counts the answers", tag)
    rep.check(cancelled <= dropped, "cancelled counts the drops", tag)
    rep.check(c["completed"] + c["disconnects"] + failed <= total <=
              c["completed"] + dropped + failed, "requests_total counts the requests", tag)
    rep.check(m1["vela_requests_running"] == 0 and m1["vela_requests_queued"] == 0,
              "idle after the soak", tag)


def free_kept_cells(rep, srv):
    """Every slot taken by a stream that never ends and keeps nothing, then
    dropped: afterwards no cell is in use."""
    socks = []
    rng = random.Random(0)
    try:
        for _ in range(srv.n_par):
            body = json.dumps(long_body(rng, True, forever=True)).encode()
            socks.append(raw_open(srv.port, raw_head("POST", "/v1/completions", len(body))
                                  + body))
        deadline = time.monotonic() + IDLE_WITHIN_S
        while metrics(srv.port)["vela_requests_running"] < srv.n_par and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        rep.check(metrics(srv.port)["vela_requests_running"] == srv.n_par,
                  "every slot taken", "-np %d" % srv.n_par)
    finally:
        for s in socks:
            raw_close(s, False)
    m = wait_idle(srv.port, lambda m: m["vela_kv_cells_used"] == 0)
    rep.check(m["vela_kv_cells_used"] == 0, "KV cells return to 0",
              "-np %d: %d in use once idle" % (srv.n_par, m["vela_kv_cells_used"]))
    return m


def sigterm_with_streams_open(rep, srv):
    """n_par + 1 never-ending streams and a plain request (two queued), then
    SIGTERM: each stream ends with its final chunk and [DONE], the plain
    request gets 503, the server exits 0 in time."""
    rng = random.Random(1)
    conns, resps, plain = [], [], []

    def post_plain():
        try:
            plain.append(call(srv.port, "POST", "/v1/completions",
                              json.dumps(long_body(rng, False, forever=True)), timeout=60))
        except Exception as e:
            plain.append((0, repr(e).encode()))

    for _ in range(srv.n_par + 1):
        c = http.client.HTTPConnection(HOST, srv.port, timeout=60)
        c.request("POST", "/v1/completions", json.dumps(long_body(rng, True, forever=True)),
                  headers())
        conns.append(c)
        resps.append(c.getresponse())
    t = threading.Thread(target=post_plain)
    t.start()
    deadline = time.monotonic() + IDLE_WITHIN_S
    m = {}
    while time.monotonic() < deadline:
        m = metrics(srv.port)
        if m["vela_requests_running"] == srv.n_par and m["vela_requests_queued"] == 2:
            break
        time.sleep(0.05)
    rep.check(m.get("vela_requests_running") == srv.n_par and m.get("vela_requests_queued") == 2,
              "SIGTERM: every slot running, two queued", "-np %d: %r" % (srv.n_par, m))
    n_log = len(srv.log_lines())
    t0 = time.monotonic()
    srv.p.send_signal(signal.SIGTERM)
    for k, (c, r) in enumerate(zip(conns, resps)):
        rep.count("open at SIGTERM")
        try:
            events = read_events(r, time.monotonic() + 30)
            got, ids, errors = stream_answer("cmpl", events, 1)
            ok = got[0][1] == "error" and len(errors) == 1 and \
                errors[0].get("code") == "shutting_down"
            rep.check(r.status == 200 and ok, "SIGTERM: a stream ends with its error and [DONE]",
                      "-np %d stream %d: %r %r" % (srv.n_par, k, got[0][1], errors))
        except (ValueError, KeyError, OSError, http.client.HTTPException) as e:
            rep.check(False, "SIGTERM: a stream ends with its error and [DONE]",
                      "-np %d stream %d: %s: %s" % (srv.n_par, k, type(e).__name__, e))
        finally:
            c.close()
    t.join(timeout=EXIT_WITHIN_S)
    status, data = plain[0] if plain else (0, b"no answer")
    rep.check(status == 503 and b"shutting_down" in data, "SIGTERM: a plain request gets 503",
              "-np %d: %d %r" % (srv.n_par, status, data[:300]))
    try:
        rc = srv.p.wait(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.monotonic() - t0
    rep.check(rc == 0 and took < EXIT_WITHIN_S, "SIGTERM: exits 0 in time",
              "-np %d: exit %r after %.1f s" % (srv.n_par, rc, took))
    return n_log, took


def check_log(rep, srv, n_before_signal):
    """No error line and no 5xx answer before the SIGTERM."""
    lines = srv.log_lines()[:n_before_signal]
    errors = [x for x in lines if x.get("level") == "error"]
    five = [x for x in lines if x.get("event") == "access" and x.get("status", 0) >= 500]
    rep.check(not errors and not five, "no error in the log before the SIGTERM",
              "-np %d: %r" % (srv.n_par, (errors + five)[:5]))


def soak_one(rep, args, model, n_par, cat, refs):
    t0 = time.monotonic()
    hostile = hostile_inputs(SLOT_CTX)
    srv = Server("soak-np%d" % n_par, model, n_par)
    try:
        soak = Soak(rep, srv, cat, refs, hostile, args.seed)
        n_threads = n_par + 2
        n_actions = args.actions or (80 + 25 * n_par if not args.long else 2000)
        seconds = args.seconds or (25 if not args.long else 300)
        m0 = wait_idle(srv.port)
        soak.run(n_actions // 4, seconds / 4, n_threads, "warm-up")
        m_warm = wait_idle(srv.port)
        rss_warm = srv.rss_kb()
        soak.run(n_actions - n_actions // 4, seconds, n_threads, "soak")
        m1 = wait_idle(srv.port)
        check_counts(rep, srv, soak, m0, m1)
        free_kept_cells(rep, srv)
        rss_end = srv.rss_kb()
        bound = max(rss_warm * RSS_GROW_FRAC, RSS_GROW_MB * 1024)
        rep.check(rss_end - rss_warm <= bound, "RSS flat after warm-up",
                  "-np %d: %d kB after warm-up, %d kB at the end (bound +%d kB)" % (
                      n_par, rss_warm, rss_end, bound))
        n_log, took = sigterm_with_streams_open(rep, srv)
        check_log(rep, srv, n_log)
        print("-np %d: %s; RSS %.1f -> %.1f MiB; KV cells %d/%d after warm-up; exit after %.1f s"
              " of SIGTERM; %.0f s" % (
                  n_par, ", ".join("%s %d" % kv for kv in sorted(soak.c.items())),
                  rss_warm / 1024, rss_end / 1024, m_warm["vela_kv_cells_used"],
                  m_warm["vela_kv_cells_total"], took, time.monotonic() - t0), flush=True)
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("vela")
    ap.add_argument("build_dir")
    ap.add_argument("--long", action="store_true", help="a longer mix, for benches")
    ap.add_argument("--seed", type=int, default=None, help="replays a run (printed)")
    ap.add_argument("--np", default="1,4,8", help="the -np values, comma-separated")
    ap.add_argument("--model", help="a GGUF (default: the tiny synthetic model)")
    ap.add_argument("--actions", type=int, default=0, help="actions per server")
    ap.add_argument("--seconds", type=float, default=0, help="soak time per server (bounded)")
    args = ap.parse_args()
    if not (os.path.isfile(args.vela) and os.access(args.vela, os.X_OK)):
        print("SKIP: %s is not an executable" % args.vela)
        return 77
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    work = os.path.join(os.path.abspath(args.build_dir), "serve-soak")
    os.makedirs(work, exist_ok=True)
    os.environ["VELA_BIN"] = os.path.abspath(args.vela)
    os.environ["VELA_SERVE_WORK"] = work
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    from serve_helpers import tiny_model
    t0 = time.monotonic()
    print("soak: seed %d (--seed %d replays it), %s mode, -np %s; logs in %s" % (
        args.seed, args.seed, "long" if args.long else "CI", args.np, work), flush=True)
    rep = Report(args.seed)
    rep.log = os.path.join(work, "soak-failures.txt")
    open(rep.log, "w").close()
    try:
        model = args.model or tiny_model(512)
        cat = catalogue(random.Random(args.seed), 48 if args.long else 16)
        refs = references(rep, model, cat)
        for n_par in [int(x) for x in args.np.split(",")]:
            soak_one(rep, args, model, n_par, cat, refs)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        rep.check(False, "the soak ran", "%s: %s" % (type(e).__name__, e))
    c = rep.counts
    print("%d passed, %d failed, %d expected failures (known bugs); requests %d, streamed %d, "
          "disconnects %d, cancellations %d, hostile inputs %d, mismatches %d, errors %d; "
          "seed %d; %.0f s" % (
              rep.passed, len(rep.failed), len(rep.xfailed), c["requests"], c["streamed"],
              c["disconnects"], c["cancellations"], c["hostile inputs"], c["mismatches"],
              c["errors"], args.seed, time.monotonic() - t0))
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
