"""gpt-oss's harmony format in `vela serve` (a server of its own with
--chat-template gpt-oss on the synthetic model): a grammar makes the model
write a harmony answer as text, and the answer must come back split as
llama-server splits it, the analysis channel as reasoning_content and the
final channel as content, whole and streamed (reasoning deltas first, then
content), or as it is with reasoning_format "none". The parser itself is
tested byte by byte in tests/test_chat_harmony.c. A second server runs a
synthetic model whose vocabulary has harmony's markers as control tokens
and a template llama.cpp detects as gpt-oss: the grammar names the markers
as tokens, which the tokenizer must render (as llama.cpp's vocabulary does
for harmony: <|end|>, <|channel|>, ... user-defined) for the parser to
see them."""
import json
import os
import re
import struct
import subprocess

import openai
import pytest

from serve_helpers import VELA, WORK, request, stop, tiny_model, wait_ready

MODEL = "tiny"
THINK = "The user greets; answer briefly."
ANSWER = "Hello there!"
HARMONY = ("<|channel|>analysis<|message|>" + THINK + "<|end|><|start|>assistant<|channel|>final"
           "<|message|>" + ANSWER + "<|return|>")


MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
           "<|call|>"]


def gguf_vocab(path, kv):
    """A GGUF file of keys only: kv is [(key, type name, value)] as `vela gguf dump --json`
    names the types (UINT32, INT32, BOOL, STRING, ARRAY of STRING or INT32)."""
    code = {"UINT32": 4, "INT32": 5, "BOOL": 7, "STRING": 8, "ARRAY": 9}

    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    def val(t, v, elem=None):
        if t == "UINT32":
            return struct.pack("<I", v)
        if t == "INT32":
            return struct.pack("<i", v)
        if t == "BOOL":
            return struct.pack("<B", 1 if v else 0)
        if t == "STRING":
            return s(v)
        return struct.pack("<IQ", code[elem], len(v)) + b"".join(val(elem, x) for x in v)

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for key, t, v, *elem in kv:
        out += s(key) + struct.pack("<I", code[t]) + val(t, v, *elem)
    with open(path, "wb") as f:
        f.write(out)


def harmony_model():
    """The tiny synthetic model with harmony's markers added to its vocabulary as control
    tokens and a template holding <|start|> and <|channel|> (llama.cpp's gpt-oss test)."""
    path = os.path.join(WORK, "tiny-harmony.gguf")
    if os.path.exists(path):
        return path
    dump = json.loads(subprocess.run([VELA, "gguf", "dump", tiny_model(2048), "--json",
                                      "--no-tensors"], check=True, capture_output=True).stdout)
    kv = []
    for key, v in dump["metadata"].items():
        if not key.startswith("tokenizer."):
            continue
        value = v["value"]
        if key == "tokenizer.ggml.tokens":
            value = value + MARKERS
        elif key == "tokenizer.ggml.token_type":
            value = value + [3] * len(MARKERS)  # CONTROL
        kv.append((key, v["type"], value, *v.get("array_types", [])))
    kv.append(("tokenizer.chat_template", "STRING",
               "{{- '<|start|>system<|message|>' }}{%- for m in messages -%}"
               "{{- '<|start|>' + m.role + '<|channel|>final<|message|>' + m.content -}}"
               "{%- endfor -%}", ))
    vocab = os.path.join(WORK, "harmony-vocab.gguf")
    gguf_vocab(vocab, kv)
    subprocess.run([VELA, "mkmodel", "-q", "--preset", "tiny", "--ctx", "2048", "--vocab", vocab,
                    "-o", path], check=True)
    return path


def gbnf(text):
    """A grammar whose only sentence is text."""
    return "root ::= " + json.dumps(text)


def serve(name, model, *flags):
    log = os.path.join(WORK, name + ".log")
    with open(log, "w") as f:
        p = subprocess.Popen([VELA, "serve", "-m", model, "--backend", "cpu", "-t", "2",
                              "--port", "0", "-np", "1", "-c", "2048", "--no-progress", *flags],
                             stdout=f, stderr=subprocess.STDOUT)
    port = wait_ready(p, log)
    yield port, openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none",
                              max_retries=0, timeout=120)
    stop(p)
    return log


