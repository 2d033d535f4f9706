"""End-to-end tests of `vela serve` through the official openai client
(tests/serve/run.sh starts the server and sets VELA_SERVE_URL / _KEY / _MODEL).

What they show: completions, chat, streaming (chunks concatenate to the
non-streamed text at temperature 0), stop strings, n, logprobs, usage
counts, /tokenize round trips, /metrics counters consistent with what was
sent; 32 clients x 4 requests each answered as when sent alone; a client
that disconnects frees its slot; 200+ malformed or hostile requests each get
the right status and error JSON, and the server answers the same afterwards.
Prompt caching (cache_prompt, on by default): a request repeated, a chat's
next turn, n choices and a cancelled request decode only what their slot did
not keep, and answer exactly as with "cache_prompt": false.
"""
import concurrent.futures
import http.client
import json
import os
import re
import socket
import time
import urllib.parse

import openai
import pytest

URL = os.environ["VELA_SERVE_URL"]
KEY = os.environ["VELA_SERVE_KEY"]
MODEL = os.environ["VELA_SERVE_MODEL"]
HOST = urllib.parse.urlparse(URL).hostname
PORT = urllib.parse.urlparse(URL).port


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)


def raw(method, path, body=None, headers=None, key=KEY):
    """One HTTP request; returns (status, parsed JSON or text)."""
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    c = http.client.HTTPConnection(HOST, PORT, timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else body.encode()
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    text = r.read()
    c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text.decode(errors="replace")


def metrics():
    status, text = raw("GET", "/metrics")
    assert status == 200
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(vela_[a-z_]+) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def complete(client, prompt, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 12)
    return client.completions.create(model=MODEL, prompt=prompt, **kw)


def test_health_and_models(client):
    assert raw("GET", "/health", key=None)[0] == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_page_needs_no_key():
    # The page asks for the key itself, as llama-server's; the API still needs it.
    status, text = raw("GET", "/", key=None)
    assert status == 200 and "/webui/app.js" in text
    assert raw("GET", "/v1/models", key=None)[0] == 401
    assert raw("POST", "/", "{}")[0] == 404


def test_completion_and_usage(client):
    r = complete(client, "Once upon a time", max_tokens=10)
    assert r.object == "text_completion"
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    status, tok = raw("POST", "/tokenize", json.dumps({"content": "Once upon a time",
                                                      "add_special": True}))
    assert status == 200
    assert r.usage.prompt_tokens == len(tok["tokens"])
    assert r.usage.completion_tokens == 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + 10


def test_chat(client):
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8,
                                       messages=[{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hello"}])
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8


def test_stream_concatenates_to_the_whole_text(client):
    whole = complete(client, "The sea", max_tokens=20).choices[0].text
    parts, finish, usage = [], None, None
    for ch in complete(client, "The sea", max_tokens=20, stream=True,
                       stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            parts.append(c.text)
            finish = c.finish_reason or finish
    assert "".join(parts) == whole
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 20


def test_chat_stream_concatenates(client):
    msgs = [{"role": "user", "content": "Tell me a story"}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                           max_tokens=16).choices[0].message.content
    text = ""
    for ch in client.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                             max_tokens=16, stream=True):
        for c in ch.choices:
            text += c.delta.content or ""
    assert text == whole


def test_stop_string_is_not_emitted(client):
    whole = complete(client, "A B C", max_tokens=24).choices[0].text
    # A stop string from the middle of the unconstrained text.
    cut = len(whole) // 2
    stop = whole[cut:cut + 3]
    if len(stop.strip()) < 2:
        pytest.skip("the generated text has no usable middle")
    r = complete(client, "A B C", max_tokens=24, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == whole[:whole.index(stop)]
    assert stop not in r.choices[0].text


def test_n_choices_with_seed(client):
    r = complete(client, "Hello", max_tokens=6, n=3, temperature=0.9, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    again = complete(client, "Hello", max_tokens=6, n=3, temperature=0.9, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in r.choices], "seeded: repeatable"
    assert r.usage.completion_tokens == 18


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=5, logprobs=True,
                                       top_logprobs=3,
                                       messages=[{"role": "user", "content": "Hi"}])
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5
    c = complete(client, "Hi", max_tokens=4, logprobs=2)
    assert len(c.choices[0].logprobs.token_logprobs) == 4
    # logprobs 0: the chosen tokens' alone, no alternatives (the server once
    # read before its list of 0 best and crashed; the soak's seed 627983777)
    c = complete(client, "Hi", max_tokens=4, logprobs=0, temperature=0.8, seed=1)
    lp = c.choices[0].logprobs
    assert len(lp.token_logprobs) == 4 and all(x <= 0 for x in lp.token_logprobs)
    assert all(not t for t in lp.top_logprobs or [])
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=3, logprobs=True,
                                       top_logprobs=0,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert all(t.top_logprobs == [] for t in r.choices[0].logprobs.content)


def test_tokenize_round_trip():
    text = "Hello world, this is vela."
    status, tok = raw("POST", "/tokenize", json.dumps({"content": text}))
    assert status == 200 and len(tok["tokens"]) > 0
    status, de = raw("POST", "/detokenize", json.dumps({"tokens": tok["tokens"]}))
    assert status == 200 and de["content"] == text
    status, wp = raw("POST", "/tokenize", json.dumps({"content": text, "with_pieces": True}))
    assert [p["id"] for p in wp["tokens"]] == tok["tokens"]


def test_errors(client):
    # any model name is answered by the served model, as llama-server does
    # (--strict-model-name: 404, test_llama_flags.py)
    r = client.completions.create(model="gpt-3.5-turbo", prompt="x", max_tokens=1)
    assert r.model == MODEL and len(r.choices) == 1
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, "word " * 2000, max_tokens=1)
    assert e.value.body["code"] == "context_length_exceeded"
    bad = openai.OpenAI(base_url=URL + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_metrics_count_what_was_sent(client):
    before = metrics()
    for i in range(3):
        complete(client, "count %d" % i, max_tokens=3)
    after = metrics()
    assert after["vela_requests_total"] - before["vela_requests_total"] == 3
    assert after["vela_generated_tokens_total"] - before["vela_generated_tokens_total"] == 9
    assert after["vela_requests_running"] == 0


PROMPTS = ["The quick brown fox", "Once", "In a galaxy far far away there", "1 2 3 4 5",
           "Hello", "A long time ago in a village near the sea, an old man"]


def one(i, k):
    c = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=300)
    p = PROMPTS[(i + k) % len(PROMPTS)]
    n = 4 + (i * 7 + k) % 13
    if (i + k) % 3 == 0:
        r = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=n,
                                      messages=[{"role": "user", "content": p}])
        return ("chat", p, n), r.choices[0].message.content
    r = c.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=n)
    return ("cmpl", p, n), r.choices[0].text


def test_concurrent_clients_get_what_they_get_alone(client):
    jobs = [(i, k) for i in range(32) for k in range(4)]
    alone = {}
    for i, k in jobs:
        key, text = one(i, k)
        alone.setdefault(key, text)
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as ex:
        results = list(ex.map(lambda a: one(*a), jobs))
    assert len(results) == 128
    for key, text in results:
        assert text == alone[key], key


def stream_started(body):
    """A streamed completion on a raw socket, once 3 events came (the caller closes it)."""
    s = socket.create_connection((HOST, PORT))
    body = json.dumps(body)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (KEY, len(body), body)).encode())
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    return s


