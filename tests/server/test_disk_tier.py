"""The prefix cache's disk tier, `kvcache serve --cache-dir DIR`: pages the
pool reclaims, and at shutdown every named page, are written to DIR and read
back when a prompt continues a prefix found there, after a restart too, for
a model with one cache group (SmolLM2) and for Gemma 3 (full layers and
sliding-window layers: each group's pages go to disk, the window's resume
from the pages of its window alone).

References are independent of the tier: a server without --cache-dir (the
shared `server` fixture) answering the same request cold, through the
official openai client, and our strict Prometheus parser for the counters."""
import glob
import os
import shutil
import time

import openai
import pytest

from conftest import ROOT, Server

GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf")

ARGS = ("-t", "2", "--parallel", "8", "--ctx", "2048", "--batch-tokens", "256")   # the `server` fixture's
LONG = ("A record of the harbour: "
        + " ".join(f"On day {i} the ship {n} brought {k} crates of {t} from port {p}."
                   for i, (n, k, t, p) in enumerate(zip(
                       ["Aster", "Birch", "Cedar", "Dune", "Ember", "Fjord", "Grove", "Heron"] * 6,
                       [3, 7, 12, 5, 9, 1, 4, 8, 6, 2, 11, 13] * 4,
                       ["tea", "salt", "wool", "tin", "rice", "glass", "silk", "oil"] * 6,
                       ["Avel", "Brim", "Cole", "Dorn", "Esk", "Fane"] * 8), 1)))
PROMPT = [{"role": "user", "content": LONG + "\nWhich ship brought wool on day 3?"}]


