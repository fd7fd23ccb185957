"""Structured output and tool calls (issue 44), through the official `openai`
client: json_schema replies validate against their schema (PyPI `jsonschema`,
not the server's grammar, is the judge), unsupported schema keywords are a
400 naming them, tool_choice "required" and a named function always give a
call whose arguments validate against the function's parameters, streamed
as OpenAI streams them, and tool turns are accepted in the history."""
import json

import jsonschema
import openai
import pytest

from conftest import in_parallel

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "hobbies": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    "pet": {"enum": ["cat", "dog", "none"]}, "height": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    "member": {"type": "boolean"}},
    "required": ["name", "age", "hobbies", "pet", "height", "member"], "additionalProperties": False}

PROMPTS = [
    "Describe a person as JSON.", "Invent a chess player.", "Tell me about your neighbour.", "Who wrote Hamlet?",
    "Create a profile for a gardener.", "Hello!", "Give me a random character for a novel.", "Describe a child.",
    "Write a poem about the sea.", "Make up a pilot."]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

TOOL_PROMPTS = ["What is the weather in Paris?", "Add 2 and 3.", "How warm is it in Tokyo?", "Hi there!",
                "What is 10 plus 32?", "Is it raining in London?"]


def ask(client, content, **kw):
    kw.setdefault("max_tokens", 120)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], **kw)


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def test_json_schema_replies_validate(client):
    stopped = 0
    replies = in_parallel(lambda p: ask(client, p, max_tokens=200, response_format=schema_format(PERSON)), PROMPTS)
    for c in (r.choices[0] for r in replies):
        if c.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(c.message.content), PERSON)
        else:   # cut by max_tokens inside the document
            assert c.finish_reason == "length"
    assert stopped >= 8, stopped


def test_json_schema_with_n_each_choice_keeps_its_own_document(client):
    r = ask(client, PROMPTS[0], max_tokens=200, temperature=1.0, seed=7, n=3, response_format=schema_format(PERSON))
    done = [c for c in r.choices if c.finish_reason == "stop"]
    for c in done:
        jsonschema.validate(json.loads(c.message.content), PERSON)
    assert len(done) >= 2


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "string", "pattern": "^a"}, "pattern"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, "format"),
    ({"$ref": "#/$defs/p", "$defs": {"p": {"type": "string"}}}, "$ref"),
    ({"type": "integer", "minimum": 3}, "minimum"),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties"),
    ({"oneOf": [{"type": "string"}]}, "oneOf"),
])
def test_an_unsupported_schema_keyword_gets_a_400_naming_it(client, schema, keyword):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "Hi", max_tokens=2, response_format=schema_format(schema))
    assert f"'{keyword}'" in e.value.message and "response_format.json_schema.schema" in e.value.message, e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "Hi", max_tokens=2, tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}])
    assert f"'{keyword}'" in e.value.message and "tools[0].function.parameters" in e.value.message, e.value.message


def check_call(call, name=None):
    assert call.type == "function" and call.id
    assert call.function.name in PARAMS and (name is None or call.function.name == name)
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_tool_choice_required_yields_a_call_whose_arguments_validate(client):
    for prompt in TOOL_PROMPTS:
        c = ask(client, prompt, tools=TOOLS, tool_choice="required").choices[0]
        assert c.finish_reason == "tool_calls", (prompt, c)
        assert c.message.content is None and len(c.message.tool_calls) == 1
        check_call(c.message.tool_calls[0])


def test_a_named_function_is_called(client):
    for prompt in TOOL_PROMPTS[:3]:
        c = ask(client, prompt, tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "add"}}).choices[0]
        assert c.finish_reason == "tool_calls"
        check_call(c.message.tool_calls[0], "add")


def reassemble(stream):
    """Tool calls and content from OpenAI-style deltas, per choice."""
    calls, content, finish = {}, {}, {}
    for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.content:
                content[ch.index] = content.get(ch.index, "") + ch.delta.content
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(ch.index, {}).setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    assert slot["id"] is None, "the id comes once"
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    assert not slot["name"] and not slot["arguments"], "the name comes first, once"
                    slot["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    assert slot["name"], "arguments after the name"
                    slot["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    return calls, content, finish


def test_streamed_tool_calls_reassemble_to_calls_that_validate(client):
    def streamed_and_whole(case):
        prompt, choice = case
        return (reassemble(ask(client, prompt, tools=TOOLS, tool_choice=choice, stream=True)),
                ask(client, prompt, tools=TOOLS, tool_choice=choice).choices[0].message.tool_calls[0])
    cases = [(p, c) for p in TOOL_PROMPTS[:4] for c in ("required", {"type": "function", "function": {"name": "get_weather"}})]
    for (prompt, _), ((calls, content, finish), whole) in zip(cases, in_parallel(streamed_and_whole, cases)):
        assert finish == {0: "tool_calls"} and not content.get(0), (prompt, content)
        (call,) = calls[0].values()
        assert call["id"].startswith("call_") and call["name"] in PARAMS
        jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])
        # the same call as the reply that does not stream
        assert whole.function.name == call["name"]
        assert json.loads(whole.function.arguments) == json.loads(call["arguments"])


def test_n_choices_each_make_their_own_call(client):
    r = ask(client, TOOL_PROMPTS[0], tools=TOOLS, tool_choice="required", n=3, temperature=1.0, seed=4)
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        check_call(c.message.tool_calls[0])
    calls, _, finish = reassemble(ask(client, TOOL_PROMPTS[1], tools=TOOLS, tool_choice="required", n=2,
                                      temperature=1.0, seed=4, stream=True))
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    for i in (0, 1):
        (call,) = calls[i].values()
        jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])


def test_auto_and_none_reply_as_text_or_calls(client):
    for choice in ("auto", "none"):
        for prompt in TOOL_PROMPTS[:3]:
            c = ask(client, prompt, tools=TOOLS, tool_choice=choice, max_tokens=60).choices[0]
            if c.message.tool_calls:
                assert choice == "auto" and c.finish_reason == "tool_calls"
                check_call(c.message.tool_calls[0])
            else:
                assert c.message.content is not None


def test_tool_turns_are_accepted_in_the_history(client):
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"}]
    r = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=30, temperature=0)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls
    # the tool's result reaches the prompt: the prompt is longer with it than without it
    shorter = client.chat.completions.create(model="m", messages=history[:2], tools=TOOLS, max_tokens=1)
    assert r.usage.prompt_tokens > shorter.usage.prompt_tokens
    # without tools in the request, the history alone is accepted too
    r = client.chat.completions.create(model="m", messages=history, max_tokens=8, temperature=0)
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize("kw,field", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "twice"),
])
def test_bad_tool_requests_get_a_400_naming_the_field(client, kw, field):
    kw.setdefault("tools", TOOLS)
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "Hi", max_tokens=2, **kw)
    assert field in e.value.message, e.value.message
