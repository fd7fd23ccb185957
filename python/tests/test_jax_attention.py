"""The binding against JAX's jax.nn.dot_product_attention (CPU), an
implementation written by other people: causal attention with the diagonal
offset by S - T and windows, as a boolean mask; GQA by JAX's own grouping of
query heads over fewer key/value heads. JAX takes the softmax in float32
whatever its inputs' type (its XLA implementation casts the logits), so the
two agree to about 1e-7 here, not to float64's last bits (which
reference.py checks): what this comparison holds is the mask, the
diagonal's offset, the window and the head grouping."""
import numpy as np
import pytest

import kvcache

jax = pytest.importorskip("jax")   # in python/requirements-test.txt: `make test` installs it
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


def sdpa(q, k, v, window=0):
    """q [H][T][d], k and v [Hkv][S][d] (numpy) -> [H][T][d]"""
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    pos = np.arange(T)[:, None] + (S - T)
    key = np.arange(S)[None, :]
    mask = key <= pos
    if window:
        mask &= key > pos - window
    # JAX takes [T][heads][d]; its query heads h read key/value head h // (H / Hkv), as kvcache's do
    qt, kt, vt = (jnp.asarray(np.ascontiguousarray(a.transpose(1, 0, 2)), dtype=jnp.float64) for a in (q, k, v))
    out = jax.nn.dot_product_attention(qt, kt, vt, mask=jnp.asarray(mask)[None], implementation="xla")
    return np.asarray(out).transpose(1, 0, 2)


ATOL = 1e-6   # JAX's float32 softmax


def test_the_reference_groups_heads_as_kvcache_does(rng):
    """A GQA case checked by hand: query head h against key/value head h // 4 alone."""
    q = rng.standard_normal((8, 3, 16))
    k = rng.standard_normal((2, 5, 16))
    v = rng.standard_normal((2, 5, 16))
    got = sdpa(q, k, v)
    for h in range(8):
        s = q[h] @ k[h // 4].T / np.sqrt(16)
        s[np.arange(5)[None, :] > np.arange(3)[:, None] + 2] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        np.testing.assert_allclose(got[h], (p / p.sum(axis=1, keepdims=True)) @ v[h // 4], atol=ATOL)


@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("T,S", [(1, 1), (9, 9), (3, 7), (1, 70), (20, 70)])
@pytest.mark.parametrize("window", [0, 5])
def test_dense_attention_matches_jax(rng, H, Hkv, T, S, window):
    q = rng.standard_normal((H, T, 32))
    k = rng.standard_normal((Hkv, S, 32))
    v = rng.standard_normal((Hkv, S, 32))
    np.testing.assert_allclose(kvcache.attention(q, k, v, window=window), sdpa(q, k, v, window), atol=ATOL)


@pytest.mark.parametrize("dtype,atol", [("f64", ATOL), ("f32", 1e-5), ("bf16", 4e-2)])
def test_cache_decode_matches_jax_over_the_whole_history(rng, dtype, atol):
    H, Hkv, d = 8, 2, 16
    c = kvcache.KVCache(Hkv, d, dtype=dtype, page_size=8)
    ks, vs = [], []
    for t in [11, 1, 1, 5, 1]:
        k, v = rng.standard_normal((Hkv, t, d)), rng.standard_normal((Hkv, t, d))
        ks.append(k)
        vs.append(v)
        c.append(k, v)
        q = rng.standard_normal((H, t, d))
        want = sdpa(q, np.concatenate(ks, axis=1), np.concatenate(vs, axis=1))
        np.testing.assert_allclose(c.attend(q), want, atol=atol)
