"""`kvcache serve --kv-events tcp://...`: the prefix cache's changes on a
ZeroMQ PUB socket in vLLM's schema, read with pyzmq and msgpack (neither
shares code with the server): multipart [topic, sequence, EventBatch], the
batch [ts, events], each event a tagged array. Checked against the server's
own /metrics: the blocks a second request hits are blocks announced stored,
and a pool too small to keep everything announces removals of blocks it had
stored."""
import socket
import time

import msgpack
import zmq

from conftest import Server
from prom import value


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Events:
    def __init__(self, *args):
        port = free_port()
        self.server = Server("-t", "1", "--parallel", "2", "--ctx", "512", "--kv-events", f"tcp://127.0.0.1:{port}",
                             *args)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.3)   # a PUB drops what it sends before the subscription arrives
        self.t0 = time.time()
        self.events, self.seqs = [], []

    def drain(self):
        """Reads every batch published so far (the server sends every 20 ms)."""
        time.sleep(0.1)
        while self.sub.poll(300):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b"" and len(seq) == 8
            self.seqs.append(int.from_bytes(seq, "big"))
            batch = msgpack.unpackb(payload)
            assert len(batch) == 2 and self.t0 <= batch[0] <= time.time() and batch[1]   # ts: Unix seconds
            self.events += batch[1]
        assert self.seqs == list(range(len(self.seqs)))

    def complete(self, prompt):
        status, r = self.server.post("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2,
                                                        "temperature": 0})
        assert status == 200, r
        return r

    def close(self):
        self.sub.close()
        self.ctx.term()
        self.server.stop()


def test_stored_blocks_are_what_later_requests_hit():
    ev = Events()
    try:
        prompt = "The shop keeps bolts in bin seven and nuts in bin nine. " * 6
        n_prompt = ev.complete(prompt)["usage"]["prompt_tokens"]
        ev.drain()
        stored = [e for e in ev.events if e[0] == "BlockStored"]
        assert len(stored) >= n_prompt // 16 - 1 and all(len(e) == 7 for e in stored)
        known = set()
        for tag, hashes, parent, tokens, size, lora, medium in stored:
            assert size == 16 and len(tokens) == 16 * len(hashes) and lora is None and medium == "CPU"
            assert parent is None or parent in known, "a block announced before its parent"
            known.update(hashes)
        assert sum(e[2] is None for e in stored) == 1, "one chain, one first block"
        hits0 = value(ev.server.metrics(), "vllm:prefix_cache_hits_total")
        ev.complete(prompt)
        hits = value(ev.server.metrics(), "vllm:prefix_cache_hits_total") - hits0
        ev.drain()
        new = [e for e in ev.events[len(stored):] if e[0] == "BlockStored"]
        assert hits >= 16 * (n_prompt // 16 - 1), hits
        assert hits <= 16 * len(known), "hits on blocks never announced"
        assert not new, "a full hit stores nothing new"
    finally:
        ev.close()


def test_a_small_pool_announces_removals():
    ev = Events("--kv-pages", "16")
    try:
        for k in range(6):   # each about 6 pages; the pool reclaims cached ones
            ev.complete(f"Request {k}: " + " ".join(f"word{k}x{i}" for i in range(30)))
        ev.drain()
        stored = {h for e in ev.events if e[0] == "BlockStored" for h in e[1]}
        removed = [e for e in ev.events if e[0] == "BlockRemoved"]
        assert removed and all(len(e) == 3 and e[2] == "CPU" for e in removed)
        assert all(h in stored for e in removed for h in e[1])
        assert not [e for e in ev.events if e[0] == "AllBlocksCleared"]
    finally:
        ev.close()