def test_disconnect_frees_the_slot(client):
    before = metrics()
    # n_keep asks for context shifts: it would never end by itself;
    # cache_prompt false: its cells are dropped when it ends, not kept for reuse
    s = stream_started({"model": MODEL, "prompt": "go on forever", "max_tokens": 100000,
                        "stream": True, "ignore_eos": True, "n_keep": 0, "cache_prompt": False})
    assert metrics()["vela_requests_running"] >= 1
    s.close()
    # Other slots keep their cached prompts; this one took a slot and, leaving,
    # frees what it used (and what that slot cached before, if anything).
    deadline = time.time() + 20
    while time.time() < deadline:
        m = metrics()
        if m["vela_requests_running"] == 0 and m["vela_kv_cells_used"] <= before["vela_kv_cells_used"]:
            break
        time.sleep(0.1)
    m = metrics()
    assert m["vela_requests_running"] == 0
    assert m["vela_kv_cells_used"] <= before["vela_kv_cells_used"]
    assert m["vela_requests_cancelled_total"] == before["vela_requests_cancelled_total"] + 1


def hostile_requests():
    """(method, path, body, headers, expected status) for malformed and hostile input."""
    cases = []
    good = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    # broken JSON of every kind
    for b in ["", "{", "}", "[", "{\"prompt\":", "{\"prompt\": \"x\",}", "nul", "{'a': 1}",
              "{\"prompt\": \"x\"} trailing", "\x00", "{\"prompt\": \"\\x\"}", "[1,2,3]", "42",
              "\"str\"", "true", "null"]:
        cases.append(("POST", "/v1/completions", b, {}, 400))
    # wrong types and out-of-range values for every field
    fields = {"prompt": [None, 5, True, {}, [], [-1], [1.5], [[1]]],
              "max_tokens": [-1, -100, 1e300, "10", 2.5, True, [], {}],
              "temperature": [-0.1, 2.5, "hot", [], 1e308],
              "top_p": [-1, 1.01, "x"], "top_k": [-1, 0.5, "x"], "min_p": [-0.5, 2, "x"],
              "presence_penalty": [-3, 3, "x"], "frequency_penalty": [-2.5, 9, []],
              "n": [0, -1, 1000, 2.5, "2"], "stream": ["yes", 1, []], "seed": ["s", 1.5, []],
              "stop": [3, [""], ["x" * 300], [1, 2], {"a": 1}, ["a"] * 20],
              "logprobs": [-1, 99, "x"], "echo": [True], "model": [3, [], {}],
              "stream_options": [1, "x", []], "grp_attn_n": [0, -2, "x"],
              "grp_attn_w": [0, "x"], "n_keep": [-5, "x"], "cache_prompt": [1, "yes", []],
              # exact self-extend: a bad shape, or (valid shape) on a server without it
              "self_extend": [1, "x", [], {"n": 0, "w": 4}, {"n": 2, "w": -1}, {"n": 2},
                              {"w": 4}, {"n": 2.5, "w": 4}, {"n": 2, "w": 4, "g": 2},
                              {"n": "2", "w": 4}, {"n": 2, "w": 64}]}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    for f, values in fields.items():
        # an object or a nested array is wrong for every field but stream_options ({} is fine)
        for v in values + ([[[]]] if f == "stream_options" else [{}, [[]]]):
            body = dict(good)
            body[f] = v
            cases.append(("POST", "/v1/completions", json.dumps(body), {}, 400))
            if f != "prompt":
                body = dict(chat)
                body[f] = v
                cases.append(("POST", "/v1/chat/completions", json.dumps(body), {}, 400))
    # chat shapes
    for msgs in [None, [], "hi", [1], [{}], [{"role": "user"}], [{"role": "x", "content": "a"}],
                 [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image"}]}],
                 [{"role": 1, "content": "a"}]]:
        body = {"model": MODEL, "max_tokens": 1}
        if msgs is not None:
            body["messages"] = msgs
        cases.append(("POST", "/v1/chat/completions", json.dumps(body), {}, 400))
    cases.append(("POST", "/v1/chat/completions",
                  json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                              "response_format": {"type": "xml"}}), {}, 400))
    # token ids out of range, a prompt too long, huge numbers
    cases.append(("POST", "/v1/completions",
                  json.dumps({"model": MODEL, "prompt": [1, 2, 10**9], "max_tokens": 1}), {}, 400))
    cases.append(("POST", "/v1/completions",
                  json.dumps({"model": MODEL, "prompt": [1] * 5000, "max_tokens": 1}), {}, 400))
    # invalid UTF-8
    for b in [b'{"prompt": "\xff\xfe"}', b'{"prompt": "a\xc3("}', b'{"prompt": "\xed\xa0\x80"}',
              b'{"prompt": "\xc0\xaf"}']:
        cases.append(("POST", "/v1/completions", b, {}, 400))
    # fields vela cannot honour yet, and llama-server's fields of a bad type or range
    for f, values in {"logit_bias": [3, "x", {"abc": 1}, {"28": "x"}, [[28]], [[10**9, 1]],
                                     {str(10**9): -1}],
                      "tools": [[{"type": "function", "function": {"name": "f"}}]],
                      "tool_choice": ["required", {"type": "function"}],
                      "grammar": ["root ::= (", 3],
                      "json_schema": [{"type": "number", "multipleOf": 2}, 5],
                      "typical_p": [0.5, "x"], "mirostat": [1, 2, "x"],
                      "mirostat_tau": ["x"], "n_predict": [-2, "x", 1.5],
                      "repeat_penalty": [0, -1, "x"], "repeat_last_n": [-2, "x"]}.items():
        for v in values:
            for path, base in [("/v1/completions", good), ("/v1/chat/completions", chat)]:
                cases.append(("POST", path, json.dumps(dict(base, **{f: v})), {}, 400))
    cases.append(("POST", "/v1/chat/completions",
                  json.dumps(dict(chat, response_format={"type": "json_schema"})), {}, 400))
    # unknown path and method; wrong or missing key
    for p in ["/webui/", "/webui/nope.js", "/v2/completions", "/v1/completions/x",
              "/v1/../etc/passwd", "/x%00", "/%00", "/health%00x", "/admin"]:
        cases.append(("GET", p, None, {}, 404))
    for m, p in [("GET", "/v1/completions"), ("PUT", "/v1/chat/completions"),
                 ("DELETE", "/v1/models"), ("POST", "/health"), ("POST", "/metrics"),
                 ("GET", "/tokenize")]:
        cases.append((m, p, None, {}, 405))
    for h in [{"Authorization": "Bearer nope"}, {"Authorization": "Basic dGVzdA=="},
              {"Authorization": "Bearer "}, {"Authorization": ""}]:
        cases.append(("POST", "/v1/completions", json.dumps(good), h, 401))
    # bodies over --max-body (1 MiB here): 413
    for n in [(1 << 20) + 1, 10 << 20]:
        cases.append(("POST", "/v1/completions", b"{" + b" " * n + b"}", {}, 413))
    # tokenize / detokenize
    for b in ["{}", "{\"content\": 5}", "[1]", "{\"content\": \"x\", \"add_special\": 3}"]:
        cases.append(("POST", "/tokenize", b, {}, 400))
    for b in ["{}", "{\"tokens\": [-1]}", "{\"tokens\": [99999999]}", "{\"tokens\": \"x\"}",
              "{\"tokens\": [1.5]}"]:
        cases.append(("POST", "/detokenize", b, {}, 400))
    return cases