@pytest.fixture(scope="module")
def server():
    yield from serve("harmony-server", tiny_model(2048), "--chat-template", "gpt-oss")


@pytest.fixture(scope="module")
def control_server():
    yield from serve("harmony-control-server", harmony_model())


def ask(client, text, max_tokens=400, extra=None, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=max_tokens,
        temperature=0, extra_body=dict(grammar=gbnf(text), **(extra or {})), **kw)


def test_whole_answer_splits_reasoning_and_content(server):
    _, client = server
    r = ask(client, HARMONY)
    m = r.choices[0].message
    assert m.content == ANSWER
    assert m.model_extra["reasoning_content"] == THINK
    assert r.choices[0].finish_reason == "stop"


def test_stream_sends_reasoning_then_content(server):
    _, client = server
    kinds, reasoning, content = [], "", ""
    for ch in ask(client, HARMONY, stream=True):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        rc = (d.model_extra or {}).get("reasoning_content")
        if rc:
            reasoning += rc
            kinds.append("r")
            assert not d.content, "a delta is reasoning or content, not both"
        if d.content:
            content += d.content
            kinds.append("c")
    assert reasoning == THINK and content == ANSWER
    assert "".join(kinds).lstrip("r").strip("c") == "", "reasoning deltas come first: " + \
        "".join(kinds)
    assert len(kinds) > 2, "streamed as it came, not at the end"


def test_reasoning_format_none_keeps_the_text(server):
    _, client = server
    text = HARMONY[:-len("<|return|>")]
    r = ask(client, text, extra={"reasoning_format": "none"})
    m = r.choices[0].message
    assert m.content == text
    assert "reasoning_content" not in (m.model_extra or {})


def test_final_only_and_cut_off_in_the_analysis(server):
    _, client = server
    r = ask(client, "<|channel|>final<|message|>" + ANSWER + "<|return|>")
    assert r.choices[0].message.content == ANSWER
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
    # Cut off by max_tokens: what was written of the analysis is reasoning, no content
    # before the final channel; some cut falls inside the analysis. (Here the markers are
    # text, several tokens each: a marker cut in half is text, as the parser keeps it.)
    inside = False
    for n in range(4, 80, 4):
        r = ask(client, HARMONY, max_tokens=n)
        m, finish = r.choices[0].message, r.choices[0].finish_reason
        thought = (m.model_extra or {}).get("reasoning_content", "")
        assert (THINK + "<|end|>").startswith(thought), thought
        if finish == "stop":
            break
        assert finish == "length"
        assert (ANSWER + "<|return|>").startswith(m.content), m.content
        inside |= 0 < len(thought) < len(THINK)
    assert inside


def test_bad_reasoning_format_is_a_400(server):
    port, _ = server
    status, body = request(port, "POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Hi"}],
                            "reasoning_format": "deepseek-legacy"})
    assert status == 400
    assert b"reasoning_format" in body


