"""The OpenAI contract (issue 44): every sampling field the API promises
changes the output as it says, and every field the server does not honour is
a 400 naming it, never silently dropped. Through the official `openai`
client; the refused fields go in `extra_body`, exactly as a client sends
them."""
import collections
import json

import openai
import pytest

from conftest import in_parallel

PROMPTS = [f"Write one sentence about {w}." for w in (
    "cats", "dogs", "rain", "the sea", "bread", "winter", "music", "trains", "a forest", "the moon", "coffee",
    "a library", "bicycles", "snow", "a garden", "the desert", "apples", "clocks", "a river", "birds", "tea",
    "mountains", "a city", "books", "the wind", "fire", "summer", "a bridge", "stars", "a market", "chess",
    "the night")]


def chat(client, content, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], **kw)


def refused(client, field, status=400, **kw):
    """The error a request gets; it must name field."""
    with pytest.raises(openai.APIStatusError) as e:
        chat(client, "Hi", max_tokens=2, **kw)
    assert e.value.status_code == status, e.value
    assert field in e.value.message, e.value.message
    return e.value.message


REPEATS = "one two one two one two one two one two one two"


def complete(client, **kw):
    kw.setdefault("max_tokens", 24)
    return client.completions.create(model="m", prompt=REPEATS, temperature=0, **kw).choices[0].text


def test_a_greedy_text_that_repeats_changes_under_each_penalty(client):
    plain = complete(client)
    words = plain.split()
    assert len(words) >= 6 and len(set(words)) <= 3, f"the greedy text does not repeat: {plain!r}"
    assert complete(client) == plain
    for kw in ({"frequency_penalty": 2}, {"presence_penalty": 2}, {"extra_body": {"repeat_penalty": 1.5}}):
        got = complete(client, **kw)
        assert got != plain, kw
    # a penalty of 0 and repeat_penalty 1 are off: the same tokens
    assert complete(client, frequency_penalty=0, presence_penalty=0, extra_body={"repeat_penalty": 1}) == plain
    # a negative frequency penalty makes the repetition only stronger
    neg = complete(client, frequency_penalty=-2).split()
    assert len(set(neg)) <= len(set(words))


def test_n_choices_each_keep_their_own_history(client):
    r = client.completions.create(model="m", prompt=REPEATS, temperature=0, max_tokens=24, n=3,
                                  frequency_penalty=2)
    assert len({c.text for c in r.choices}) == 1   # greedy: each choice alone gives the same penalised text
    assert r.choices[0].text == complete(client, frequency_penalty=2)


def tokens_of(reply):
    return [t.token for t in reply.choices[0].logprobs.content]


def test_logit_bias_minus_100_removes_a_token_from_32_greedy_replies(server, client):
    base = in_parallel(lambda p: chat(client, p, logprobs=True), PROMPTS)
    counts = collections.Counter(t for r in base for t in tokens_of(r))
    piece, times = counts.most_common(1)[0]
    status, tok = server.post("/tokenize", {"content": piece})
    assert status == 200 and len(tok["tokens"]) == 1, (piece, tok)
    tid = tok["tokens"][0]
    assert times >= 8, counts.most_common(3)
    biased = in_parallel(lambda p: chat(client, p, logprobs=True, logit_bias={str(tid): -100}), PROMPTS)
    for p, r in zip(PROMPTS, biased):
        assert piece not in tokens_of(r), (p, tokens_of(r))
    # +100 on a token makes every greedy step choose it
    r = chat(client, PROMPTS[0], logprobs=True, max_tokens=4, logit_bias={str(tid): 100})
    assert tokens_of(r) == [piece] * 4


def test_min_p_and_top_k_as_extensions(client):
    # min_p 1 keeps only the best token: sampling at any temperature is greedy
    greedy = chat(client, PROMPTS[1]).choices[0].message.content
    hot = chat(client, PROMPTS[1], temperature=1.5, seed=3, extra_body={"min_p": 1}).choices[0].message.content
    assert hot == greedy
    hot = chat(client, PROMPTS[1], temperature=1.5, seed=3, extra_body={"top_k": 1}).choices[0].message.content
    assert hot == greedy