def test_hostile_input_gets_errors_and_changes_nothing(client):
    reference = complete(client, "The same answer", max_tokens=8).choices[0].text
    cases = hostile_requests()
    assert len(cases) >= 200, len(cases)
    for method, path, body, headers, want in cases:
        h = dict(headers)
        key = None if "Authorization" in h else KEY
        status, js = raw(method, path, body, h, key=key)
        assert status == want, (method, path, str(body)[:80], status, js)
        assert isinstance(js, dict) and "message" in js["error"] and "type" in js["error"], js
    # a slow body, sent byte by byte, still gets its answer
    s = socket.create_connection((HOST, PORT))
    body = json.dumps({"model": MODEL, "prompt": "slow", "max_tokens": 2}).encode()
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
               % (KEY, len(body))).encode())
    for b in body:
        s.sendall(bytes([b]))
        time.sleep(0.002)
    resp = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        resp += d
    s.close()
    assert resp.startswith(b"HTTP/1.1 200")
    assert complete(client, "The same answer", max_tokens=8).choices[0].text == reference
    assert metrics()["vela_requests_running"] == 0


# --- prompt caching ------------------------------------------------------------------


def cached(r):
    d = r.usage.prompt_tokens_details
    return d.cached_tokens if d else None


def test_same_request_twice_reuses_the_prompt(client):
    prompt = "A prompt cache test: the lighthouse keeper counted the ships again"
    before = metrics()
    a = complete(client, prompt, max_tokens=10)
    b = complete(client, prompt, max_tokens=10)
    cold = complete(client, prompt, max_tokens=10, extra_body={"cache_prompt": False})
    assert a.choices[0].text == b.choices[0].text == cold.choices[0].text
    n = a.usage.prompt_tokens
    # everything but the last prompt token (decoded again for its logits)
    assert cached(b) == n - 1, (cached(a), cached(b), n)
    assert cached(cold) == 0
    after = metrics()
    assert after["vela_prompt_tokens_cached_total"] - before["vela_prompt_tokens_cached_total"] \
        >= n - 1
    # llama-server's timings: prompt_n decoded, cache_n reused
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0}
    status, js = raw("POST", "/v1/completions", json.dumps(body))
    assert status == 200 and js["choices"][0]["text"] == a.choices[0].text
    assert js["timings"]["cache_n"] == n - 1 and js["timings"]["prompt_n"] == 1
    assert js["timings"]["predicted_n"] == 10
    body["cache_prompt"] = False
    status, js = raw("POST", "/v1/completions", json.dumps(body))
    assert js["timings"]["cache_n"] == 0 and js["timings"]["prompt_n"] == n


