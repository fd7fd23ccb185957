"""kvcache generate --chat / chat with --think / --no-think (Qwen3's
enable_thinking) on a tiny synthetic Qwen3 (scripts/synth_model.py). The
reference is the file's own template rendered by jinja2 and given to
`generate --special` as a raw prompt: greedy, both must write the same text."""
import functools
import os
import subprocess
import sys

import pytest

gguf = pytest.importorskip("gguf", reason="pip install gguf (python/requirements-test.txt)")
jinja2 = pytest.importorskip("jinja2", reason="pip install jinja2 (python/requirements-test.txt)")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

BIN = os.environ.get("KVCACHE_BIN", "build/kvcache")
SMOL = os.environ.get("KVCACHE_CHAT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "synth_model.py")
QUESTION = "What is 2+2?"
GREEDY = ["-n", "6", "--temp", "0", "-t", "1"]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen3") / "qwen3-tiny.gguf")
    subprocess.run([sys.executable, SCRIPT, "--preset", "qwen3-0.6b", "--layers", "2", "--embd", "64", "--heads", "2",
                    "--kv-heads", "1", "--head-dim", "32", "--ffn", "128", "--vocab", "49200", "--type", "F16",
                    "-o", path], check=True, capture_output=True, timeout=300)
    return path


@functools.lru_cache(maxsize=None)   # GGUFReader parses the whole 49k-token vocabulary
def template_of(path):
    f = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode()


def rendered(path, **kw):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template_of(path)).render(messages=[{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                        **kw)


def run(*args, stdin=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300, input=stdin)


def test_generate_chat_renders_what_the_template_does(qwen3):
    outs = {}
    for flag, kw in (([], {}), (["--think"], {"enable_thinking": True}), (["--no-think"], {"enable_thinking": False})):
        chat = run("generate", "-m", qwen3, "--chat", *flag, "-p", QUESTION, *GREEDY)
        ref = run("generate", "-m", qwen3, "--special", "-p", rendered(qwen3, **kw), *GREEDY)
        assert chat.returncode == 0 and ref.returncode == 0, chat.stderr + ref.stderr
        assert chat.stdout == ref.stdout, flag
        outs[tuple(flag)] = chat.stdout
    assert rendered(qwen3, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_chat_takes_the_switch(qwen3):
    r = run("chat", "-m", qwen3, "--no-think", *GREEDY, stdin=QUESTION + "\n")
    assert r.returncode == 0, r.stderr
    g = run("generate", "-m", qwen3, "--chat", "--no-think", "-p", QUESTION, *GREEDY)
    assert g.stdout.strip() and g.stdout.strip() in r.stdout


def test_a_template_without_the_switch_refuses_it():
    if not os.path.exists(SMOL):
        pytest.skip(f"{SMOL} is missing (make model)")
    for cmd in (["generate", "--chat", "-p", "hi"], ["chat"]):
        for flag in ("--no-think", "--think"):
            r = run(*cmd, "-m", SMOL, flag, "-n", "2", "-t", "1", stdin="hi\n")
            assert r.returncode == 2, (cmd, flag, r.stderr)
            assert f"{flag}: this model's chat template has no thinking switch (enable_thinking)" in r.stderr
            assert r.stdout == ""
    r = run("generate", "-m", SMOL, "--no-think", "-p", "hi", "-n", "2")
    assert r.returncode == 2 and "--no-think goes with --chat" in r.stderr