@pytest.mark.parametrize("field,value", [
    ("presence_penalty", 2.5), ("presence_penalty", -3), ("frequency_penalty", 5), ("frequency_penalty", "1"),
    ("min_p", 1.5), ("repeat_penalty", 0), ("repeat_penalty", 11), ("repeat_last_n", -2), ("top_k", -1),
    ("logit_bias", {"33": -101}), ("logit_bias", {"33": 100.5}), ("logit_bias", {"x": 1}),
    ("logit_bias", {"-1": 1}), ("logit_bias", {"99999999": 1}), ("logit_bias", {"33": "a"}), ("logit_bias", [1]),
])
def test_out_of_range_values_get_a_400_naming_the_field(client, field, value):
    refused(client, field, extra_body={field: value})


@pytest.mark.parametrize("field,value", [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "a"}}}]),
    ("tool_choice", "auto"), ("functions", [{"name": "f"}]), ("function_call", "auto"),
    ("parallel_tool_calls", 1), ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}), ("reasoning_effort", "low"), ("store", True),
    ("service_tier", "flex"), ("web_search_options", {}), ("verbosity", "low"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}}),
    ("response_format", {"type": "bogus"}), ("mirostat", 2), ("grammar", "root ::= \"a\""), ("echo", True),
])
def test_each_refused_field_gets_a_400_naming_it(client, field, value):
    refused(client, field, extra_body={field: value})


JSON_PROMPTS = [
    "Describe a cat as JSON with name and age.", "Give me a JSON object of three fruits and their colours.",
    "Return a JSON object describing the weather today.", "List two cities and their countries as JSON.",
    "Make a JSON object for a book: title, author, year.", "Answer in JSON: what is 2 + 2?",
    "Output a JSON object with a key greeting.", "Describe a car in JSON.", "Hello!", "Write a poem."]


def parses_as_object(text):
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_json_object_replies_parse(client):
    """Every reply that ends by itself is one JSON object. SmolLM2-135M, greedy,
    sometimes nests or lists keys until max_tokens: those end "length", cut
    inside the object (as OpenAI's do); most end on their own."""
    stopped = 0
    replies = in_parallel(lambda p: chat(client, p, max_tokens=200, response_format={"type": "json_object"}),
                          JSON_PROMPTS)
    for prompt, c in zip(JSON_PROMPTS, (r.choices[0] for r in replies)):
        if c.finish_reason == "stop":
            stopped += 1
            assert parses_as_object(c.message.content), (prompt, c.message.content)
        else:
            assert c.finish_reason == "length" and not parses_as_object(c.message.content)
    assert stopped >= 6, stopped
    # without the constraint the same model writes prose
    plain = [r.choices[0].message.content for r in in_parallel(lambda p: chat(client, p, max_tokens=60),
                                                               JSON_PROMPTS[-3:])]
    assert not any(parses_as_object(t) for t in plain), plain


def test_json_object_with_sampling_and_n_each_choice_parses(client):
    r = chat(client, JSON_PROMPTS[0], max_tokens=200, temperature=1.0, seed=5, n=3,
             response_format={"type": "json_object"})
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict), c.message.content
    assert sum(c.finish_reason == "stop" for c in r.choices) >= 2


def test_accepted_values_of_partial_fields_and_identifiers_pass(client):
    r = chat(client, "Hi", max_tokens=2, user="u1", store=False, tool_choice="none", modalities=["text"],
             response_format={"type": "text"}, service_tier="auto", metadata={"k": "v"})
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize("field,value", [
    ("echo", True), ("best_of", 2), ("suffix", "end"), ("stream_options", {"include_usage": 1}), ("top_logprobs", 1)])
def test_completions_refuse_what_they_do_not_honour(client, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="Hi", max_tokens=2, extra_body={field: value})
    assert field in e.value.message, e.value.message


LIST = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "Water boils at"]