def test_multi_turn_chat_decodes_only_the_new_turn(client):
    msgs = [{"role": "system", "content": "You answer in riddles about the moon and tides."},
            {"role": "user", "content": "What pulls the sea twice a day?"}]
    t1 = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12)
    msgs += [{"role": "assistant", "content": t1.choices[0].message.content},
             {"role": "user", "content": "And what does it leave on the sand?"}]
    t2 = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12)
    cold = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                          max_tokens=12, extra_body={"cache_prompt": False})
    assert t2.choices[0].message.content == cold.choices[0].message.content
    # at least the first turn's prompt came from the cache
    assert cached(t2) >= t1.usage.prompt_tokens - 1, (cached(t2), t1.usage.prompt_tokens)
    assert cached(t2) < t2.usage.prompt_tokens
    assert cached(cold) == 0


def test_n_choices_share_and_reuse(client):
    prompt = "Three choices from one cached prompt about owls"
    cold = complete(client, prompt, max_tokens=6, n=3, extra_body={"cache_prompt": False})
    first = complete(client, prompt, max_tokens=6, n=3)
    again = complete(client, prompt, max_tokens=6, n=3)
    texts = [c.text for c in cold.choices]
    assert len(set(texts)) == 1, "greedy: every choice the same"
    assert [c.text for c in first.choices] == texts
    assert [c.text for c in again.choices] == texts
    assert cached(again) == again.usage.prompt_tokens - 1


