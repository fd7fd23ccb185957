"""Load on the real model: 32 concurrent streaming greedy clients (the openai
client, one thread each) through a KV pool too small for all of them at once,
so that continuous batching, prefix reuse and preemption all happen. Every
stream must end properly ([DONE] after a finish_reason) and every text must
equal the same request run alone afterwards, but for a rounding tie: under load
a prompt is prefilled in other chunks and a preempted request is recomputed in
one pass, which sums attention in another order (the last bits of a logit), so
a greedy choice between two tokens whose log-probabilities lie within that of
each other may go either way. A text that differs must first differ at such a
tie, in both runs' own log-probabilities, and only a few may."""
import threading
from types import SimpleNamespace as NS

import openai
import pytest

from conftest import Server, check_tie
from prom import value

CLIENTS = 32
MAX_TIES = 3
TOPICS = ["rivers", "owls", "copper", "tea", "glaciers", "violins", "bees", "deserts"]


def prompt(i):
    return f"In one sentence, tell me something about {TOPICS[i % len(TOPICS)]} and the number {i}."


def stream_one(client, i, out, errors):
    try:
        text, finish, steps = [], None, []
        for ch in client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt(i)}],
                                                 max_tokens=32, temperature=0, stream=True, logprobs=True,
                                                 top_logprobs=2):
            for c in ch.choices:
                text.append(c.delta.content or "")
                finish = c.finish_reason or finish
                steps.extend(c.logprobs.content if c.logprobs and c.logprobs.content else [])
        out[i] = ("".join(text), finish, steps)
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
        ties = []
        for i in range(CLIENTS):   # the same request, alone
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt(i)}],
                                               max_tokens=32, temperature=0, logprobs=True, top_logprobs=2)
            solo = r.choices[0]
            if (solo.message.content, solo.finish_reason) == out[i][:2]:
                continue
            ties.append(i)
            check_tie(i, solo.logprobs.content, out[i][2])
        assert len(ties) <= MAX_TIES, f"requests {ties} differ from their solo runs"
        print(f"\n32 streams, {int(preempted)} preemptions, {len(ties)} ties, prefix hits "
              f"{int(value(busy, 'kvcache_prefix_cache_hits_total'))} of "
              f"{int(value(busy, 'kvcache_prefix_cache_queries_total'))} tokens")
    finally:
        s.stop()


def test_a_difference_passes_only_at_a_tie():
    """check_tie itself, on made-up steps: it must refuse what is not a tie."""
    def step(token, *alts):
        return NS(token=token, top_logprobs=[NS(token=t, logprob=lp) for t, lp in alts])
    common = [step(" a", (" a", -0.1), (" b", -3.0))]
    tie_solo = common + [step(" playing", (" playing", -1.8021), (".", -1.8034))]
    tie_loaded = common + [step(".", (".", -1.8020), (" playing", -1.8030))]
    check_tie(0, tie_solo, tie_loaded)            # both runs at a tie: fine
    check_tie(0, common, tie_loaded)              # one run ended there, the other at a tie
    far = common + [step(".", (".", -0.2), (" playing", -2.5))]
    with pytest.raises(AssertionError, match="apart"):
        check_tie(0, tie_solo, far)               # the loaded run was not at a tie
    with pytest.raises(AssertionError, match="same 1 tokens"):
        check_tie(0, common, common)