def test_a_list_of_prompts_gives_each_the_choices_it_gets_alone(client):
    """OpenAI's list of prompts: prompt p's n choices at indices p*n .. p*n+n-1,
    each the text it gets as a request of its own (greedy), usage the sums."""
    alone = [client.completions.create(model="m", prompt=p, temperature=0, max_tokens=12, logprobs=1)
             for p in LIST]
    r = client.completions.create(model="m", prompt=LIST, temperature=0, max_tokens=12, n=2, logprobs=1)
    assert [c.index for c in r.choices] == list(range(2 * len(LIST)))
    for i, c in enumerate(r.choices):
        one = alone[i // 2].choices[0]
        assert c.text == one.text and c.finish_reason == one.finish_reason, (i, c.text, one.text)
        assert c.logprobs.tokens == one.logprobs.tokens
        assert c.logprobs.token_logprobs == pytest.approx(one.logprobs.token_logprobs, abs=1e-5)
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    # streamed: the same texts, piece by piece under their indices, and the same usage at the end
    texts = collections.defaultdict(str)
    usage = None
    for ch in client.completions.create(model="m", prompt=LIST, temperature=0, max_tokens=12, n=2, stream=True,
                                        stream_options={"include_usage": True}):
        for c in ch.choices:
            texts[c.index] += c.text
        usage = ch.usage or usage
    assert [texts[i] for i in range(2 * len(LIST))] == [c.text for c in r.choices]
    assert usage.prompt_tokens == r.usage.prompt_tokens and usage.completion_tokens == r.usage.completion_tokens


def test_a_list_of_token_id_lists_is_a_list_of_prompts(client, server):
    ids = []
    for p in LIST[:2]:
        st, body = server.post("/tokenize", {"content": p})
        assert st == 200, body
        ids.append(body["tokens"])
    r = client.completions.create(model="m", prompt=ids, temperature=0, max_tokens=8)
    for p, c in zip(ids, r.choices):
        assert c.text == client.completions.create(model="m", prompt=p, temperature=0, max_tokens=8).choices[0].text


def test_a_seed_seeds_each_prompt_of_a_list_alike(client):
    kw = dict(model="m", temperature=1.0, max_tokens=12, seed=11)
    one = client.completions.create(prompt=LIST[0], **kw).choices[0].text
    r = client.completions.create(prompt=[LIST[0], LIST[1], LIST[0]], **kw)
    assert r.choices[0].text == one and r.choices[2].text == one


@pytest.mark.parametrize("prompt,n,words", [
    (["a", [1, 2]], 1, "not a mix"),
    (["a", ""], 1, "prompt 1 of the list"),
    ([[1], []], 1, "empty list"),
    (["x"] * 129, 1, "at most 128"),
    (["x"] * 9, 16, "at most 128"),
    ([], 1, "'prompt'"),
])
def test_a_bad_list_of_prompts_is_a_400_saying_what(client, prompt, n, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=prompt, max_tokens=2, n=n)
    assert words in e.value.message, e.value.message


def test_a_list_of_prompts_takes_no_session(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=["a", "b"], max_tokens=2, extra_body={"session": "s1"})
    # refused for the list itself, whether or not the server keeps sessions
    assert "'session'" in e.value.message and "not a list" in e.value.message, e.value.message


@pytest.mark.parametrize("message,field", [
    ({"role": "wizard", "content": "x"}, "messages[].role"),
    ({"role": "function", "content": "x", "name": "f"}, "messages[].role"),
    ({"role": "tool", "content": "x"}, "messages[].tool_call_id"),
    ({"role": "user", "content": "x", "name": "bob"}, "messages[].name"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                             "function": {"name": "f", "arguments": {}}}]},
     "messages[].tool_calls"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}, "image_url"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]},
     "input_audio"),
])
def test_messages_the_server_cannot_honour_get_a_400(client, message, field):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[message], max_tokens=2)
    assert field in e.value.message, e.value.message


def test_developer_is_system(client):
    def reply(role):
        return client.chat.completions.create(model="m", max_tokens=12, temperature=0, messages=[
            {"role": role, "content": "Answer in French."}, {"role": "user", "content": "Hello"}]).choices[0]
    assert reply("developer").message.content == reply("system").message.content


def test_embeddings_answer_501_saying_why(client):
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(model="m", input="hello")
    assert e.value.status_code == 501 and "embedding" in e.value.message
