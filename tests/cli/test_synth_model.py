"""scripts/synth_model.py (issue 43): a random-weight GGUF of each
architecture and weight type that kvcache loads at the shape asked for. The
K-type blocks the script writes are read back by gguf-py's own dequantizer
(an implementation independent of both the script and kvcache) and must
match the weights they were made from."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="pip install gguf (python/requirements-test.txt)")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import synth_model  # noqa: E402

BIN = os.environ.get("KVCACHE_BIN", "build/kvcache")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "synth_model.py")
TEXT = os.path.join(os.path.dirname(__file__), "..", "data", "tokenizer", "markdown.txt")
QT = gguf.GGMLQuantizationType

# relative RMS error of each type on Gaussian weights, from above: a wrong
# bit layout gives errors of order 1
K_ERR = {QT.Q2_K: 0.45, QT.Q3_K: 0.3, QT.Q4_K: 0.12, QT.Q5_K: 0.06, QT.Q6_K: 0.035}


@pytest.mark.parametrize("t", list(K_ERR), ids=lambda t: t.name)
def test_k_blocks_read_back_by_gguf_py(t):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 512)).astype(np.float32) * 0.05
    x[0, :256] = 0.0                              # an all-zero block: no division by zero
    q = synth_model.quantize(x, t)
    assert q.shape == (16, 2 * gguf.GGML_QUANT_SIZES[t][1])
    y = gguf.quants.dequantize(q, t)
    assert np.all(y[0, :256] == 0.0)
    err = np.sqrt(np.mean((y - x) ** 2)) / 0.05
    assert err < K_ERR[t], f"{t.name}: relative error {err:.3f}"


def run_info(path):
    p = subprocess.run([BIN, "info", "-m", path], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


SHAPES = [  # arch, type, layers, embd, heads, kv heads, head dim, ffn
    ("llama", "Q4_K_M", 2, 256, 4, 2, 64, 512),
    ("llama", "Q3_K", 1, 256, 4, 4, 64, 256),
    ("qwen2", "Q5_1", 2, 128, 2, 1, 64, 256),
    ("qwen2", "Q4_K", 1, 96, 2, 1, 48, 256),      # 96 columns: K types fall back (Q5_0)
    ("qwen3", "Q8_0", 2, 128, 2, 1, 96, 256),     # head_dim 96 != D/H
    ("phi3", "Q2_K", 2, 256, 4, 4, 64, 512),
    ("phi3", "Q6_K", 1, 256, 2, 2, 128, 256),
    ("gemma3", "F16", 2, 64, 1, 1, 64, 128),      # 262144 tokens: one gemma3 file is enough
]


@pytest.mark.parametrize("arch,wtype,L,D,H,Hkv,d,F", SHAPES, ids=[f"{s[0]}-{s[1]}" for s in SHAPES])
def test_loads_at_the_shape_asked(tmp_path, arch, wtype, L, D, H, Hkv, d, F):
    out = str(tmp_path / "m.gguf")
    subprocess.run([sys.executable, SCRIPT, "--arch", arch, "--type", wtype, "--layers", str(L), "--embd", str(D),
                    "--heads", str(H), "--kv-heads", str(Hkv), "--head-dim", str(d), "--ffn", str(F), "--vocab", "0",
                    "-o", out, "--verify"], check=True, capture_output=True, timeout=300)
    info = run_info(out)
    assert f'general.architecture                         string "{arch}"' in info
    m = re.search(r"engine: (\d+) layers, width (\d+), (\d+) heads over (\d+) KV heads of (\d+), FFN (\d+)", info)
    assert m, info
    assert tuple(int(v) for v in m.groups()) == (L, D, H, Hkv, d, F)
    # the forward runs and its perplexity is finite (no NaN from a wrong scale)
    p = subprocess.run([BIN, "perplexity", "-m", out, "-f", TEXT, "-c", "128", "--chunks", "1", "-t", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    ppl = float(re.search(r"ppl = ([0-9.e+]+)", p.stdout).group(1))
    assert 1.0 < ppl < 1e15


def test_preset_shape_in_info(tmp_path):
    """A preset's real shape, cut to one layer to stay fast; its vocabulary is
    the real one (the bundled tokenizer padded)."""
    out = str(tmp_path / "q.gguf")
    subprocess.run([sys.executable, SCRIPT, "--preset", "qwen2.5-0.5b", "--layers", "1", "--type", "Q8_0", "-o",
                    out], check=True, capture_output=True, timeout=600)
    info = run_info(out)
    assert "engine: 1 layers, width 896, 14 heads over 2 KV heads of 64, FFN 4864, vocabulary 151936" in info
    assert 'tokenizer.ggml.pre                           string "qwen2"' in info
