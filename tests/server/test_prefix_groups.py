"""Prefix reuse on Gemma 3, whose layers keep two caches (a full one for the
global layers, a 512-position window for the others), through the official
openai client: four conversations over one shared system prompt longer than
the window, two turns each, each turn resending the history. The first
turns arrive together; the later ones resume from the cache in both groups.
Every reply must equal the same request on a server that reuses nothing
(--no-prefix-cache), but for a rounding tie (conftest.check_tie: a prompt
resumed from pages computed in other chunks sums attention in another
order)."""
import os
import threading

import openai

from conftest import ROOT, Server, check_tie
from prom import value

GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf")
ARGS = ("-t", "2", "--parallel", "4", "--ctx", "2048", "--batch-tokens", "256")
CLIENTS, TURNS = 4, 2
SYSTEM = "You are the archivist of a small library. " + " ".join(
    f"Shelf {k} holds {['maps', 'letters', 'ledgers', 'atlases', 'diaries'][k % 5]} from the year {1700 + 7 * k}."
    for k in range(40))
QUESTIONS = ["Which shelf holds the oldest maps?", "Name one shelf with letters.", "What year is on shelf 9?"]


def ask(client, messages):
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0,
                                       logprobs=True, top_logprobs=2)
    return r.choices[0], r.usage


def conversation(client, i, log, errors):
    try:
        messages = [{"role": "system", "content": SYSTEM}]
        for t in range(TURNS):
            messages.append({"role": "user", "content": f"Visitor {i}: {QUESTIONS[(i + t) % len(QUESTIONS)]}"})
            choice, usage = ask(client, messages)
            log.append((i, t, [dict(m) for m in messages], choice, usage))
            messages.append({"role": "assistant", "content": choice.message.content})
    except Exception as e:  # noqa: BLE001 - every failure is counted and shown
        errors.append((i, repr(e)))


def test_gemma3_conversations_reuse_both_cache_groups_and_equal_a_server_without_reuse():
    reuse = Server(*ARGS, model=GEMMA)
    try:
        client = openai.OpenAI(base_url=reuse.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        log, errors = [], []
        threads = [threading.Thread(target=conversation, args=(client, i, log, errors)) for i in range(CLIENTS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=900)
        assert errors == [] and len(log) == CLIENTS * TURNS, errors
        m = reuse.metrics()
        assert value(m, "kvcache_kv_pages_used") == 0
        hits, queries = value(m, "kvcache_prefix_cache_hits_total"), value(m, "kvcache_prefix_cache_queries_total")
        waits = value(m, "kvcache_prefill_waits_total")
    finally:
        reuse.stop()
    # every later turn resumed from its own history, past the window, in both groups
    for i, t, messages, choice, usage in log:
        if t > 0:
            cached = usage.prompt_tokens_details.cached_tokens
            assert cached > 512 and cached >= usage.prompt_tokens - 64, (i, t, cached, usage.prompt_tokens)
    plain = Server(*ARGS, "--no-prefix-cache", model=GEMMA)
    try:
        client = openai.OpenAI(base_url=plain.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        ties = []
        for i, t, messages, choice, usage in log:
            solo, solo_usage = ask(client, messages)
            assert solo_usage.prompt_tokens_details is None or not solo_usage.prompt_tokens_details.cached_tokens
            if (solo.message.content, solo.finish_reason) != (choice.message.content, choice.finish_reason):
                ties.append((i, t))
                check_tie((i, t), solo.logprobs.content, choice.logprobs.content)
        assert value(plain.metrics(), "kvcache_prefix_cache_hits_total") == 0
    finally:
        plain.stop()
    assert len(ties) <= 2, f"turns {ties} differ from the server without reuse"
    print(f"\ngemma3: prefix hits {int(hits)} of {int(queries)} tokens, {int(waits)} waited for a prefill, "
          f"{len(ties)} ties")
