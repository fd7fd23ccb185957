#!/usr/bin/env python3
"""Time to first token of a ~3,000-token prompt after a restart of
`kvcache serve --cache-dir DIR`, against the same prompt on a server that
starts without the tier (cold). Rounds alternate cold and warm, each on a
fresh server process; the warm round's folder was filled by a server that
answered the prompt once and was stopped (SIGTERM writes every named page).

    python3 scripts/bench_disk_tier.py [-m MODEL] [--rounds 3] [--threads 2]

Prints one line per run and the medians; also checks that each warm reply
equals the cold one (greedy) and that its prefix came from disk (/metrics)."""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(binary, model, threads, extra):
    proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", "-t", str(threads), "--parallel", "1",
                             "--ctx", "4096", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout.readline())
    if not m:
        sys.exit("the server did not start")
    return proc, f"http://127.0.0.1:{m.group(1)}"


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)


def ttft(url, prompt):
    """(seconds to the first streamed token, whole text)."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0, first, text = time.perf_counter(), None, ""
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])["choices"][0]["text"]
            if first is None and chunk:
                first = time.perf_counter() - t0
            text += chunk
    return first, text


def metric(url, name):
    page = urllib.request.urlopen(url + "/metrics").read().decode()
    m = re.search(rf"^{name} (\S+)$", page, re.M)
    return float(m.group(1)) if m else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "kvcache"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    words = "harbour ledger crate lantern tide anchor rope sail gull quay barrel compass".split()
    prompt = " ".join(f"Entry {i}: the {words[i % 12]} by the {words[(i * 5) % 12]} holds {i * 7 % 100}."
                      for i in range(190))
    cold_t, warm_t = [], []
    for rnd in range(a.rounds):
        d = tempfile.mkdtemp(prefix="kvcache_tier_bench_")
        try:
            proc, url = start(a.bin, a.model, a.threads, [])
            t, cold_text = ttft(url, prompt)
            n_prompt = metric(url, "kvcache_prompt_tokens_total")
            stop(proc)
            cold_t.append(t)
            print(f"round {rnd}: cold {t:.3f} s to the first token ({n_prompt:.0f} prompt tokens)", flush=True)
            proc, url = start(a.bin, a.model, a.threads, ["--cache-dir", d])
            ttft(url, prompt)
            stop(proc)   # the tier now holds the prompt's pages
            proc, url = start(a.bin, a.model, a.threads, ["--cache-dir", d])
            t, warm_text = ttft(url, prompt)
            hits = metric(url, "kvcache_prefix_disk_hits_total")
            stop(proc)
            warm_t.append(t)
            same = "same text" if warm_text == cold_text else "TEXT DIFFERS"
            print(f"round {rnd}: after a restart {t:.3f} s ({hits:.0f} pages from disk, {same})", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    c, w = statistics.median(cold_t), statistics.median(warm_t)
    print(f"median: cold {c:.3f} s, from disk {w:.3f} s: {c / w:.1f}x")


if __name__ == "__main__":
    main()