def test_prompt_is_the_harmony_template(server):
    port, _ = server
    status, body = request(port, "POST", "/apply-template",
                           {"messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Hi"}]})
    assert status == 200
    prompt = json.loads(body)["prompt"]
    assert prompt.startswith("<|start|>system<|message|>You are ChatGPT")
    assert prompt.endswith("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                           "<|start|>user<|message|>Hi<|end|><|start|>assistant")


def apply_template(port, **fields):
    """The prompt /apply-template renders for a user's "Hi" with the fields given."""
    status, body = request(port, "POST", "/apply-template",
                           dict(messages=[{"role": "user", "content": "Hi"}], **fields))
    assert status == 200, body
    return json.loads(body)["prompt"]


def n_tokens(port, text):
    """The tokens the server makes of text as it tokenizes a prompt (BOS as the vocabulary
    asks)."""
    status, body = request(port, "POST", "/tokenize", {"content": text, "add_special": True})
    assert status == 200, body
    return len(json.loads(body)["tokens"])


def test_reasoning_effort_reaches_the_prompt(server):
    """OpenAI's reasoning_effort and llama-server's chat_template_kwargs become the template's
    reasoning_effort and model_identity (the rendering itself is checked against jinja2 in
    tests/test_tokenizer_chat.c); the chat the engine runs has that prompt: as many prompt
    tokens as the rendered text has."""
    port, client = server
    medium = apply_template(port)
    assert "\n\nReasoning: medium\n\n" in medium
    high = apply_template(port, reasoning_effort="high")
    assert high == medium.replace("Reasoning: medium", "Reasoning: high")
    low = apply_template(port, chat_template_kwargs={"reasoning_effort": "low",
                                                     "model_identity": "You are Vela."})
    assert low.startswith("<|start|>system<|message|>You are Vela.\nKnowledge cutoff: 2024-06\n")
    assert low == medium.replace("Reasoning: medium", "Reasoning: low").replace(
        "You are ChatGPT, a large language model trained by OpenAI.", "You are Vela.")
    # the top-level field wins over the kwargs, as in llama-server
    assert apply_template(port, reasoning_effort="high",
                          chat_template_kwargs={"reasoning_effort": "low"}) == high
    for effort, text in (("high", high), ("low", low)):
        kw = ({"reasoning_effort": effort} if effort == "high" else
              {"extra": {"chat_template_kwargs": {"reasoning_effort": "low",
                                                  "model_identity": "You are Vela."}}})
        r = ask(client, HARMONY, max_tokens=4, **kw)
        assert r.usage.prompt_tokens == n_tokens(port, text)
    assert n_tokens(port, high) != n_tokens(port, low)


def test_bad_template_kwargs_are_a_400(server):
    port, _ = server
    cases = [
        ({"reasoning_effort": "max"},
         "'reasoning_effort' is \"max\"; expected \"low\", \"medium\" or \"high\""),
        ({"reasoning_effort": 1}, "'reasoning_effort' must be a string"),
        ({"chat_template_kwargs": "high"}, "'chat_template_kwargs' must be a JSON object"),
        ({"chat_template_kwargs": {"reasoning_effort": ["high"]}},
         "'chat_template_kwargs.reasoning_effort' must be a string"),
        ({"chat_template_kwargs": {"enable_thinking": False}},
         "'chat_template_kwargs': unknown key 'enable_thinking'"),
    ]
    for fields, msg in cases:
        status, body = request(port, "POST", "/v1/chat/completions",
                               dict(messages=[{"role": "user", "content": "Hi"}], **fields))
        assert status == 400, fields
        assert msg in json.loads(body)["error"]["message"], body


def test_server_template_kwargs_are_the_default(tmp_path):
    """--chat-template-kwargs: what a request without the fields gets; a request's own win."""
    gen = serve("harmony-kwargs-server", tiny_model(2048), "--chat-template", "gpt-oss",
                "--chat-template-kwargs", '{"reasoning_effort":"low","model_identity":"Srv."}')
    port, _ = next(gen)
    try:
        text = apply_template(port)
        assert text.startswith("<|start|>system<|message|>Srv.\nKnowledge cutoff")
        assert "\n\nReasoning: low\n\n" in text
        text = apply_template(port, reasoning_effort="high",
                              chat_template_kwargs={"model_identity": None})
        assert text.startswith("<|start|>system<|message|>You are ChatGPT, a large language")
        assert "\n\nReasoning: high\n\n" in text
    finally:
        next(gen, None)


def test_template_kwargs_a_template_does_not_read():
    """A template without the variable (chatml here) refuses it: at start for
    --chat-template-kwargs, with a 400 for a request, never dropped."""
    model = tiny_model(2048)
    p = subprocess.run([VELA, "serve", "-m", model, "--backend", "cpu", "--port", "0",
                        "--no-progress", "--chat-template", "chatml",
                        "--chat-template-kwargs", '{"reasoning_effort":"high"}'],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert ("'--chat-template-kwargs': the chat template 'chatml' has no variable "
            "reasoning_effort") in p.stdout + p.stderr
    gen = serve("chatml-kwargs-server", model, "--chat-template", "chatml")
    port, _ = next(gen)
    try:
        status, body = request(port, "POST", "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "Hi"}],
                                "reasoning_effort": "high"})
        assert status == 400
        assert ("'reasoning_effort': the chat template 'chatml' has no variable reasoning_effort"
                in json.loads(body)["error"]["message"]), body
    finally:
        next(gen, None)


def token_grammar(*parts):
    """GBNF of parts in a row: markers as token elements, other text as literals."""
    return "root ::= " + " ".join(p if p in MARKERS else json.dumps(p) for p in parts)


# The grammars end where the answer does: <|return|> ends the generation (the template's
# end of turn, an end-of-generation token), which a grammar cannot name.
def test_markers_as_control_tokens(control_server):
    port, client = control_server
    status, body = request(port, "GET", "/props")
    assert json.loads(body)["chat_template"] == "gpt-oss", "detected from the file's template"
    g = token_grammar("<|channel|>", "analysis", "<|message|>", THINK, "<|end|>", "<|start|>",
                      "assistant", "<|channel|>", "final", "<|message|>", ANSWER)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=400,
              temperature=0)
    r = client.chat.completions.create(extra_body={"grammar": g}, **kw)
    m = r.choices[0].message
    assert (m.content, m.model_extra.get("reasoning_content")) == (ANSWER, THINK)
    assert r.choices[0].finish_reason == "stop"
    reasoning, content = "", ""
    for ch in client.chat.completions.create(extra_body={"grammar": g}, stream=True, **kw):
        if ch.choices:
            reasoning += (ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            content += ch.choices[0].delta.content or ""
    assert (content, reasoning) == (ANSWER, THINK)
    # reasoning_format none: the raw text with the markers' text.
    r = client.chat.completions.create(extra_body={"grammar": g, "reasoning_format": "none"}, **kw)
    assert r.choices[0].message.content == HARMONY[:-len("<|return|>")]


# The same answer in the terminal (vela run --chat, vela chat), as llama-cli shows it: the
# reasoning between [Start thinking] and [End thinking] lines (dim only on a terminal), then
# the answer; with --reasoning-format none the text as it is.
SHOWN = "[Start thinking]\n\n" + THINK + "\n[End thinking]\n\n" + ANSWER


def terminal_grammar():
    return token_grammar("<|channel|>", "analysis", "<|message|>", THINK, "<|end|>", "<|start|>",
                         "assistant", "<|channel|>", "final", "<|message|>", ANSWER)


def test_run_chat_shows_reasoning_apart():
    base = [VELA, "run", "-m", harmony_model(), "--backend", "cpu", "-t", "2", "--chat", "-p", "Hi",
            "--temp", "0", "--grammar", terminal_grammar()]
    out = subprocess.run(base, check=True, capture_output=True, text=True).stdout
    assert out == SHOWN + "\n"
    out = subprocess.run(base + ["--reasoning-format", "none"], check=True, capture_output=True,
                         text=True).stdout
    assert out == HARMONY[:-len("<|return|>")] + "\n"


def test_chat_shows_reasoning_and_keeps_the_answer():
    out = subprocess.run([VELA, "chat", "-m", harmony_model(), "--backend", "cpu", "-t", "2",
                          "--temp", "0", "--no-history", "--grammar", terminal_grammar()],
                         input="Hi\nAgain\n", check=True, capture_output=True, text=True).stdout
    assert out == (SHOWN + "\n") * 2


def run_chat_prompt_tokens(*flags):
    """The prompt tokens `vela run --chat` reports for "Hi" on the tiny model as gpt-oss."""
    p = subprocess.run([VELA, "run", "-m", tiny_model(2048), "--backend", "cpu", "-t", "2",
                        "--chat", "--chat-template", "gpt-oss", "-p", "Hi", "-n", "1",
                        "--no-progress", *flags], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return int(re.search(r"prompt eval: .* / +(\d+) tokens", p.stderr).group(1))


def test_run_and_chat_take_template_kwargs(server):
    """run --chat renders the flags' variables (its prompt has the tokens of the server's
    rendering with the same fields); bad values are errors naming the flag."""
    port, _ = server
    kw = '{"reasoning_effort":"high","model_identity":"You are Vela."}'
    text = apply_template(port, chat_template_kwargs=json.loads(kw))
    assert run_chat_prompt_tokens("--chat-template-kwargs", kw) == n_tokens(port, text)
    assert run_chat_prompt_tokens() == n_tokens(port, apply_template(port))
    # llama.cpp's --reasoning-effort: the same variable; the later flag wins, default resets
    high = n_tokens(port, apply_template(port, reasoning_effort="high"))
    assert run_chat_prompt_tokens("--reasoning-effort", "high") == high
    assert run_chat_prompt_tokens("--chat-template-kwargs", '{"reasoning_effort":"low"}',
                                  "--reasoning-effort", "high") == high
    assert run_chat_prompt_tokens("--reasoning-effort", "high", "--reasoning-effort",
                                  "default") == run_chat_prompt_tokens()
    bad = [
        (["run", "--chat", "-p", "Hi", "--chat-template-kwargs", "{reasoning_effort: high}"], 2,
         "vela run: '--chat-template-kwargs': '{reasoning_effort: high}' is not valid JSON; "
         "expected an object such as '{\"reasoning_effort\":\"high\"}'"),
        (["run", "--chat", "-p", "Hi", "--chat-template-kwargs", '{"reasoning_effort":"xhigh"}'],
         2, "'--chat-template-kwargs.reasoning_effort' is \"xhigh\"; expected"),
        (["run", "-p", "Hi", "--chat-template-kwargs", '{"reasoning_effort":"low"}'], 2,
         "--chat-template-kwargs, --reasoning-effort and --system go with --chat"),
        (["run", "--chat", "-p", "Hi", "--reasoning-effort", "xhigh"], 2,
         "vela run: --reasoning-effort: 'xhigh' is not a reasoning effort (low, medium, high, "
         "default)"),
        (["chat", "--chat-template", "chatml", "--reasoning-effort", "low"], 1,
         "'--reasoning-effort': the chat template 'chatml' has no variable reasoning_effort"),
        (["run", "--chat", "-p", "Hi", "--chat-template", "chatml", "--chat-template-kwargs",
          '{"reasoning_effort":"low"}'], 1,
         "the chat template 'chatml' has no variable reasoning_effort"),
        (["chat", "--chat-template", "chatml", "--chat-template-kwargs",
          '{"model_identity":"X"}'], 1,
         "the chat template 'chatml' has no variable model_identity"),
        (["chat", "--chat-template-kwargs", '{"enable_thinking":true}'], 2,
         "unknown key 'enable_thinking'"),
    ]
    for args, rc, msg in bad:
        p = subprocess.run([VELA, *args[:1], "-m", tiny_model(2048), "--backend", "cpu",
                            "--no-progress", *args[1:]], capture_output=True, text=True,
                           input="", timeout=120)
        assert p.returncode == rc, (args, p.returncode, p.stderr)
        assert msg in p.stderr, (args, p.stderr)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def test_tool_call_through_the_commentary_channel(control_server):
    """A call as gpt-oss writes it (the grammar ends where <|call|> would: it ends the
    generation) comes back as tool_calls, its analysis as reasoning_content; streamed, the
    reasoning first and the call as one delta at the end."""
    _, client = control_server
    args = '{"city":"Paris"}'
    g = token_grammar("<|channel|>", "analysis", "<|message|>", "Need weather.", "<|end|>",
                      "<|start|>", "assistant", "<|channel|>", "commentary to=functions.get_weather ",
                      "<|constrain|>", "json", "<|message|>", args)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
              tools=[WEATHER], max_tokens=400, temperature=0, extra_body={"grammar": g})
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.model_extra["reasoning_content"] == "Need weather."
    assert not c.message.content
    assert len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("get_weather", args)
    reasoning, names, finish = "", [], None
    for ch in client.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        assert not d.content
        names += [t.function.name for t in d.tool_calls or []]
        finish = ch.choices[0].finish_reason or finish
    assert (reasoning, names, finish) == ("Need weather.", ["get_weather"], "tool_calls")
    # The call and its result go back into the next prompt as the template writes them.
    port, _ = control_server
    status, body = request(port, "POST", "/apply-template", {
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": call.id, "type": "function",
                          "function": {"name": "get_weather", "arguments": args}}]},
                     {"role": "tool", "tool_call_id": call.id, "content": "21 C"}],
        "tools": [WEATHER]})
    assert status == 200, body
    assert json.loads(body)["prompt"].endswith(
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|><|start|>functions.get_weather to=assistant<|channel|>'
        'commentary<|message|>"21 C"<|end|><|start|>assistant')
