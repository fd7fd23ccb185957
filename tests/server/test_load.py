"""Load on the real model: 32 concurrent streaming greedy clients (the openai
client, one thread each) through a KV pool too small for all of them at once,
so that continuous batching, prefix reuse and preemption all happen. Every
stream must end properly ([DONE] after a finish_reason) and every text must
equal the same request run alone afterwards."""
import threading

import openai

from conftest import Server
from prom import value

CLIENTS = 32
TOPICS = ["rivers", "owls", "copper", "tea", "glaciers", "violins", "bees", "deserts"]


def prompt(i):
    return f"In one sentence, tell me something about {TOPICS[i % len(TOPICS)]} and the number {i}."


def stream_one(client, i, out, errors):
    try:
        text, finish = [], None
        for ch in client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt(i)}],
                                                 max_tokens=32, temperature=0, stream=True):
            for c in ch.choices:
                text.append(c.delta.content or "")
                finish = c.finish_reason or finish
        out[i] = ("".join(text), finish)
    except Exception as e:  # noqa: BLE001 - every failure is counted and shown
        errors.append((i, repr(e)))


def test_32_concurrent_streams_equal_their_solo_runs():
    # 32 sequences of ~80 positions want ~170 pages; the pool has 80
    s = Server("-t", "2", "--parallel", "32", "--ctx", "512", "--kv-pages", "80", "--batch-tokens", "256")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        out, errors = [None] * CLIENTS, []
        threads = [threading.Thread(target=stream_one, args=(client, i, out, errors)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert errors == [] and all(o is not None for o in out), errors
        assert all(o[1] in ("stop", "length") for o in out), "a stream ended without a finish_reason"
        busy = s.metrics()
        preempted = value(busy, "kvcache_preemptions_total")
        assert preempted > 0, "the pool was meant to be too small for everyone at once"
        assert value(busy, "kvcache_kv_pages_used") == 0
        for i in range(CLIENTS):   # the same request, alone
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt(i)}],
                                               max_tokens=32, temperature=0)
            assert (r.choices[0].message.content, r.choices[0].finish_reason) == out[i], f"request {i} differs"
        print(f"\n32 streams, {int(preempted)} preemptions, prefix hits "
              f"{int(value(busy, 'kvcache_prefix_cache_hits_total'))} of "
              f"{int(value(busy, 'kvcache_prefix_cache_queries_total'))} tokens")
    finally:
        s.stop()