def answer(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = c.chat.completions.create(model="m", messages=PROMPT, max_tokens=24, temperature=0)
    return r.choices[0].message.content, r.usage


def counter(server, name):
    return server.metrics()[name]["samples"][0][2]


@pytest.fixture(scope="module")
def filled(server, tmp_path_factory):
    """(the cold answer and usage, a tier folder a server filled with the prompt and was stopped)."""
    cold, cold_usage = answer(server)
    assert cold_usage.prompt_tokens > 600
    d = str(tmp_path_factory.mktemp("tier") / "dir")
    first = Server(*ARGS, "--cache-dir", d)
    text, _ = answer(first)
    assert text == cold
    assert counter(first, "kvcache_prefix_disk_hits_total") == 0
    first.stop()   # writes every named page
    return cold, cold_usage, d


def test_a_restart_serves_the_prefix_from_disk_with_the_text_of_a_cold_run(filled, tmp_path):
    cold, cold_usage, filled_dir = filled
    d = str(tmp_path / "tier")
    shutil.copytree(filled_dir, d)
    files = glob.glob(os.path.join(d, "*.kvp"))
    assert len(files) >= cold_usage.prompt_tokens // 16 - 1
    again = Server(*ARGS, "--cache-dir", d)
    try:
        text, usage = answer(again)
        hits = counter(again, "kvcache_prefix_disk_hits_total")
        assert text == cold
        # every full page of the prompt but the last token's comes from disk
        assert hits == (cold_usage.prompt_tokens - 1) // 16
        assert usage.prompt_tokens_details.cached_tokens == hits * 16
        assert counter(again, "kvcache_prefix_disk_read_bytes_total") > 0
        assert counter(again, "kvcache_prefix_disk_damaged_total") == 0
    finally:
        again.stop()


def test_a_damaged_tier_file_is_a_miss_and_the_text_is_that_of_a_cold_run(filled, tmp_path):
    cold, _, filled_dir = filled
    d = str(tmp_path / "tier")
    shutil.copytree(filled_dir, d)
    files = sorted(glob.glob(os.path.join(d, "*.kvp")), key=os.path.getsize)
    assert files
    # flip one byte in the K/V of every file: each one fails its checksum
    for f in files:
        with open(f, "r+b") as fh:
            fh.seek(os.path.getsize(f) // 2)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0x40]))
    again = Server(*ARGS, "--cache-dir", d)
    try:
        text, usage = answer(again)
        assert text == cold
        assert counter(again, "kvcache_prefix_disk_hits_total") == 0
        # the files the prompt's load read, each refused by its checksum
        assert counter(again, "kvcache_prefix_disk_damaged_total") == (usage.prompt_tokens - 1) // 16
        assert usage.prompt_tokens_details.cached_tokens == 0
    finally:
        again.stop()


def test_pages_the_pool_reclaims_are_written_and_found_again_without_a_restart(server, tmp_path):
    cold, cold_usage = answer(server)
    d = str(tmp_path / "tier")
    # a pool of 100 pages: other prompts reclaim the first one's cached pages
    assert cold_usage.prompt_tokens > 800
    s = Server("-t", "2", "--parallel", "1", "--ctx", "2048", "--kv-pages", "100", "--cache-dir", d)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        text, _ = answer(s)
        assert text == cold
        for i in range(3):
            other = [{"role": "user", "content": f"Story {i}: " + LONG[::-1][:2500]}]
            c.chat.completions.create(model="m", messages=other, max_tokens=4, temperature=0)
        assert counter(s, "kvcache_prefix_disk_writes_total") > 0
        text, usage = answer(s)
        assert text == cold
        assert counter(s, "kvcache_prefix_disk_hits_total") > 0
        assert usage.prompt_tokens_details.cached_tokens >= 16 * counter(s, "kvcache_prefix_disk_hits_total")
    finally:
        s.stop()


def streamed(server):
    """(text, seconds to the first token, usage) of PROMPT, greedy, streamed."""
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    t0, first, parts, usage = time.monotonic(), None, [], None
    for ch in c.chat.completions.create(model="m", messages=PROMPT, max_tokens=24, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        if ch.choices and ch.choices[0].delta.content:
            first = first or time.monotonic() - t0
            parts.append(ch.choices[0].delta.content)
    return "".join(parts), first, usage


def damage_every_file(d):
    for f in glob.glob(os.path.join(d, "*.kvp")):
        with open(f, "r+b") as fh:
            fh.seek(os.path.getsize(f) // 2)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0x40]))


def test_gemma3_a_restart_resumes_both_cache_groups_from_disk_with_the_text_of_a_cold_run(tmp_path):
    plain = Server(*ARGS, model=GEMMA)   # the reference: no tier
    try:
        cold, cold_ttft, cold_usage = streamed(plain)
    finally:
        plain.stop()
    n = cold_usage.prompt_tokens
    assert n > 700   # past the window (512): the window group resumes from its last pages alone
    d = str(tmp_path / "tier")
    first = Server(*ARGS, "--cache-dir", d, model=GEMMA)
    try:
        text, _, _ = streamed(first)
        assert text == cold
    finally:
        first.stop()   # writes every named page of both groups
    broken = str(tmp_path / "broken")
    shutil.copytree(d, broken)
    damage_every_file(broken)

    again = Server(*ARGS, "--cache-dir", d, model=GEMMA)
    try:
        text, ttft, usage = streamed(again)
        hits = counter(again, "kvcache_prefix_disk_hits_total")
        assert text == cold
        assert usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16
        # every full page of the full group, and of the window group only the
        # pages its window at that point covers (512 positions: 32 or 33 pages)
        assert (n - 1) // 16 + 32 <= hits <= (n - 1) // 16 + 33
        assert counter(again, "kvcache_prefix_disk_waits_total") == 1
        assert ttft * 3 < cold_ttft, (ttft, cold_ttft)
        print(f"\ngemma3 restart: first token {ttft:.3f} s, cold {cold_ttft:.3f} s ({n} prompt tokens, {int(hits)} pages read)")
    finally:
        again.stop()

    hurt = Server(*ARGS, "--cache-dir", broken, model=GEMMA)
    try:
        text, _, usage = streamed(hurt)
        assert text == cold
        assert counter(hurt, "kvcache_prefix_disk_hits_total") == 0
        assert counter(hurt, "kvcache_prefix_disk_damaged_total") > 0
        assert usage.prompt_tokens_details.cached_tokens == 0
    finally:
        hurt.stop()
