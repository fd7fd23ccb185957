"""`kvcache serve` through the official `openai` client and curl, on the real
SmolLM2 model: streaming and whole replies, n > 1, stop strings, usage,
logprobs, every error status, the metrics page, prefix reuse across chat
turns, a client that leaves mid-stream.

References are independent of the server: `kvcache generate` (the one-sequence
command), the text a greedy run returned before a stop string was set, the
openai client's own parsing, our strict Prometheus parser."""
import http.client
import json
import subprocess
import threading
import time

import openai
import pytest

from conftest import BIN, MODEL, Server
from prom import parse, value

USER = "Name three colours of the rainbow."


def chat(client, content=USER, **kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], **kw)


def generate_alone(prompt, n):
    """The same greedy request through `kvcache generate --chat` (llm_eval loop, no server)."""
    out = subprocess.run([BIN, "generate", "-m", MODEL, "--chat", "-p", prompt, "-n", str(n), "--temp", "0",
                          "-t", "2", "--ctx", "2048"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout[:-1]   # it ends the text with one newline


def test_health_and_models(server, client):
    assert server.get("/health") == (200, {"status": "ok"})
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1"]


def test_chat_equals_the_one_sequence_command(client):
    r = chat(client, max_tokens=40)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.created > 0
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and c.finish_reason in ("stop", "length")
    assert c.message.content == generate_alone(USER, 40)
    u = r.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and 0 < u.completion_tokens <= 40
    assert u.prompt_tokens_details.cached_tokens <= u.prompt_tokens


def test_stream_equals_whole_reply_and_reports_usage(client):
    whole = chat(client, max_tokens=30)
    chunks = list(chat(client, max_tokens=30, stream=True, stream_options={"include_usage": True}))
    assert all(ch.id == chunks[0].id and ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(ch.usage is None for ch in chunks[:-1])


def test_curl_stream_is_sse_ending_with_done(server):
    body = json.dumps({"messages": [{"role": "user", "content": USER}], "max_tokens": 12, "temperature": 0,
                       "stream": True})
    out = subprocess.run(["curl", "-sS", "-N", server.url + "/v1/chat/completions", "-H",
                          "Content-Type: application/json", "-d", body], capture_output=True, timeout=60)
    assert out.returncode == 0
    text = out.stdout.decode("utf-8")   # every chunk is valid UTF-8
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        json.loads(e[6:])
    out = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", server.url + "/v1/completions", "-d",
                          json.dumps({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})],
                         capture_output=True, text=True, timeout=60)
    body, code = out.stdout.rsplit("\n", 1)
    assert code == "200" and json.loads(body)["object"] == "text_completion"


def test_n_choices_forked_from_one_prompt(client):
    r = chat(client, n=3, temperature=1.0, seed=7, max_tokens=16, logprobs=True)
    assert [c.index for c in r.choices] == [0, 1, 2]
    counts = [len(c.logprobs.content) for c in r.choices]
    assert r.usage.completion_tokens == sum(counts)
    assert len({c.message.content for c in r.choices}) > 1     # different seeds, different samples
    again = chat(client, n=3, temperature=1.0, seed=7, max_tokens=16)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    g = chat(client, n=2, max_tokens=16)
    assert g.choices[0].message.content == g.choices[1].message.content == chat(client, max_tokens=16).choices[0].message.content


def test_stop_strings_cut_the_text_before_them(client):
    full = chat(client, max_tokens=40).choices[0].message.content
    words = full.split()
    assert len(words) > 4
    stop = " " + words[len(words) // 2]
    cut = full[:full.index(stop)]
    r = chat(client, max_tokens=40, stop=[stop, "never appears 123"])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    chunks = list(chat(client, max_tokens=40, stop=stop, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == cut


def test_completions_with_logprobs(client):
    r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0,
                                  logprobs=2)
    c = r.choices[0]
    assert r.object == "text_completion" and c.text
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == c.text
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and len(top) == 2 and max(top.values()) == pytest.approx(l, abs=1e-6)   # greedy
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(len(lp.tokens))]
    pieces = [ch.choices[0] for ch in client.completions.create(model="m", prompt="The capital of France is",
                                                                max_tokens=8, temperature=0, logprobs=2, stream=True)]
    with_lp = [p for p in pieces if p.logprobs]
    assert "".join(p.text for p in pieces) == c.text
    assert [p.logprobs.text_offset[0] for p in with_lp] == \
        [sum(len(p.text) for p in with_lp[:k]) for k in range(len(with_lp))]


def test_chat_logprobs_greedy_token_is_the_best(client):
    r = chat(client, max_tokens=10, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 3 and item.logprob <= 0
        assert item.top_logprobs[0].token == item.token and item.top_logprobs[0].logprob == pytest.approx(item.logprob)
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token or b"\xef\xbf\xbd" in item.token.encode()
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob >= item.top_logprobs[2].logprob


def test_second_chat_turn_reuses_the_first_from_the_prefix_cache(client):
    first = "Tell me one fact about the moon, with a number in it."
    r1 = chat(client, first, max_tokens=32)
    reply = r1.choices[0].message.content
    msgs = [{"role": "user", "content": first}, {"role": "assistant", "content": reply},
            {"role": "user", "content": "And one about the sun?"}]
    r2 = client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
    p1, p2, cached = r1.usage.prompt_tokens, r2.usage.prompt_tokens, r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= p1 // 16 * 16 > 0          # the whole first prompt, to a page
    assert p2 - cached <= (p2 - p1) + 16        # only the new turn is prefilled


def expect_error(status, payload, code, fragment):
    assert status == code, (status, payload)
    err = payload["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == code
    assert fragment in err["message"], err["message"]


def test_every_error_status(server, client):
    p = "/v1/chat/completions"
    st, body = server.post(p, raw=b'{"messages": [ {"role": "user",\n "content": } ]}')
    expect_error(st, body, 400, "line 2, column")
    expect_error(*server.post(p, {"max_tokens": 3}), 400, "'messages' is required")
    expect_error(*server.post(p, {"messages": [{"role": "user", "content": "x"}], "max_tokens": "3"}), 400,
                 "'max_tokens' must be an integer")
    expect_error(*server.post(p, {"messages": [{"role": "user", "content": "x"}], "temperature": 7}), 400,
                 "'temperature' must be in")
    expect_error(*server.post(p, {"messages": [{"role": "user", "content": 5}]}), 400, "content")
    expect_error(*server.post("/v1/completions", {"prompt": "word " * 2100}), 400, "exceeds the context of 2048")
    expect_error(*server.get("/v1/nothing"), 404, "no endpoint")
    expect_error(*server.get(p), 405, "takes POST")
    expect_error(*server.post("/health", {}), 405, "takes GET")
    expect_error(*server.post(p, raw=b"x" * (2 << 20)), 413, "exceeds")
    expect_error(*server.post("/detokenize", {"tokens": [10 ** 8]}), 400, "outside the vocabulary")
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, top_p=0)
    assert e.value.status_code == 400
    # the server is unharmed
    assert chat(client, max_tokens=4).choices[0].message.content


def test_tokenize_round_trip(server):
    st, body = server.post("/tokenize", {"content": "Hello, wide world!", "with_pieces": True})
    assert st == 200 and "".join(t["piece"] for t in body["tokens"]) == "Hello, wide world!"
    st, back = server.post("/detokenize", {"tokens": [t["id"] for t in body["tokens"]]})
    assert (st, back) == (200, {"content": "Hello, wide world!"})


def test_metrics_page_parses_and_counts(server, client):
    before = server.metrics()
    chat(client, max_tokens=6)
    fams = server.metrics()
    for name in ("kvcache_requests_running", "kvcache_requests_waiting", "kvcache_kv_pages_used",
                 "kvcache_kv_pages_free", "kvcache_kv_pages_cached", "kvcache_kv_usage_ratio",
                 "kvcache_prefix_cache_queries_total", "kvcache_prefix_cache_hits_total",
                 "kvcache_prompt_tokens_total", "kvcache_generation_tokens_total", "kvcache_preemptions_total"):
        assert name in fams, name
    assert fams["kvcache_time_to_first_token_seconds"]["type"] == "histogram"
    assert fams["kvcache_inter_token_latency_seconds"]["type"] == "histogram"
    assert value(fams, "kvcache_generation_tokens_total") > value(before, "kvcache_generation_tokens_total")
    ttft = [v for n, _, v in fams["kvcache_time_to_first_token_seconds"]["samples"] if n.endswith("_count")][0]
    assert ttft >= 1
    assert value(fams, "kvcache_kv_pages_used") + value(fams, "kvcache_kv_pages_free") + \
        value(fams, "kvcache_kv_pages_cached") == value(fams, "kvcache_kv_pages_total")


def wait_idle(server, seconds=20):
    """Polls /metrics until nothing runs and no page is referenced."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        f = server.metrics()
        if value(f, "kvcache_kv_pages_used") == 0 and value(f, "kvcache_requests_running") == 0 and \
                value(f, "kvcache_requests_waiting") == 0:
            return f
        time.sleep(0.05)
    raise AssertionError(f"still busy after {seconds} s: {f}")


def test_client_leaving_mid_stream_leaves_no_pages(server):
    wait_idle(server)
    conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 2000,
         "temperature": 0, "stream": True}))
    resp = conn.getresponse()
    assert resp.status == 200
    seen = b""
    while seen.count(b'"delta":{"content"') < 3:   # a few tokens: it is generating
        seen += resp.read1(4096)
    busy = server.metrics()
    assert value(busy, "kvcache_kv_pages_used") > 0
    conn.sock.close()   # the client goes away mid-stream
    conn.close()
    idle = wait_idle(server)
    gen = value(idle, "kvcache_generation_tokens_total") - value(busy, "kvcache_generation_tokens_total")
    assert gen < 1900, "the request ran to its end instead of being cancelled"


def test_api_key_and_full_queue():
    s = Server("-t", "1", "--parallel", "1", "--max-queue", "1", "--ctx", "512", "--api-key", "sekret")
    try:
        body = {"messages": [{"role": "user", "content": "Count from one to a hundred."}], "max_tokens": 300,
                "temperature": 0}
        expect_error(*s.post("/v1/chat/completions", body), 401, "API key")
        expect_error(*s.post("/v1/chat/completions", body, headers={"Authorization": "Bearer wrong"}), 401, "API key")
        assert s.get("/health")[0] == 200 and s.get("/metrics")[0] == 200    # open for monitoring
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="bad", max_retries=0).models.list()
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0, timeout=120)
        assert good.models.list().data
        # one request runs, one waits, the next finds the queue full
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            good.chat.completions.create(model="m", **body).choices[0].finish_reason)) for _ in range(2)]
        threads[0].start()
        for _ in range(200):
            if value(s.metrics(), "kvcache_requests_running") == 1:
                break
            time.sleep(0.02)
        threads[1].start()
        for _ in range(200):
            if value(s.metrics(), "kvcache_requests_waiting") == 1:
                break
            time.sleep(0.02)
        with pytest.raises(openai.APIStatusError) as e:
            good.chat.completions.create(model="m", **body)
        assert e.value.status_code == 503
        for t in threads:
            t.join(timeout=120)
        assert len(results) == 2 and set(results) <= {"stop", "length"}   # both served in full
    finally:
        s.stop()


def test_sigterm_ends_streams_cleanly():
    s = Server("-t", "1", "--parallel", "2", "--ctx", "512")
    conn = http.client.HTTPConnection("127.0.0.1", int(s.url.rsplit(":", 1)[1]), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 400,
                                                         "stream": True, "temperature": 0}))
    resp = conn.getresponse()
    seen = b""
    while seen.count(b'"text"') < 3:
        seen += resp.read1(4096)
    s.stop()             # exits 0 (checked by stop)
    rest = resp.read().decode()
    assert rest.rstrip().endswith("data: [DONE]")


def test_an_idle_server_stops_at_once():
    """civetweb notices mg_stop only when its listening poll returns (a 2 s
    quantum); the server wakes it, so SIGTERM with no connection open ends
    well inside that quantum. (urllib closes each connection after its reply.)"""
    s = Server("-t", "1", "--ctx", "256")
    assert s.get("/health")[0] == 200
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 1.0
