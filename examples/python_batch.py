"""Serving several requests from one paged cache through the Python binding.

A system prompt of 32 tokens is prefilled once. Three requests fork it
(copy-on-write: the pages are shared, no K/V is copied), then run together in
ragged batches: each prefills its own question in chunks of at most 8 rows
while the others already decode one token a round. At the end each request is
recomputed alone, all its tokens in one pass: the outputs must agree.

    PYTHONPATH=python python3 examples/python_batch.py
"""
import numpy as np

import kvcache

D, H, HKV, HD, CHUNK, DECODE = 32, 4, 2, 8, 8, 5        # H * HD = D: outputs feed back as inputs

rng = np.random.default_rng(7)
Wq, Wk, Wv = (rng.standard_normal((D, n * HD)).astype(np.float32) / 6 for n in (H, HKV, HKV))
rope = kvcache.Rope(HD, theta=10000.0)
system = rng.standard_normal((32, D)).astype(np.float32)
questions = [rng.standard_normal((n, D)).astype(np.float32) for n in (13, 3, 6)]

cache = kvcache.KVCache(HKV, HD, dtype="f32", page_size=8, n_pages=64, max_seqs=4)
root = cache.new_seq()
cache.step(system, Wq, Wk, Wv, H, rope=rope, seq=root)
seqs = [cache.fork(root) for _ in questions]
print(f"system prompt in {cache.stats().pages_used} pages, shared by {len(seqs)} forks: "
      f"{cache.stats().pages_shared} shared pages")

inputs = [[system] for _ in seqs]                      # every row each request has consumed
outputs = [[] for _ in seqs]
todo = [q.copy() for q in questions]                    # question rows not prefilled yet
decoded = [0] * len(seqs)
while min(decoded) < DECODE:
    pairs, rows = [], []
    for b, s in enumerate(seqs):
        if len(todo[b]):                                # a chunk of its question
            x, todo[b] = todo[b][:CHUNK], todo[b][CHUNK:]
        elif decoded[b] < DECODE:                       # one token: its last output fed back
            x, decoded[b] = outputs[b][-1][-1:], decoded[b] + 1
        else:
            x = np.zeros((0, D), np.float32)            # finished: sits this round out
        pairs.append((s, len(x)))
        rows.append(x)
        inputs[b].append(x)
    batch = kvcache.Batch.of(pairs)
    out = cache.step_batch(batch, np.concatenate(rows), Wq, Wk, Wv, H, rope=rope)
    for b, y in enumerate(batch.split(out)):
        if len(y):
            outputs[b].append(y)
    print("round:", "  ".join(f"seq {s} T={t:<2d} S={cache.length(s)}" for s, t in batch))

worst = 0.0
for b in range(len(seqs)):
    alone = kvcache.KVCache(HKV, HD, dtype="f32", page_size=8, n_pages=64)
    y = alone.step(np.concatenate(inputs[b]), Wq, Wk, Wv, H, rope=rope)
    worst = max(worst, float(np.abs(y[len(system):] - np.concatenate(outputs[b])).max()))
s = cache.stats()
print(f"pages used {s.pages_used} ({s.pages_shared} shared), {s.bytes_in_use} of {s.bytes_total} bytes")
print(f"batched vs each request alone in one pass: max difference {worst:.2e}")
assert worst < 1e-5, worst
