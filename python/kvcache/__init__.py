"""kvcache: attention with a KV cache, a ctypes binding over libkvcache.

    import numpy as np, kvcache
    cache = kvcache.KVCache(n_kv_heads=2, head_dim=16)          # float64, paged
    out = kvcache.step(x, Wq, Wk, Wv, cache, H=8, Hkv=2)        # x [t, D] new tokens only

The seed's three pieces, `attention(q, k, v)`, `KVCache(...).append(k, v)` and
`step(x, Wq, Wk, Wv, cache, H, Hkv)`, keep its shapes (q [H, T, d], k and v
[Hkv, S, d]). The rest mirrors include/kvcache.h: sequences, ragged batches
(Batch), RoPE (Rope), storage types f64/f32/f16/bf16/q8, price_per_token.

Library failures raise KVCacheError (status code + the library's message);
wrong shapes or dtypes raise ValueError/TypeError before any C call.
Generation from GGUF models: kvcache.Model (over libkvengine, include/kvengine.h).
See python/README.md, docs/API.md and docs/ENGINE_API.md.
"""
from ._ffi import lib_path
from .attention import (DTYPES, Rope, attention, dtype_size, price_per_token, price_tokens, simd_name,
                        simd_select)
from .cache import Batch, KVCache, Stats, step
from .errors import KVCacheError, Status, status_str
from .model import Completion, EngineError, Model
from .threads import Pool

__version__ = "0.1.0"

__all__ = [
    "attention", "step", "KVCache", "Batch", "Rope", "Pool", "Stats", "KVCacheError", "Status",
    "status_str", "price_per_token", "price_tokens", "dtype_size", "DTYPES", "lib_path", "simd_name",
    "simd_select", "Model", "EngineError", "Completion",
]
