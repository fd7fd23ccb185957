"""/metrics under vLLM's names beside kvcache's own: the families routers
and dashboards written for vLLM read (vllm:num_requests_running, ...), with
vLLM's types, the model_name label, and the same values as the kvcache_*
families after known requests (prefix-cache queries and hits in tokens)."""
import time

from prom import value

PAIRS = {   # vLLM's family: (its type, kvcache's family with the same meaning)
    "vllm:num_requests_running": ("gauge", "kvcache_requests_running"),
    "vllm:num_requests_waiting": ("gauge", "kvcache_requests_waiting"),
    "vllm:kv_cache_usage_perc": ("gauge", "kvcache_kv_usage_ratio"),
    "vllm:prefix_cache_queries_total": ("counter", "kvcache_prefix_cache_queries_total"),
    "vllm:prefix_cache_hits_total": ("counter", "kvcache_prefix_cache_hits_total"),
}


def settled(server):
    """The metrics once nothing runs or waits (the counters include every reply)."""
    for _ in range(200):
        m = server.metrics()
        if value(m, "kvcache_requests_running") == 0 and value(m, "kvcache_requests_waiting") == 0:
            return m
        time.sleep(0.01)
    raise AssertionError("requests still running")


def test_vllm_families_mirror_kvcache(server):
    model = server.get("/v1/models")[1]["data"][0]["id"]
    m0 = settled(server)
    prompt = "The bolts are in bin seven, the nuts in bin nine, and the washers in bin twelve. " * 4
    for _ in range(2):   # the second finds the first's full pages in the prefix cache
        status, _ = server.post("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2, "temperature": 0})
        assert status == 200
    m = settled(server)
    for name, (typ, mine) in PAIRS.items():
        fam = m[name]
        assert fam["type"] == typ, name
        assert len(fam["samples"]) == 1 and fam["samples"][0][1] == {"model_name": model}, fam
        assert fam["samples"][0][2] == value(m, mine), name
    queried = value(m, "vllm:prefix_cache_queries_total") - value(m0, "vllm:prefix_cache_queries_total")
    hits = value(m, "vllm:prefix_cache_hits_total") - value(m0, "vllm:prefix_cache_hits_total")
    assert queried >= 2 * 70, queried                  # tokens, not requests
    assert 64 <= hits <= queried / 2, (hits, queried)  # the second request's full pages
    assert 0 <= value(m, "vllm:kv_cache_usage_perc") <= 1
