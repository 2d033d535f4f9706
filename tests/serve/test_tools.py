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


def serve_tools(name, *flags):
    """A server of its own: one slot of 2048 cells (the tools' system text is long in the
    synthetic model's small vocabulary); yields its client."""
    log = os.path.join(WORK, name + ".log")
    with open(log, "w") as f:
        p = subprocess.Popen([VELA, "serve", "-m", tiny_model(2048), "--backend", "cpu", "-t", "2",
                              "--port", "0", "-np", "1", "-c", "2048", "--no-progress", *flags],
                             stdout=f, stderr=subprocess.STDOUT)
    port = wait_ready(p, log)
    yield openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none",
                        max_retries=0, timeout=120)
    stop(p)


@pytest.fixture(scope="module")
def client():
    yield from serve_tools("tools-server")


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


UNIT_TOOL = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "description": "Choose the temperature unit",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}},
            "required": ["unit"],
        },
    },
}


def test_required_tool_choice_always_calls(client):
    """tool_choice required / named: the grammar makes the answer a call that parses, even
    from a model of random weights."""
    for choice in ["required", {"type": "function", "function": {"name": "set_unit"}}]:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Celsius please"}],
            tools=[WEATHER, UNIT_TOOL] if choice == "required" else [UNIT_TOOL, WEATHER],
            tool_choice=choice, max_tokens=300, temperature=0.8, seed=3)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (choice, c)
        call = c.message.tool_calls[0]
        args = json.loads(call.function.arguments)
        if choice != "required" or call.function.name == "set_unit":
            assert call.function.name == "set_unit" and args["unit"] in ("c", "f"), call
        else:
            assert call.function.name == "get_weather" and isinstance(args["city"], str), call
        assert call.id and call.type == "function"


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}


def test_response_format_json_schema(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A color?"}], max_tokens=200,
            temperature=0.8, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "c", "strict": True, "schema": SCHEMA}})
        c = r.choices[0]
        assert c.finish_reason == "stop", c
        v = json.loads(c.message.content)
        assert set(v) == {"ok", "color"} and isinstance(v["ok"], bool), v
        assert v["color"] in ("red", "green", "blue"), v
    # streamed: the same text as the whole answer
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "A color?"}], max_tokens=200,
              temperature=0, response_format={"type": "json_object"})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts = "".join(ch.choices[0].delta.content or ""
                    for ch in client.chat.completions.create(stream=True, **kw))
    assert parts == whole and isinstance(json.loads(whole), dict), (parts, whole)


def test_grammar_field_on_completions(client):
    r = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=20,
                                  extra_body={"grammar": "root ::= \"yes\" | \"no\""})
    assert r.choices[0].text in ("yes", "no"), r.choices[0].text
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                  extra_body={"grammar": "root ::= undefined_rule"})
    assert "'grammar'" in str(ei.value) and "undefined_rule" in str(ei.value)


@pytest.fixture(scope="module")
def mistral_client():
    """Chats formatted with Mistral 7B v0.3's template: calls as [TOOL_CALLS] [...] with
    9-character ids."""
    yield from serve_tools("tools-mistral-server", "--chat-template", "mistral-v3")


def test_mistral_forced_call_round_trip(mistral_client):
    """A forced call in Mistral's format parses into tool_calls whose ids the template
    takes (9 letters and digits); sent back with its result, the conversation is served."""
    r = mistral_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Celsius please"}],
        tools=[UNIT_TOOL], tool_choice="required", max_tokens=200, temperature=0.8, seed=5)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    call = c.message.tool_calls[0]
    assert call.function.name == "set_unit", call
    assert json.loads(call.function.arguments)["unit"] in ("c", "f"), call
    assert len(call.id) == 9 and call.id.isalnum(), call.id
    r = mistral_client.chat.completions.create(
        model=MODEL, tools=[UNIT_TOOL], max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": "Celsius please"},
                  {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "done"}])
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError) as e:
        mistral_client.chat.completions.create(
            model=MODEL, tools=[UNIT_TOOL], max_tokens=4,
            messages=[{"role": "user", "content": "Celsius please"},
                      {"role": "tool", "content": "done"}])
    assert "tool_call_id" in str(e.value)
