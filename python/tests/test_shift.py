"""Re-rotation and context shift through the binding, against numpy's RoPE:
a cached key turned by delta is the raw key rotated at p + delta; a shift
drops a run of positions and the later keys sit rotated at their new ones."""
import numpy as np
import pytest

import kvcache
from kvcache import KVCacheError, Status
import reference as ref

HKV, D = 2, 16


def filled(rng, dtype, n, page_size=4, **rope_kw):
    rope = kvcache.Rope(D, **rope_kw)
    raw = rng.standard_normal((n, HKV, D))
    v = rng.standard_normal((n, HKV, D))
    c = kvcache.KVCache(HKV, D, dtype=dtype, page_size=page_size)
    k = ref.rope(raw, np.arange(n), layout=rope.layout)
    c.append(k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    return c, rope, raw, v


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_rerotate_equals_rotating_the_raw_keys_at_p_plus_delta(rng, layout):
    c, rope, raw, _ = filled(rng, "f64", 13, layout=layout)
    c.rerotate(rope, -7, start=2, n=9)
    k = c.read()[0].transpose(1, 0, 2)
    pos = np.arange(13)
    pos[2:11] -= 7
    np.testing.assert_allclose(k, ref.rope(raw, pos, layout=layout), atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [("f64", 1e-12), ("f32", 1e-5), ("q8", 0.05)])
def test_shift_drops_a_run_and_renumbers_the_rest(rng, dtype, tol):
    c, rope, raw, v = filled(rng, dtype, 20)
    c.shift(3, 6, rope)
    assert c.length() == 14
    keep = np.r_[0:3, 9:20]
    k_got, v_got = (a.transpose(1, 0, 2) for a in c.read())
    np.testing.assert_allclose(k_got, ref.rope(raw[keep], np.arange(14)), atol=tol)
    np.testing.assert_allclose(v_got, v[keep], atol=tol)


def test_bad_shifts_raise_and_change_nothing(rng):
    c, rope, raw, _ = filled(rng, "f32", 8)
    before = c.read()[0].copy()
    with pytest.raises(KVCacheError) as e:
        c.shift(4, 5, rope)
    assert e.value.status == Status.ERR_LENGTH
    with pytest.raises(KVCacheError):
        c.rerotate(kvcache.Rope(8), 1)
    np.testing.assert_array_equal(c.read()[0], before)
