#!/usr/bin/env python3
"""Multi-turn chats through a load balancer: C clients, each a chat of T turns
that resends its whole history over one long system prompt shared by all, as
chat front ends do. Every client finishes its first turn before any sends its
second. Reports time to first token by turn (p50, p90), generated tokens per
second over the run and, from the replicas' /metrics, the prefix-cache hit rate
(hit tokens / queried tokens) of the first turns and of the later ones apart.

    scripts/bench_multiturn.py http://127.0.0.1:8080 --replicas URL,URL,... [--clients 12 --turns 4]

Only the standard library is used."""
import argparse
import http.client
import json
import re
import statistics
import threading
import time
import urllib.parse
import urllib.request

SYSTEM = ("You are the help desk of a hardware shop. Answer in one short sentence. The stock list: "
          + "; ".join(f"bin {i} holds {i * 7 % 50 + 1} boxes of {w}" for i, w in enumerate(
              ["bolts", "nuts", "washers", "screws", "nails", "hinges", "hooks", "rivets"] * 8, 1)) + ".")
QUESTIONS = ["Which bin holds hinges?", "How many boxes is that?", "And the bin after it?", "Thanks, anything else?"]


def ttft(url, messages, max_tokens):
    """(seconds to the first content chunk, the reply's text, content chunks) of
    one streamed chat."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    first, text, chunks = None, [], 0
    for line in resp:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
        if delta:
            first = first or time.perf_counter() - t0
            text.append(delta)
            chunks += 1
    conn.close()
    return first or time.perf_counter() - t0, "".join(text), chunks


def prefix_counters(urls):
    """Summed (queried, hit) prefix-cache tokens of the replicas."""
    q = h = 0
    for u in urls:
        page = urllib.request.urlopen(u + "/metrics", timeout=10).read().decode()
        q += float(re.search(r"^kvcache_prefix_cache_queries_total (\S+)", page, re.M).group(1))
        h += float(re.search(r"^kvcache_prefix_cache_hits_total (\S+)", page, re.M).group(1))
    return q, h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--replicas", default="", help="comma-separated replica URLs whose /metrics to read")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args()
    replicas = [u for u in a.replicas.split(",") if u]
    by_turn = [[] for _ in range(a.turns)]
    errors, generated = [], []
    first_turns_done = threading.Barrier(a.clients, action=lambda: marks.append(
        prefix_counters(replicas) if replicas else (0, 0)))
    marks = []

    def client(c):
        msgs = [{"role": "system", "content": SYSTEM}]
        try:
            for t in range(a.turns):
                msgs.append({"role": "user", "content": f"(customer {c}) {QUESTIONS[t % len(QUESTIONS)]}"})
                s, reply, n = ttft(a.url, msgs, a.max_tokens)
                by_turn[t].append(s)
                generated.append(n)
                msgs.append({"role": "assistant", "content": reply})
                if t == 0:
                    first_turns_done.wait()
        except Exception as e:   # reported, not raised: the other clients go on
            errors.append(repr(e))
            first_turns_done.abort()

    q0, h0 = prefix_counters(replicas) if replicas else (0, 0)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    for t, xs in enumerate(by_turn, 1):
        if xs:
            xs.sort()
            print(f"turn {t}: TTFT p50 {statistics.median(xs) * 1000:.0f} ms  p90 {xs[int(0.9 * (len(xs) - 1))] * 1000:.0f} ms"
                  f"  ({len(xs)} requests)")
    later = sorted(x for xs in by_turn[1:] for x in xs)
    if later:
        print(f"later turns: TTFT p50 {statistics.median(later) * 1000:.0f} ms  ({len(later)} requests)")
    if replicas and marks:
        (q1, h1), (q, h) = marks[0], prefix_counters(replicas)
        print(f"prefix cache, first turns: {h1 - h0:.0f} of {q1 - q0:.0f} prompt tokens hit "
              f"({(h1 - h0) / max(q1 - q0, 1):.1%}); later turns: {h - h1:.0f} of {q - q1:.0f} "
              f"({(h - h1) / max(q - q1, 1):.1%})")
    print(f"wall {wall:.1f} s, {sum(generated)} content chunks generated ({sum(generated) / wall:.1f}/s), "
          f"errors {len(errors)}" + (f": {errors[0]}" if errors else ""))


if __name__ == "__main__":
    main()
