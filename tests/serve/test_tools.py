"""Tool calling in `vela serve` with the official openai client (a server
of its own on a synthetic model: the text is
gibberish, so these tests check the request and response shapes, the 400s,
and a conversation that carries calls and results; the prompt text itself
is checked against the models' templates in tests/test_serve_tools.c)."""
import json
import os
import subprocess

import openai
import pytest

from serve_helpers import VELA, WORK, stop, tiny_model, wait_ready

MODEL = "tiny"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client():
    """A server of its own: one slot of 2048 cells (the tools' system text is long in the
    synthetic model's small vocabulary)."""
    log = os.path.join(WORK, "tools-server.log")
    with open(log, "w") as f:
        p = subprocess.Popen([VELA, "serve", "-m", tiny_model(2048), "--backend", "cpu", "-t", "2",
                              "--port", "0", "-np", "1", "-c", "2048", "--no-progress"],
                             stdout=f, stderr=subprocess.STDOUT)
    port = wait_ready(p, log)
    yield openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none",
                        max_retries=0, timeout=120)
    stop(p)


def test_tools_auto_answers(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER], max_tokens=8, temperature=0)
    c = r.choices[0]
    # gibberish is content: no call, the usual end
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.finish_reason == "tool_calls":
        call = c.message.tool_calls[0]
        assert call.function.name and json.loads(call.function.arguments) is not None
    else:
        assert c.message.tool_calls in (None, [])
        assert isinstance(c.message.content, str)


def test_a_conversation_with_calls_and_results(client):
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER],
                                       max_tokens=6, temperature=0)
    assert r.usage.prompt_tokens > 60, "the tools, the call and the result are in the prompt"
    s = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER],
                                       max_tokens=6, temperature=0, stream=True)
    text, finish = "", None
    for ch in s:
        d = ch.choices[0].delta
        text += d.content or ""
        finish = ch.choices[0].finish_reason or finish
    assert finish in ("stop", "length", "tool_calls")
    if finish != "tool_calls":
        assert text == (r.choices[0].message.content or ""), "the stream holds nothing back at the end"


@pytest.mark.parametrize("kw,needle", [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "'tools[0].function.name'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "not in 'tools'"),
    ({"tool_choice": "required"}, "'tools' is empty"),
])
def test_bad_tool_fields_are_400s(client, kw, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **kw)
    assert needle in str(ei.value)


def test_forced_calls_are_refused_until_grammars_constrain_them(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
            tool_choice="required", max_tokens=2)
    assert "grammar-constrained sampling" in str(ei.value)
