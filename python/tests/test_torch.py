"""The binding against PyTorch's scaled_dot_product_attention (float64, CPU),
an implementation written by other people: causal attention with the diagonal
offset by S - T, GQA by repeat_interleave, windows as a boolean mask. Skipped
when torch is not importable."""
import numpy as np
import pytest

import kvcache

torch = pytest.importorskip("torch", reason="torch is not installed: the SDPA comparison is skipped")
F = torch.nn.functional


def sdpa(q, k, v, window=0):
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)) for a in (q, k, v))
    kt = kt.repeat_interleave(H // Hkv, dim=0)
    vt = vt.repeat_interleave(H // Hkv, dim=0)
    pos = torch.arange(T)[:, None] + (S - T)
    key = torch.arange(S)[None, :]
    mask = key <= pos
    if window:
        mask &= key > pos - window
    return F.scaled_dot_product_attention(qt[None], kt[None], vt[None], attn_mask=mask)[0].numpy()


@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("T,S", [(1, 1), (9, 9), (3, 7), (1, 70), (20, 70)])
@pytest.mark.parametrize("window", [0, 5])
def test_dense_attention_matches_sdpa(rng, H, Hkv, T, S, window):
    q = rng.standard_normal((H, T, 32))
    k = rng.standard_normal((Hkv, S, 32))
    v = rng.standard_normal((Hkv, S, 32))
    np.testing.assert_allclose(kvcache.attention(q, k, v, window=window), sdpa(q, k, v, window), atol=1e-12)


@pytest.mark.parametrize("dtype,atol", [("f64", 1e-12), ("f32", 1e-5), ("bf16", 4e-2)])
def test_cache_decode_matches_sdpa_over_the_whole_history(rng, dtype, atol):
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
