"""Qwen3's enable_thinking switch through chat_template_kwargs (the vLLM and
llama-server field), with the official openai client.

The model is a tiny synthetic Qwen3 (scripts/synth_model.py: random weights,
SmolLM2's vocabulary with <think> and </think> added, Qwen3's template with
the switch). The reference for each prompt is the file's own template text
rendered by jinja2, sent to /v1/completions with parse_special: the chat
request must see the same prompt (its token count) and, greedy, give the
same tokens."""
import functools
import os
import subprocess
import sys

import gguf
import jinja2
import openai
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import ROOT, Server

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen3") / "qwen3-tiny.gguf")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "synth_model.py"), "--preset", "qwen3-0.6b",
                    "--layers", "2", "--embd", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "32",
                    "--ffn", "128", "--vocab", "49200", "--type", "F16", "-o", path], check=True, capture_output=True)
    s = Server("-t", "2", "--ctx", "512", model=path)
    yield s, path
    s.stop()


@functools.lru_cache(maxsize=None)   # GGUFReader parses the whole 49k-token vocabulary
def template_of(path):
    f = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode()


def rendered(path, **kw):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template_of(path)).render(messages=MESSAGES, add_generation_prompt=True, **kw)


def client_of(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_switch_renders_the_prompt_the_template_does(qwen3):
    server, path = qwen3
    c = client_of(server)
    off = rendered(path, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")   # what the switch is for
    for kw, text in ((None, rendered(path)), (True, rendered(path, enable_thinking=True)), (False, off)):
        extra = {} if kw is None else {"chat_template_kwargs": {"enable_thinking": kw}}
        chat = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, temperature=0, extra_body=extra)
        ref = c.completions.create(model="m", prompt=text, max_tokens=8, temperature=0,
                                   extra_body={"parse_special": True})
        assert chat.usage.prompt_tokens == ref.usage.prompt_tokens, kw
        assert chat.choices[0].message.content == ref.choices[0].text, kw
    # the empty think block is four tokens: <think>, "\n\n", </think>, "\n\n"
    status, ids = server.post("/tokenize", {"content": off, "parse_special": True})
    status2, ids2 = server.post("/tokenize", {"content": rendered(path), "parse_special": True})
    assert status == status2 == 200 and len(ids["tokens"]) == len(ids2["tokens"]) + 4


def test_null_kwargs_are_the_default(qwen3):
    server, path = qwen3
    c = client_of(server)
    a = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, temperature=0)
    for extra in ({"chat_template_kwargs": {}}, {"chat_template_kwargs": None},
                  {"chat_template_kwargs": {"enable_thinking": None}}):
        b = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, temperature=0, extra_body=extra)
        assert b.usage.prompt_tokens == a.usage.prompt_tokens and b.choices[0].message.content == a.choices[0].message.content


@pytest.mark.parametrize("kwargs, named", [
    ({"enable_thinking": "false"}, "chat_template_kwargs.enable_thinking"),
    ({"enable_thinking": 0}, "chat_template_kwargs.enable_thinking"),
    ({"enable_thinking": False, "tools_in_system": True}, "chat_template_kwargs.tools_in_system"),
    ({"reasoning_effort": "low"}, "chat_template_kwargs.reasoning_effort"),
    ([], "chat_template_kwargs"),
])
def test_what_is_not_honoured_is_refused_by_name(qwen3, kwargs, named):
    server, _ = qwen3
    with pytest.raises(openai.BadRequestError) as e:
        client_of(server).chat.completions.create(model="m", messages=MESSAGES, max_tokens=4,
                                                  extra_body={"chat_template_kwargs": kwargs})
    assert e.value.status_code == 400 and f"'{named}'" in str(e.value)
    # not a field of /v1/completions
    status, body = server.post("/v1/completions", {"prompt": "x", "chat_template_kwargs": {"enable_thinking": True}})
    assert status == 400 and "'chat_template_kwargs'" in body["error"]["message"]


def test_a_template_without_the_switch_refuses_it(client):
    """SmolLM2's ChatML has no enable_thinking: asking it not to think (or to
    think) would change nothing, so the request is refused, not answered as if
    it had been honoured."""
    for value in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": value}})
        assert e.value.status_code == 400 and "'chat_template_kwargs.enable_thinking'" in str(e.value)
        assert "no thinking switch" in str(e.value)
