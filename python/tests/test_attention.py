"""kvcache.attention (dense, no cache) against the numpy reference: every head
ratio, prefill/chunk/decode shapes, T = 0, windows, scale, both precisions,
and argument checks before any C call."""
import numpy as np
import pytest

import kvcache
import reference as ref

HEADS = [(4, 4), (8, 2), (6, 1)]  # MHA, GQA, MQA


@pytest.mark.parametrize("H,Hkv", HEADS)
@pytest.mark.parametrize("T,S", [(1, 1), (7, 7), (3, 7), (1, 40), (17, 100), (64, 64)])
def test_f64_matches_reference_for_every_head_ratio_and_offset(rng, H, Hkv, T, S):
    d = 16
    q = rng.standard_normal((H, T, d))
    k = rng.standard_normal((Hkv, S, d))
    v = rng.standard_normal((Hkv, S, d))
    out = kvcache.attention(q, k, v)
    assert out.dtype == np.float64 and out.shape == (H, T, d)
    np.testing.assert_allclose(out, ref.attention(q, k, v), rtol=0, atol=1e-12)


def test_offset_mask_is_not_the_top_left_triangle(rng):
    """T = 3 new queries over S = 7 keys: the first sees five keys, not one."""
    q = rng.standard_normal((1, 3, 8))
    k = rng.standard_normal((1, 7, 8))
    v = rng.standard_normal((1, 7, 8))
    out = kvcache.attention(q, k, v)
    # the last query sees every key: equals unmasked softmax attention
    s = q[0, 2] @ k[0].T / np.sqrt(8)
    p = np.exp(s - s.max())
    np.testing.assert_allclose(out[0, 2], (p / p.sum()) @ v[0], atol=1e-12)
    # the first sees keys 0..4 only
    s = q[0, 0] @ k[0, :5].T / np.sqrt(8)
    p = np.exp(s - s.max())
    np.testing.assert_allclose(out[0, 0], (p / p.sum()) @ v[0, :5], atol=1e-12)


@pytest.mark.parametrize("window", [1, 3, 16, 50])
@pytest.mark.parametrize("T,S", [(1, 40), (9, 40), (40, 40)])
def test_window_limits_keys_to_the_last_w_positions(rng, window, T, S):
    q = rng.standard_normal((4, T, 8))
    k = rng.standard_normal((2, S, 8))
    v = rng.standard_normal((2, S, 8))
    np.testing.assert_allclose(kvcache.attention(q, k, v, window=window),
                               ref.attention(q, k, v, window=window), atol=1e-12)


def test_scale_overrides_one_over_sqrt_d(rng):
    q, k, v = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 9, 8)), rng.standard_normal((2, 9, 8))
    np.testing.assert_allclose(kvcache.attention(q, k, v, scale=0.05),
                               ref.attention(q, k, v, scale=0.05), atol=1e-12)


def test_empty_query_returns_empty_result(rng):
    q = np.zeros((8, 0, 16))
    k = rng.standard_normal((2, 5, 16))
    out = kvcache.attention(q, k, k)
    assert out.shape == (8, 0, 16)
    assert kvcache.attention(q, np.zeros((2, 0, 16)), np.zeros((2, 0, 16))).shape == (8, 0, 16)


def test_float32_inputs_use_the_f32_kernel(rng):
    q = rng.standard_normal((8, 6, 32)).astype(np.float32)
    k = rng.standard_normal((2, 30, 32)).astype(np.float32)
    v = rng.standard_normal((2, 30, 32)).astype(np.float32)
    out = kvcache.attention(q, k, v)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref.attention(q, k, v), atol=2e-6)


def test_mixed_precision_computes_in_float64(rng):
    q = rng.standard_normal((2, 3, 8))
    k = rng.standard_normal((1, 5, 8)).astype(np.float32)
    out = kvcache.attention(q, k, k)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref.attention(q, k, k), atol=1e-12)


def test_non_contiguous_views_are_accepted(rng):
    base = rng.standard_normal((16, 8, 4))
    q = base.transpose(2, 1, 0)[:, :, ::2]          # [4, 8, 8], strided
    k = rng.standard_normal((8, 2, 12)).transpose(1, 0, 2)[:, :, :8]  # [2, 8, 8]
    v = np.asfortranarray(rng.standard_normal((2, 8, 8)))
    np.testing.assert_allclose(kvcache.attention(q, k, v), ref.attention(q, k, v), atol=1e-12)


def test_long_context_uses_online_softmax_without_overflow(rng):
    """Large logits: a naive exp would overflow; the max subtraction keeps it finite."""
    q = rng.standard_normal((2, 4, 8)) * 30
    k = rng.standard_normal((1, 3000, 8)) * 30
    v = rng.standard_normal((1, 3000, 8))
    out = kvcache.attention(q, k, v)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref.attention(q, k, v), atol=1e-10)


@pytest.mark.parametrize("args,exc,msg", [
    (((2, 3, 8), (2, 2, 8), (2, 2, 8)), ValueError, "T = 3 > S = 2"),
    (((3, 1, 8), (2, 4, 8), (2, 4, 8)), ValueError, "multiple of the KV heads"),
    (((2, 1, 8), (2, 4, 4), (2, 4, 4)), ValueError, "head_dim"),
    (((2, 1, 8), (2, 4, 8), (2, 5, 8)), ValueError, "v must have k's shape"),
    (((2, 8), (2, 4, 8), (2, 4, 8)), ValueError, "3 dimensions"),
    (((2, 1, 600), (2, 4, 600), (2, 4, 600)), ValueError, "head_dim must be in 1..512"),
])
def test_bad_shapes_raise_before_the_call(args, exc, msg):
    arrays = [np.zeros(s) for s in args]
    with pytest.raises(exc, match=msg):
        kvcache.attention(*arrays)


def test_bad_dtypes_and_arguments_raise():
    q = np.zeros((2, 1, 8), dtype=np.int64)
    with pytest.raises(TypeError, match="float64 or float32"):
        kvcache.attention(q, q, q)
    f = np.zeros((2, 1, 8))
    with pytest.raises(ValueError, match="window must be >= 0"):
        kvcache.attention(f, f, f, window=-1)
    with pytest.raises(TypeError, match="window must be an integer"):
        kvcache.attention(f, f, f, window=1.5)
    with pytest.raises(ValueError, match="scale"):
        kvcache.attention(f, f, f, scale=float("nan"))


def test_every_instruction_set_this_cpu_has_gives_the_reference(rng):
    """The FP32 kernels chosen by kv_simd_select agree with the float64 reference."""
    q = rng.standard_normal((8, 20, 64)).astype(np.float32)
    k = rng.standard_normal((2, 200, 64)).astype(np.float32)
    v = rng.standard_normal((2, 200, 64)).astype(np.float32)
    want = ref.attention(q, k, v, window=50)
    tried = []
    try:
        for name in ["scalar", "avx2", "avx512"]:
            try:
                kvcache.simd_select(name)
            except kvcache.KVCacheError as e:
                assert e.status == kvcache.Status.ERR_UNSUPPORTED and name != "scalar"
                continue
            assert kvcache.simd_name() == name
            tried.append(name)
            np.testing.assert_allclose(kvcache.attention(q, k, v, window=50), want, atol=3e-6)
    finally:
        kvcache.simd_select("auto")
    assert "scalar" in tried
    with pytest.raises(kvcache.KVCacheError) as e:
        kvcache.simd_select("sse9")
    assert e.value.status == kvcache.Status.ERR_UNSUPPORTED
