"""kvcache.Model (libkvengine, include/kvengine.h) on the real model, against
the `kvcache` command as the independent reference: greedy text equals
`kvcache generate` on the same prompt, streaming gives the same text, eight
threads chatting at once each get the text of a run alone (up to the rounding
tie of docs/SERVER.md), and the library imports and generates with the AVX2
and the scalar kernels forced."""
import json
import os
import subprocess
import sys
import threading

import pytest

from conftest import ROOT

BIN = os.environ.get("KVCACHE_BIN", os.path.join(ROOT, "build", "kvcache"))
MODEL = os.environ.get("KVCACHE_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
pytestmark = pytest.mark.skipif(not os.access(MODEL, os.R_OK), reason="needs the model (make model)")
PROMPT = "The three primary colors are"
N = 24
# the gap below which two greedy candidates may swap between batch shapes (docs/SERVER.md)
TIE = 0.01


@pytest.fixture(scope="module")
def model():
    import kvcache
    with kvcache.Model(MODEL, ctx=512, threads=2, parallel=8) as m:
        yield m


def cli_generate(prompt, n):
    assert os.access(BIN, os.X_OK), f"{BIN} is missing: make"
    r = subprocess.run([BIN, "generate", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "2",
                        "--ctx", "512"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.rstrip("\n")


def test_generate_greedy_equals_the_cli(model):
    want = cli_generate(PROMPT, N)
    assert want.strip(), "the CLI generated nothing"
    got = model.generate(PROMPT, max_tokens=N, temperature=0)
    assert got == want


def test_streaming_yields_the_same_text(model):
    whole = model.generate(PROMPT, max_tokens=N, temperature=0)
    pieces = list(model.generate(PROMPT, max_tokens=N, temperature=0, stream=True))
    assert len(pieces) > 1 and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == whole
    chunks = list(model.create_completion(PROMPT, max_tokens=N, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_openai_shaped_results(model):
    msgs = [{"role": "user", "content": "Name a fruit."}]
    r = model.create_chat_completion(msgs, max_tokens=12, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    ch = r["choices"][0]
    assert ch["message"]["role"] == "assistant" and ch["message"]["content"] == model.chat(msgs, max_tokens=12,
                                                                                            temperature=0)
    assert ch["finish_reason"] in ("stop", "length")
    u = r["usage"]
    assert u["prompt_tokens"] == len(model.tokenize(model.apply_chat_template(msgs), add_special=True, special=True))
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and 0 < u["completion_tokens"] <= 12
    c = model.create_completion(PROMPT, max_tokens=5, temperature=0, logprobs=2)
    assert c["object"] == "text_completion" and c["choices"][0]["finish_reason"] == "length"
    lp = c["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == 5 and all(v <= 0 for v in lp["token_logprobs"])
    # a stop string cuts the text before it, as the CLI does
    full = model.generate(PROMPT, max_tokens=N, temperature=0)
    cut = full.split(" ")[3]
    assert model.generate(PROMPT, max_tokens=N, temperature=0, stop=cut) == full[:full.index(cut)]


def test_bad_input_raises_with_the_reason(model):
    import kvcache
    with pytest.raises(kvcache.EngineError, match="outside the vocabulary"):
        model.generate([model.n_vocab + 5], max_tokens=2)
    with pytest.raises(kvcache.EngineError, match="sampling"):
        model.generate(PROMPT, top_p=0.0)
    with pytest.raises(ValueError):
        model.chat([{"role": "user"}])
    with pytest.raises(kvcache.EngineError, match="max_tokens"):
        model.generate(PROMPT, max_tokens=0)
    with pytest.raises(kvcache.EngineError):
        kvcache.Model(os.path.join(ROOT, "README.md"))
    assert model.generate(PROMPT, max_tokens=3, temperature=0)   # still usable


def test_closing_a_stream_early_cancels_and_the_model_goes_on(model):
    import ctypes
    from kvcache import _engine
    it = model.generate(PROMPT, max_tokens=200, temperature=0, stream=True)
    first = next(it)
    assert first
    it.close()   # frees the request: cancelled in the scheduler
    # the C calls directly: a cancelled request ends with KVE_STOP_CANCEL; a poll that
    # times out says so and gives nothing
    lib = _engine.lib()
    r = model._submit(prompt=PROMPT, max_tokens=500, temperature=0)
    out = _engine.Output()
    lib.kve_request_cancel(r)
    while lib.kve_request_poll(r, 1000, ctypes.byref(out)) == 0 and out.stop == 0:
        pass
    assert _engine.STOP_NAMES[out.stop] == "cancel" and out.n_generated < 500
    assert lib.kve_request_poll(r, 0, ctypes.byref(out)) == 0 and out.n_tokens == 0 and out.text_len == 0
    lib.kve_request_free(r)
    assert model.generate(PROMPT, max_tokens=N, temperature=0) == cli_generate(PROMPT, N)


def _steps(r):
    c = r["choices"][0]["logprobs"]["content"]
    return [(t["id"], [a["logprob"] for a in t["top_logprobs"]]) for t in c]


def test_eight_threads_chatting_get_their_solo_text(model):
    topics = ["the sea", "a cat", "winter", "bread", "the moon", "a train", "music", "a garden"]
    msgs = [[{"role": "user", "content": f"Write one sentence about {t}."}] for t in topics]
    kw = dict(max_tokens=20, temperature=0, logprobs=True, top_logprobs=2)
    solo = [model.create_chat_completion(m, **kw) for m in msgs]
    got = [None] * len(msgs)
    barrier = threading.Barrier(len(msgs))

    def run(i):
        barrier.wait()
        got[i] = model.create_chat_completion(msgs[i], **kw)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(msgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (a, b) in enumerate(zip(solo, got)):
        if a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]:
            continue
        sa, sb = _steps(a), _steps(b)
        k = next(j for j in range(min(len(sa), len(sb))) if sa[j][0] != sb[j][0])
        gaps = [s[k][1][0] - s[k][1][1] for s in (sa, sb)]
        assert all(g < TIE for g in gaps), f"request {i} differs at step {k} with top-2 gaps {gaps}"
    # chat() itself, from threads at once
    texts = [None] * 4
    threads = [threading.Thread(target=lambda i=i: texts.__setitem__(i, model.chat(msgs[i], max_tokens=20,
                                                                                  temperature=0)))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(t, str) and t for t in texts)


@pytest.mark.parametrize("simd", ["avx2", "scalar"])
def test_forced_kernels_import_and_generate(simd):
    if simd == "avx2":
        flags = open("/proc/cpuinfo").read()
        if " avx2 " not in flags:
            pytest.skip("this CPU has no AVX2")
    code = ("import json, ctypes, kvcache\n"
            "from kvcache import _engine\n"
            f"m = kvcache.Model({MODEL!r}, ctx=256, threads=1, parallel=1)\n"
            f"t = m.generate({PROMPT!r}, max_tokens=8, temperature=0)\n"
            "lib = _engine.lib(); lib.kv_simd_name.restype = ctypes.c_char_p\n"
            "print(json.dumps({'text': t, 'simd': lib.kv_simd_name().decode()}))\n")
    env = dict(os.environ, KVCACHE_SIMD=simd)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["simd"] == simd and out["text"].strip()
