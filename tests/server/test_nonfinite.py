"""Non-finite logits end generation alike through the CLI and the server.

A copy of the real model with one NaN in output_norm.weight makes every
logit NaN (the final norm multiplies each hidden element by its weight, and
every logit reads them all). `kvcache generate` (the session loop) and
`kvcache serve` (the scheduler) both drive engine/gen/choice.c, which checks the
logits before sampling: neither may print or send a token, and both must say
the logits were not finite."""
import json
import math
import re
import shutil
import struct
import subprocess
import urllib.request

import pytest

from conftest import BIN, MODEL, Server


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    info = subprocess.run([BIN, "info", "-m", MODEL, "--tensors"], capture_output=True, text=True, check=True).stdout
    data0 = int(re.search(r"data at offset (\d+)", info).group(1))
    m = re.search(r"^\s+output_norm\.weight\s+F32\s+\[\d+\]\s+\d+ bytes at (\d+)", info, re.M)
    assert m, info
    path = tmp_path_factory.mktemp("nan") / "nan.gguf"
    shutil.copyfile(MODEL, path)
    with open(path, "r+b") as f:
        f.seek(data0 + int(m.group(1)))
        was = struct.unpack("<f", f.read(4))[0]
        assert math.isfinite(was)
        f.seek(data0 + int(m.group(1)))
        f.write(struct.pack("<f", math.nan))
    return str(path)


def test_cli_generate_stops_on_non_finite_logits(nan_model):
    r = subprocess.run([BIN, "generate", "-m", nan_model, "-p", "The capital of France is", "-n", "8",
                        "--temp", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "not finite" in r.stderr, r.stderr
    assert r.stdout.strip() == "", f"text printed from NaN logits: {r.stdout!r}"
    # the same prompt on the original model generates, so the stop is the NaN's doing
    ok = subprocess.run([BIN, "generate", "-m", MODEL, "-p", "The capital of France is", "-n", "2", "--temp", "0"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip(), ok.stderr


def test_server_stops_on_non_finite_logits(nan_model):
    srv = Server(model=nan_model)
    try:
        body = {"model": "m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        status, reply = srv.post("/v1/completions", body)
        assert status == 500, (status, reply)
        assert "not finite" in reply["error"]["message"], reply
        # streamed: no text chunk, an error event that says the same
        req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            events = [json.loads(line[6:]) for line in r.read().decode().splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        texts = [c.get("text", "") for e in events for c in e.get("choices", [])]
        assert "".join(texts) == "", events
        errors = [e["error"] for e in events if "error" in e]
        assert errors and "not finite" in errors[0]["message"], events
    finally:
        srv.stop()
