"""K/V storage types through the binding: what comes back from the cache is
the input rounded exactly as the format says (f16 like numpy's float16, bf16
round-to-nearest-even, q8 within half a step of max|x|/127 per token and
head), attention over the cache equals the float64 reference over those
rounded K/V to FP32 accumulation, and against the unrounded K/V stays within
the bounds stated below (unit-normal q, k, v; d = 64; scores ~ N(0, 1))."""
import numpy as np
import pytest

import kvcache
import reference as ref
from conftest import weights

# max |out - reference(unrounded K/V)|: about 4x what these sizes show
BOUND = {"f32": 1e-5, "f16": 5e-3, "bf16": 4e-2, "q8": 8e-2}


def rounded(dtype, a):
    """a [Hkv, S, d] rounded per (token, head) row, as the cache stores it."""
    return ref.ROUND[dtype](a).astype(np.float64)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_formats_round_exactly(rng, dtype):
    c = kvcache.KVCache(2, 64, dtype=dtype)
    k = rng.standard_normal((2, 40, 64)) * np.exp(rng.uniform(-8, 8, (2, 40, 1)))
    K, V = c.append(k, -k)
    assert K.dtype == np.float32
    assert np.array_equal(K, rounded(dtype, k)) and np.array_equal(V, -rounded(dtype, k))


def test_q8_is_within_half_a_step_of_the_input(rng):
    c = kvcache.KVCache(2, 64, dtype="q8")
    k = rng.standard_normal((2, 40, 64)) * np.exp(rng.uniform(-4, 4, (2, 40, 1)))
    K, _ = c.append(k, k)
    step = np.abs(k.astype(np.float32)).max(axis=-1, keepdims=True) / 127
    assert np.all(np.abs(K - k) <= step * 0.5 * (1 + 1e-5) + 1e-30)
    # and equal to round(x / step) * step but for the odd tie decided by x * (1 / step)
    assert np.mean(K == rounded("q8", k)) > 0.999


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8"])
@pytest.mark.parametrize("H,Hkv", [(8, 2), (4, 1)])
def test_attention_over_stored_kv_within_bounds(rng, dtype, H, Hkv):
    d, S = 64, 150
    c = kvcache.KVCache(Hkv, d, dtype=dtype, page_size=16)
    k, v = rng.standard_normal((Hkv, S, d)), rng.standard_normal((Hkv, S, d))
    K, V = c.append(k, v)
    for T in [1, 9, S]:
        q = rng.standard_normal((H, T, d))
        out = c.attend(q)
        assert out.dtype == np.float32
        # what the kernel sees: the rounded K/V, with FP32 accumulation (and
        # for q8 decode on avx512, the query as int16: include/kvcache.h)
        int16 = dtype == "q8" and kvcache.simd_name() == "avx512"
        atol = 1e-5 + (ref.int16_query_bound(q, K, V) if int16 else 0)
        np.testing.assert_allclose(out, ref.attention(q, K, V), atol=atol)
        assert np.abs(out - ref.attention(q, k, v)).max() < BOUND[dtype]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8"])
def test_prefill_then_decode_equals_one_pass_for_every_storage_type(rng, dtype):
    """The same K/V are stored either way, so only FP32 accumulation order may differ."""
    H, Hkv, d, D, N = 8, 2, 16, 64, 13
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    x = rng.standard_normal((N, D))
    rope = kvcache.Rope(d)
    full = kvcache.step(x, Wq, Wk, Wv, kvcache.KVCache(Hkv, d, dtype=dtype), H, Hkv, rope=rope)
    c = kvcache.KVCache(Hkv, d, dtype=dtype)
    parts = [kvcache.step(x[:5], Wq, Wk, Wv, c, H, Hkv, rope=rope)]
    parts += [kvcache.step(x[i:i + 1], Wq, Wk, Wv, c, H, Hkv, rope=rope) for i in range(5, N)]
    assert np.abs(full - np.concatenate(parts)).max() < 1e-5
    want = ref.step(x, Wq, Wk, Wv, ref.Cache(Hkv, d), H, Hkv, rope_args={})
    assert np.abs(full - want).max() < BOUND[dtype]


def test_price_per_token_and_stats_agree():
    assert kvcache.price_per_token(32, 8, 128, "bf16") == 131072          # Llama 3.1 8B: 128 KiB
    assert kvcache.price_tokens(32, 8, 128, "bf16", 8192) == 2**30        # 1 GiB per sequence
    assert kvcache.price_per_token(1, 2, 64, "q8") == 2 * 2 * 64 + 2 * 2 * 4
    assert kvcache.price_tokens(100000, 100000, 512, "f64", 2**63) == 2**64 - 1
    for dt, size in [("f64", 8), ("f32", 4), ("f16", 2), ("bf16", 2), ("q8", 1)]:
        assert kvcache.dtype_size(dt) == size
        c = kvcache.KVCache(2, 64, dtype=dt, n_layers=3)
        assert c.stats().bytes_per_token == kvcache.price_per_token(3, 2, 64, dt)
    with pytest.raises(ValueError, match="dtype must be one of"):
        kvcache.price_per_token(1, 1, 1, "fp8")
    with pytest.raises(ValueError, match="n_layers must be >= 1"):
        kvcache.price_per_token(0, 1, 1)
