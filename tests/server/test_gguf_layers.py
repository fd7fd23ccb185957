"""scripts/gguf_layers.py on the real model (a bench tool: the first N layers
of a GGUF file). The copy must be a model the engine loads, with N layers,
exactly the kept tensors, and tensor bytes equal to the original's."""
import os
import re
import subprocess
import sys

from conftest import BIN, MODEL, ROOT

SCRIPT = os.path.join(ROOT, "scripts", "gguf_layers.py")


def tensors(path):
    """name -> (type, shape, bytes), name -> file offset, and the text of `kvcache info --tensors`"""
    out = subprocess.run([BIN, "info", "-m", path, "--tensors"], capture_output=True, text=True, check=True).stdout
    data0 = int(re.search(r"data at offset (\d+)", out).group(1))
    found = list(re.finditer(r"^\s+(\S+\.weight)\s+(\S+)\s+(\[[^\]]*\])\s+(\d+) bytes at (\d+)", out, re.M))
    return ({m.group(1): m.group(2, 3, 4) for m in found}, {m.group(1): data0 + int(m.group(5)) for m in found}, out)


def read(path, at, n):
    with open(path, "rb") as f:
        f.seek(at)
        return f.read(n)


def test_two_layers_keep_their_tensors_and_run(tmp_path):
    out = tmp_path / "two.gguf"
    subprocess.run([sys.executable, SCRIPT, MODEL, "2", str(out)], check=True, capture_output=True)
    full, full_at, _ = tensors(MODEL)
    two, two_at, info = tensors(str(out))
    assert "2 layers" in info
    want = {k: v for k, v in full.items() if not k.startswith("blk.") or int(k.split(".")[1]) < 2}
    assert two == want and len(two) < len(full)
    for name in ("blk.1.ffn_down.weight", "token_embd.weight", "output_norm.weight"):   # the bytes are the original's
        n = int(two[name][2])
        assert read(str(out), two_at[name], n) == read(MODEL, full_at[name], n), name
    r = subprocess.run([BIN, "generate", "-m", str(out), "-p", "Hello", "-n", "4", "--temp", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "decode:" in r.stderr


def test_bad_arguments_are_refused(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, MODEL], capture_output=True, text=True)
    assert r.returncode != 0 and "usage" in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    r = subprocess.run([sys.executable, SCRIPT, str(bad), "1", str(tmp_path / "o.gguf")], capture_output=True, text=True)
    assert r.returncode != 0 and "not a GGUF" in r.stderr
