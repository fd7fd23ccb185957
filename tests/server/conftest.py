"""Fixtures for the HTTP server tests: each server is a real `kvcache serve`
process on a free loopback port (--port 0; the port is read from the line it
prints when ready), stopped with SIGTERM at the end, which must exit 0.

KVCACHE_BIN (default build/kvcache) and KVCACHE_SERVE_MODEL (default the
project's SmolLM2) choose what runs. The model must be there: these tests do
not pass by skipping (make test-models fetches them)."""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVCACHE_BIN", os.path.join(ROOT, "build", "kvcache"))
MODEL = os.environ.get("KVCACHE_SERVE_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


class Server:
    def __init__(self, *args, model=None):
        model = model or MODEL
        assert os.access(model, os.R_OK), f"{model} is missing: run `make test-models`"
        # stderr (a line per request) goes to a file: a pipe nobody reads would fill and block the server
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([BIN, "serve", "-m", model, "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()   # printed once the model is loaded
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, f"no URL in {line!r}; stderr: {self.stderr() if self.proc.poll() is not None else ''}"
        self.url = f"http://127.0.0.1:{m.group(1)}"
        for _ in range(100):
            if self.get("/health")[0] == 200:
                break
            time.sleep(0.1)

    def stderr(self):
        """What the server wrote to stderr so far."""
        self.log.seek(0)
        return self.log.read()

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, parsed JSON or text) of one request; never raises on HTTP errors."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self):
        from prom import parse
        status, text = self.get("/metrics")
        assert status == 200
        return parse(text)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("kvcache serve did not stop within 30 s of SIGTERM")
        self.proc.stdout.close(), self.log.close()
        assert rc == 0, f"kvcache serve exited {rc}"


def in_parallel(fn, items, workers=8):
    """[fn(x) for x in items], the calls made by `workers` threads at once
    (the shared server takes 8 sequences in one batch)."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


@pytest.fixture(scope="session")
def server():
    s = Server("-t", "2", "--parallel", "8", "--ctx", "2048", "--batch-tokens", "256")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


# A tie: the top two log-probabilities of a step closer than this (nats). On
# SmolLM2 with the AVX-512 kernels, request 29 meets one of 0.0013 (" playing"
# against "."), which goes either way with the chunking; a wrong cache or a
# request mixed with another moves logits by far more.
TIE = 0.01


def check_tie(i, solo, loaded):
    """The runs' tokens part at a step where the run that has one there holds
    a tie between its top two (both runs' steps, when both have it). Steps
    as the chat API gives them: .token, .top_logprobs[k].logprob, best first.
    Two runs that reach a step by other chunkings (a prompt prefilled in other
    pieces, a cache restored from a session file) sum attention in another
    order, and the 16-bit activations can carry that on: their
    log-probabilities agree to about 1e-3 (SmolLM2), so a greedy choice at
    such a tie may go either way."""
    k = 0
    while k < len(solo) and k < len(loaded) and solo[k].token == loaded[k].token:
        k += 1
    runs = [steps[k] for steps in (solo, loaded) if k < len(steps)]
    assert runs, f"request {i}: the same {k} tokens, yet the texts differ"
    for step in runs:
        top = step.top_logprobs
        gap = top[0].logprob - top[1].logprob
        assert gap < TIE, f"request {i} differs at token {k} ({step.token!r}), where its top two are {gap:.4f} apart"


def completion_steps(choice):
    """A /v1/completions choice's logprobs (tokens, top_logprobs as dicts)
    as the steps check_tie reads."""
    from types import SimpleNamespace as NS
    lp = choice.logprobs
    return [NS(token=tok, top_logprobs=[NS(logprob=v) for v in sorted(top.values(), reverse=True)])
            for tok, top in zip(lp.tokens, lp.top_logprobs)]