def test_stream_usage_reports_the_cache(client):
    prompt = "Streaming with a cached prompt, the river bends twice"
    whole = complete(client, prompt, max_tokens=8)
    text, usage = "", None
    for ch in complete(client, prompt, max_tokens=8, stream=True,
                       stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            text += c.text
    assert text == whole.choices[0].text
    assert usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


def test_cancelled_request_leaves_a_usable_cache(client):
    # Long enough that the slot it leaves shares more than half of its kept
    # tokens with the prompt (--slot-prompt-similarity 0.5) however far it
    # got: the next request with that prompt takes that slot.
    prompt = "A cancelled request, then the same prompt: " + "the falcon flies " * 20
    cold = complete(client, prompt, max_tokens=12, extra_body={"cache_prompt": False})
    assert cold.usage.prompt_tokens > 40
    s = stream_started({"model": MODEL, "prompt": prompt, "max_tokens": 40, "stream": True,
                        "ignore_eos": True, "temperature": 0})
    s.close()
    deadline = time.time() + 20
    while metrics()["vela_requests_running"] and time.time() < deadline:
        time.sleep(0.05)
    r = complete(client, prompt, max_tokens=12)
    assert r.choices[0].text == cold.choices[0].text
    assert cached(r) == r.usage.prompt_tokens - 1


def test_logit_bias(client):
    """logit_bias as OpenAI sends it ({"id": bias}) and as llama-server takes it ([[id or text,
    bias or false]]): a banned token never comes, a strongly favoured one does."""
    def one(**kw):
        status, body = raw("POST", "/v1/completions", json.dumps(dict(
            {"prompt": "Once upon a time", "max_tokens": 1, "ignore_eos": True,
             "temperature": 0, "cache_prompt": False}, **kw)))
        assert status == 200, body
        return body["choices"][0]["text"]

    def ids(text):
        status, tok = raw("POST", "/tokenize", json.dumps({"content": text}))
        assert status == 200, tok
        return tok["tokens"]

    def piece(t):
        status, body = raw("POST", "/detokenize", json.dumps({"tokens": [t]}))
        assert status == 200, body
        return body["content"]
    zebra = ids("zebra")
    t = zebra[0]
    assert one(logit_bias={str(t): 100}) == piece(t), "a strongly favoured token comes"
    assert one(logit_bias=[[t, 100]]) == piece(t), "llama-server's pairs"
    # entries of one token add up; false bans it whatever else favours it
    assert one(logit_bias=[[t, 100], [t, False]]) != piece(t)
    # a text: each of its tokens gets the bias
    assert one(logit_bias=[["zebra", 100]]) == one(logit_bias={str(i): 100 for i in zebra})
    # sampling draws among the biased logits: seeded samples take the favoured token
    for seed in range(4):
        assert one(temperature=1.0, seed=seed, logit_bias={str(t): 100}) == piece(t), seed
    for bad, want in [({"logit_bias": [[10**9, 1]]}, "out of range"),
                      ({"logit_bias": {"x": 1}}, "'logit_bias' key 'x'")]:
        status, body = raw("POST", "/v1/completions",
                           json.dumps(dict({"prompt": "x", "max_tokens": 1}, **bad)))
        assert status == 400 and want in body["error"]["message"], body


def test_fields_vela_cannot_honour_get_400_naming_them(client):
    """A grammar that does not parse, a schema keyword vela cannot express, typical_p,
    mirostat: a 400 that names the field, never ignored (tools, grammars: test_tools.py)."""
    for field, value in [("grammar", "root ::= ("),
                         ("json_schema", {"type": "number", "multipleOf": 2}),
                         ("typical_p", 0.5), ("mirostat", 2)]:
        status, body = raw("POST", "/v1/completions",
                           json.dumps({"prompt": "x", "max_tokens": 1, field: value}))
        assert status == 400 and "'%s'" % field in body["error"]["message"], (field, body)
    # values that ask for nothing pass: clients that send their defaults work
    status, body = raw("POST", "/v1/completions", json.dumps(
        {"prompt": "x", "max_tokens": 1, "logit_bias": {}, "tools": [], "tool_choice": "none",
         "typical_p": 1, "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1}))
    assert status == 200, body


def test_n_predict_and_repeat_penalty_work(client):
    """llama-server's n_predict is max_tokens; repeat_penalty changes the greedy text."""
    status, body = raw("POST", "/v1/completions", json.dumps(
        {"prompt": "one two", "n_predict": 3, "ignore_eos": True, "temperature": 0}))
    assert status == 200 and body["usage"]["completion_tokens"] == 3, body

    def greedy(**kw):
        status, body = raw("POST", "/v1/completions", json.dumps(dict(
            {"prompt": [5, 6, 7, 5, 6, 7], "max_tokens": 24, "ignore_eos": True,
             "temperature": 0, "cache_prompt": False}, **kw)))
        assert status == 200, body
        return body["choices"][0]["text"]
    plain = greedy()
    assert greedy(repeat_penalty=1.0) == plain, "1.0 is off, the default"
    assert greedy(repeat_penalty=50.0, repeat_last_n=-1) != plain


def test_props_and_apply_template():
    """llama-server's /props (the defaults a request gets) and /apply-template."""
    status, p = raw("GET", "/props")
    assert status == 200, p
    params = p["default_generation_settings"]["params"]
    # run.sh gives no sampling flags: llama-server's defaults
    assert abs(params["temperature"] - 0.8) < 1e-6 and params["top_k"] == 40
    assert abs(params["top_p"] - 0.95) < 1e-6 and abs(params["min_p"] - 0.05) < 1e-6
    assert p["total_slots"] == 4 and p["default_generation_settings"]["n_ctx"] == 256
    assert p["model_alias"] == MODEL and p["chat_template"] == "chatml"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
    status, t = raw("POST", "/apply-template", json.dumps({"messages": msgs}))
    assert status == 200, t
    assert t["prompt"].endswith("hi there<|im_end|>\n<|im_start|>assistant\n"), t
    status, e = raw("POST", "/apply-template", json.dumps({"messages": []}))
    assert status == 400 and "'messages'" in e["error"]["message"]
    assert raw("POST", "/props", "{}")[0] == 405
    assert raw("GET", "/apply-template")[0] == 405


def test_native_completion_endpoint():
    """llama-server's POST /completion: prompt, n_predict, stream; content in the reply."""
    body = {"prompt": "Once upon", "n_predict": 6, "ignore_eos": True, "temperature": 0}
    status, a = raw("POST", "/completion", json.dumps(body))
    assert status == 200, a
    assert a["stop"] is True and a["stop_type"] == "limit" and a["tokens_predicted"] == 6
    assert a["model"] == MODEL and isinstance(a["content"], str) and "timings" in a
    h = {"Content-Type": "application/json", "Authorization": "Bearer " + KEY}
    c = http.client.HTTPConnection(HOST, PORT, timeout=60)
    c.request("POST", "/completion", json.dumps(dict(body, stream=True)), h)
    r = c.getresponse()
    events = [json.loads(line[6:]) for line in r.read().decode().split("\n\n")
              if line.startswith("data: ")]
    c.close()
    assert r.status == 200 and events, events
    assert all(ev["stop"] is False for ev in events[:-1]) and events[-1]["stop"] is True
    assert "".join(ev["content"] for ev in events) == a["content"]
    assert events[-1]["tokens_predicted"] == 6
    status, e = raw("POST", "/completion", json.dumps({"prompt": "x", "n": 2}))
    assert status == 400 and "'n'" in e["error"]["message"]
    assert raw("GET", "/completion")[0] == 405
    # /slots needs --slots (run.sh gives none), as in llama-server
    status, e = raw("GET", "/slots")
    assert status == 501 and "--slots" in e["error"]["message"], e
