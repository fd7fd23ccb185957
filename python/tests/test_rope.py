"""Rope against RoPE written from its definition (complex rotation), in both
pair layouts, partial rotation and Llama 3.1 scaling; and step with RoPE at
absolute positions: prefill + decode equals one pass, and equals the seed's
step with q and k rotated at S - T + i."""
import numpy as np
import pytest

import kvcache
import reference as ref
from conftest import weights

LLAMA3 = dict(scaling="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=8192)


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
@pytest.mark.parametrize("rot_dim", [0, 8, 16])
def test_apply_matches_definition(rng, layout, rot_dim):
    d = 16
    rope = kvcache.Rope(d, rot_dim=rot_dim, layout=layout, theta=10000.0)
    x = rng.standard_normal((5, 3, d))
    pos = np.array([0, 1, 7, 1000, 123456])
    want = ref.rope(x, pos, layout=layout, rot_dim=rot_dim or d)
    np.testing.assert_allclose(rope.apply(x, pos), want, atol=1e-12)
    np.testing.assert_allclose(rope.apply(x.astype(np.float32), pos), want, atol=5e-6)
    assert rope.apply(x.astype(np.float32), pos).dtype == np.float32


def test_apply_takes_a_start_position_and_two_dim_input(rng):
    rope = kvcache.Rope(8, theta=500000.0)
    x = rng.standard_normal((4, 8))
    np.testing.assert_allclose(rope.apply(x, 10), ref.rope(x[:, None], np.arange(10, 14), theta=500000.0)[:, 0],
                               atol=1e-12)
    assert rope.apply(np.zeros((0, 2, 8)), 0).shape == (0, 2, 8)


def test_apply_does_not_modify_its_input(rng):
    x = rng.standard_normal((3, 2, 8))
    x0 = x.copy()
    kvcache.Rope(8).apply(x, 5)
    assert np.array_equal(x, x0)


def test_llama3_scaling_frequencies(rng):
    rope = kvcache.Rope(128, theta=500000.0, **LLAMA3)
    want = ref.rope_inv_freq(128, 500000.0, llama3=(8.0, 1.0, 4.0, 8192))
    np.testing.assert_allclose(rope.inv_freq, want, rtol=1e-12)
    x = rng.standard_normal((2, 1, 128))
    np.testing.assert_allclose(rope.apply(x, [3, 70000]),
                               ref.rope(x, [3, 70000], theta=500000.0, llama3=(8.0, 1.0, 4.0, 8192)), atol=1e-9)


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_step_with_rope_prefill_then_decode_equals_one_pass(rng, layout):
    H, Hkv, d, D, N = 8, 2, 16, 64, 13
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    x = rng.standard_normal((N, D))
    rope = kvcache.Rope(d, layout=layout)
    full = kvcache.step(x, Wq, Wk, Wv, kvcache.KVCache(Hkv, d), H, Hkv, rope=rope)
    c = kvcache.KVCache(Hkv, d)
    parts = [kvcache.step(x[:5], Wq, Wk, Wv, c, H, Hkv, rope=rope)]
    parts += [kvcache.step(x[i:i + 1], Wq, Wk, Wv, c, H, Hkv, rope=rope) for i in range(5, N)]
    assert np.abs(full - np.concatenate(parts)).max() < 1e-12
    want = ref.step(x, Wq, Wk, Wv, ref.Cache(Hkv, d), H, Hkv, rope_args={"layout": layout})
    np.testing.assert_allclose(full, want, atol=1e-12)


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_step_rotates_new_keys_at_absolute_positions(rng, layout):
    """Chunks after a prefill sit at S - T + i, not at their local index."""
    H, Hkv, d, D = 4, 1, 8, 16
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    rope = kvcache.Rope(d, layout=layout, rot_dim=6)
    c, r = kvcache.KVCache(Hkv, d, page_size=4), ref.Cache(Hkv, d)
    args = {"layout": layout, "rot_dim": 6}
    for t in [6, 3, 1, 1]:
        x = rng.standard_normal((t, D))
        np.testing.assert_allclose(c.step(x, Wq, Wk, Wv, H, rope=rope), ref.step(x, Wq, Wk, Wv, r, H, Hkv, args),
                                   atol=1e-12)
    # the cached keys are the rotated ones
    np.testing.assert_allclose(c.read()[0], r.k, atol=1e-12)


def test_bad_rope_parameters_raise_the_library_error():
    with pytest.raises(kvcache.KVCacheError, match="invalid RoPE parameters") as e:
        kvcache.Rope(16, rot_dim=7)
    assert e.value.status == kvcache.Status.ERR_ROPE
    with pytest.raises(kvcache.KVCacheError, match="RoPE"):
        kvcache.Rope(16, theta=-1.0)
    with pytest.raises(kvcache.KVCacheError, match="RoPE"):
        kvcache.Rope(16, scaling="llama3", factor=0.0)
    with pytest.raises(ValueError, match="layout"):
        kvcache.Rope(16, layout="gptj")
    with pytest.raises(kvcache.KVCacheError, match="length out of range"):
        kvcache.Rope(8).apply(np.zeros((2, 8)), [0, -1])
    with pytest.raises(ValueError, match="head_dim = 8"):
        kvcache.Rope(8).apply(np.zeros((2, 1, 6)), 0)
    with pytest.raises(ValueError, match="equal the cache's head_dim"):
        kvcache.KVCache(1, 8).step(np.zeros((1, 4)), np.zeros((4, 8)), np.zeros((4, 8)), np.zeros((4, 8)), 1,
                                   rope=kvcache.Rope(16))
