"""enable_thinking (Qwen3's template switch) through kvcache.Model, on a tiny
synthetic Qwen3 written by scripts/synth_model.py. The reference is the
file's own template rendered by jinja2: apply_chat_template must give its
text, and chat() greedy the tokens of that text given as token ids."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

gguf = pytest.importorskip("gguf", reason="pip install gguf (python/requirements-test.txt)")
jinja2 = pytest.importorskip("jinja2", reason="pip install jinja2 (python/requirements-test.txt)")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

SMOL = os.environ.get("KVCACHE_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen3") / "qwen3-tiny.gguf")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "synth_model.py"), "--preset", "qwen3-0.6b",
                    "--layers", "2", "--embd", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "32",
                    "--ffn", "128", "--vocab", "49200", "--type", "F16", "-o", path], check=True, capture_output=True,
                   timeout=300)
    f = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    tmpl = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        bytes(f.parts[f.data[0]]).decode())
    import kvcache
    with kvcache.Model(path, ctx=256, threads=1, parallel=2) as m:
        yield m, lambda **kw: tmpl.render(messages=MSGS, add_generation_prompt=True, **kw)


def test_apply_chat_template_renders_the_switch_as_the_template(qwen3):
    m, render = qwen3
    assert m.apply_chat_template(MSGS) == render()
    assert m.apply_chat_template(MSGS, enable_thinking=True) == render(enable_thinking=True)
    off = m.apply_chat_template(MSGS, enable_thinking=False)
    assert off == render(enable_thinking=False) and off.endswith("assistant\n<think>\n\n</think>\n\n")


def test_chat_with_the_switch_is_the_rendered_prompt(qwen3):
    m, render = qwen3
    for kw in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
        ids = m.tokenize(render(**kw), add_special=True, special=True)
        want = m.complete(tokens=ids, max_tokens=6, temperature=0)
        got = m.complete(messages=MSGS, max_tokens=6, temperature=0, **kw)
        assert got.tokens == want.tokens and got.text == want.text, kw
        r = m.create_chat_completion(MSGS, max_tokens=6, temperature=0, **kw)
        assert r["usage"]["prompt_tokens"] == len(ids)


def chat_tokens(m, thinking, n_prev=0, add_bos=1):
    """kve_chat_tokenize's ids for MSGS (the assistant's turn opened)."""
    import ctypes
    arr, _keep = m._messages(MSGS)
    buf, n = m._sized(m._lib.kve_chat_tokenize, "kve_chat_tokenize", m._model, arr, len(MSGS), n_prev, 1, add_bos,
                      thinking, ctype=ctypes.c_int32)
    return list(buf[:n])


def test_chat_tokenize_takes_the_switch_as_the_template(qwen3):
    m, render = qwen3
    for thinking, kw in ((-1, {}), (1, {"enable_thinking": True}), (0, {"enable_thinking": False})):
        assert chat_tokens(m, thinking) == m.tokenize(render(**kw), add_special=True, special=True), kw
    # after the system message the cache holds: the rest, the switch included
    rest = render(enable_thinking=False).split("<|im_end|>", 1)[1]
    assert chat_tokens(m, 0, n_prev=1, add_bos=0) == m.tokenize(rest, add_special=False, special=True)
    import kvcache
    with pytest.raises(kvcache.EngineError) as e:   # -1, 0 or 1
        chat_tokens(m, 2)
    assert e.value.status == -101   # KVE_ERR_PARAM


def test_bad_values_and_a_template_without_the_switch(qwen3):
    import kvcache
    m, _ = qwen3
    for bad in (0, "no", 1.0):
        with pytest.raises(ValueError):
            m.apply_chat_template(MSGS, enable_thinking=bad)
        with pytest.raises(ValueError):
            m.chat(MSGS, enable_thinking=bad)
    with pytest.raises(kvcache.EngineError):   # the switch is for chat messages
        m.complete(prompt="hi", max_tokens=2, enable_thinking=False)
    if not os.access(SMOL, os.R_OK):
        pytest.skip("needs the model (make model)")
    with kvcache.Model(SMOL, ctx=256, threads=1, parallel=1) as s:
        for v in (False, True):
            with pytest.raises(kvcache.EngineError):
                s.apply_chat_template(MSGS, enable_thinking=v)
            with pytest.raises(kvcache.EngineError, match="no thinking switch"):
                s.chat(MSGS, max_tokens=2, enable_thinking=v)
        assert s.apply_chat_template(MSGS) == s.apply_chat_template(MSGS, enable_thinking=None)
        for v in (0, 1):
            with pytest.raises(kvcache.EngineError) as e:
                chat_tokens(s, v)
            assert e.value.status == -301   # KVE_ERR_TEMPLATE
        assert chat_tokens(s, -1) == s.tokenize(s.apply_chat_template(MSGS), add_special=True, special=True)
