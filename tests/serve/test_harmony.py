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
