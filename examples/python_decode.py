"""A decode loop through the Python binding: one attention layer with 8 query
heads over 2 KV heads (GQA), RoPE at absolute positions, K/V stored as f16.
A prompt of 5 tokens is prefilled in one step, then 8 tokens are decoded one
at a time, each step projecting only the new token. The result is checked
against recomputing the whole sequence in one pass, and the cache is priced.

Run from the source tree after `make lib`:
    PYTHONPATH=python python3 examples/python_decode.py
"""
import numpy as np

import kvcache

D, H, HKV, HD, PROMPT, STEPS = 64, 8, 2, 16, 5, 8

rng = np.random.default_rng(0)
Wq = rng.standard_normal((D, H * HD)) / 8        # [D, H*d]
Wk = rng.standard_normal((D, HKV * HD)) / 8      # [D, Hkv*d]
Wv = rng.standard_normal((D, HKV * HD)) / 8
rope = kvcache.Rope(HD, theta=10000.0)

cache = kvcache.KVCache(n_kv_heads=HKV, head_dim=HD, dtype="f16", page_size=16, n_pages=64)
x = rng.standard_normal((PROMPT, D))             # the prompt's embeddings
seen = [x]
out = kvcache.step(x, Wq, Wk, Wv, cache, H, HKV, rope=rope)   # prefill: T = S = 5
for _ in range(STEPS):                                         # decode: T = 1, S = 6, 7, ...
    x = out[-1:, :D]                             # feed the last output back as the next token
    seen.append(x)
    out = kvcache.step(x, Wq, Wk, Wv, cache, H, HKV, rope=rope)

# the same tokens in one pass over a fresh cache give the same last row
again = kvcache.step(np.concatenate(seen), Wq, Wk, Wv,
                     kvcache.KVCache(HKV, HD, dtype="f16"), H, HKV, rope=rope)
gap = np.abs(again[-1] - out[-1]).max()
assert gap < 1e-5, gap

s = cache.stats()
print(f"cached {cache.length()} tokens in {s.pages_used} page(s), {s.bytes_per_token} KV bytes each")
print(f"prefill + decode vs one pass: max difference {gap:.2e}")
print(f"Llama 3.1 8B in bf16: {kvcache.price_per_token(32, 8, 128, 'bf16')} bytes per token, "
      f"{kvcache.price_tokens(32, 8, 128, 'bf16', 8192) / 2**30:.0f} GiB at 8192 tokens")
