#!/usr/bin/env python3
"""Benchmark any OpenAI-compatible server (kvcache serve, llama.cpp's
llama-server, vLLM, ...) with concurrent streaming chat clients.

    scripts/bench_serve.py http://127.0.0.1:8080 --concurrency 1,4,16 --requests 32 [--json]

For each concurrency level C, C client threads share --requests requests
(each streams one chat completion of --max-tokens at most, at --temperature:
0 by default, greedy; `default` sends none, so the server samples as the
OpenAI API defaults say, temperature 1 over the whole vocabulary),
and the script reports:
  aggregate generated tokens/s   completion tokens (from the final usage chunk)
                                 over the level's wall time
  TTFT p50/p99                   request sent -> first content chunk
  ITL p50/p99                    gaps between consecutive content chunks
Only the standard library is used."""
import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse

TOPICS = ["rivers", "owls", "copper", "tea", "glaciers", "violins", "bees", "deserts", "comets", "bread"]


def prompt(i):
    return f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (request {i})."


def one_request(url, model, i, max_tokens, api_key, temperature):
    """(ttft, [itl...], completion_tokens) of one streamed request."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = {"model": model, "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    if temperature is not None:
        body["temperature"] = temperature
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    conn.request("POST", u.path.rstrip("/") + "/v1/chat/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft, last, gaps, tokens, done = None, None, [], None, False
    buf = b""
    while not done:
        data = resp.read1(65536)
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            payload = event[6:]
            if payload == b"[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                last = now
    conn.close()
    if not done or tokens is None:
        raise RuntimeError("the stream ended without usage and [DONE]")
    return ttft if ttft is not None else time.perf_counter() - t0, gaps, tokens


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(url, model, conc, n_requests, max_tokens, api_key, temperature):
    next_i, lock = [0], threading.Lock()
    ttfts, itls, tokens, failures = [], [], [0], []

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= n_requests:
                    return
                next_i[0] += 1
            try:
                t, g, n = one_request(url, model, i, max_tokens, api_key, temperature)
                with lock:
                    ttfts.append(t), itls.extend(g)
                    tokens[0] += n
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    failures.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"concurrency": conc, "requests": n_requests, "failed": len(failures), "wall_s": wall,
            "generated_tokens": tokens[0], "tokens_per_s": tokens[0] / wall,
            "ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99),
            "itl_p50_s": pct(itls, 50), "itl_p99_s": pct(itls, 99), "errors": failures[:3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", help="base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default 1,4,16)")
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level (default 32)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per request at most (default 64)")
    ap.add_argument("--temperature", default="0",
                    help="sampling temperature sent with each request (default 0); `default` sends none")
    ap.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",") if x]
    try:
        temperature = None if a.temperature == "default" else float(a.temperature)
    except ValueError:
        ap.error("--temperature takes a number or `default`")
    if not levels or min(levels) < 1 or a.requests < 1:
        ap.error("need --concurrency of positive counts and --requests >= 1")
    model = a.model
    if model is None:
        u = urllib.parse.urlparse(a.url)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + a.api_key} if a.api_key else {})
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
    results = [run_level(a.url, model, c, a.requests, a.max_tokens, a.api_key, temperature) for c in levels]
    base = results[0]["tokens_per_s"]
    for r in results:
        r["throughput_vs_first"] = r["tokens_per_s"] / base if base else float("nan")
    if a.json:
        json.dump({"url": a.url, "model": model, "max_tokens": a.max_tokens, "temperature": a.temperature,
                   "levels": results}, sys.stdout, indent=1)
        print()
    else:
        print(f"{a.url}  model {model}  {a.requests} requests per level, max_tokens {a.max_tokens}, "
              f"temperature {a.temperature}")
        print(f"{'clients':>7} {'failed':>6} {'tok/s':>8} {'x':>6} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8}")
        for r in results:
            print(f"{r['concurrency']:>7} {r['failed']:>6} {r['tokens_per_s']:>8.1f} {r['throughput_vs_first']:>6.2f} "
                  f"{r['ttft_p50_s'] * 1e3:>7.0f}ms {r['ttft_p99_s'] * 1e3:>6.0f}ms "
                  f"{r['itl_p50_s'] * 1e3:>6.1f}ms {r['itl_p99_s'] * 1e3:>6.1f}ms")
    return 1 if any(r["failed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
