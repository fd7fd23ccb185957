"""KVCache through the binding against the seed's numpy KVCache and step:
the prefill + decode == one pass property at float64, chunked prefill, GQA and
MQA, T = 0, append/read/attend, sequences (fork, truncate, remove), windows,
several layers."""
import numpy as np
import pytest

import kvcache
import reference as ref
from conftest import weights


def seed_problem(rng, H=8, Hkv=2, d=16, D=64, N=13):
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    return Wq, Wk, Wv, rng.standard_normal((N, D))


def test_seed_property_prefill_then_decode_equals_one_pass_at_float64(rng):
    H, Hkv, d, N = 8, 2, 16, 13
    Wq, Wk, Wv, x = seed_problem(rng, H, Hkv, d, N=N)
    full = kvcache.step(x, Wq, Wk, Wv, kvcache.KVCache(Hkv, d), H, Hkv)
    c = kvcache.KVCache(Hkv, d)
    parts = [kvcache.step(x[:5], Wq, Wk, Wv, c, H, Hkv)]
    parts += [kvcache.step(x[i:i + 1], Wq, Wk, Wv, c, H, Hkv) for i in range(5, N)]
    assert np.abs(full - np.concatenate(parts)).max() < 1e-12
    assert kvcache.step(x[:0], Wq, Wk, Wv, kvcache.KVCache(Hkv, d), H, Hkv).shape == (0, H * d)
    # and both equal the seed's own step
    np.testing.assert_allclose(full, ref.step(x, Wq, Wk, Wv, ref.Cache(Hkv, d), H, Hkv), atol=1e-12)


@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("chunks", [[40], [16, 16, 8], [5, 1, 1, 20, 1, 13], [0, 3, 0, 1]])
def test_chunked_prefill_and_decode_match_the_seed_step(rng, H, Hkv, chunks):
    d, D = 8, 32
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    x = rng.standard_normal((sum(chunks), D))
    c, r = kvcache.KVCache(Hkv, d, page_size=4, n_pages=64), ref.Cache(Hkv, d)
    at = 0
    for t in chunks:
        got = kvcache.step(x[at:at + t], Wq, Wk, Wv, c, H, Hkv)
        want = ref.step(x[at:at + t], Wq, Wk, Wv, r, H, Hkv)
        assert got.shape == (t, H * d)
        np.testing.assert_allclose(got, want, atol=1e-12)
        at += t
    assert c.length() == sum(chunks)


def test_append_returns_the_whole_cache_like_the_seed(rng):
    Hkv, d = 2, 8
    c, r = kvcache.KVCache(Hkv, d, page_size=4), ref.Cache(Hkv, d)
    for t in [5, 1, 0, 7, 1]:
        kn, vn = rng.standard_normal((Hkv, t, d)), rng.standard_normal((Hkv, t, d))
        K, V = c.append(kn, vn)
        K2, V2 = r.append(kn, vn)
        assert K.shape == K2.shape and np.array_equal(K, K2) and np.array_equal(V, V2)


def test_attend_over_the_cache_equals_dense_attention(rng):
    H, Hkv, d = 6, 3, 16
    c = kvcache.KVCache(Hkv, d, page_size=8)
    K, V = c.append(rng.standard_normal((Hkv, 30, d)), rng.standard_normal((Hkv, 30, d)))
    for T in [1, 4, 30, 0]:
        q = rng.standard_normal((H, T, d))
        np.testing.assert_allclose(c.attend(q), ref.attention(q, K, V), atol=1e-12)
        np.testing.assert_allclose(c.attend(q, scale=0.3), ref.attention(q, K, V, scale=0.3), atol=1e-12)


def test_f32_cache_matches_the_reference_to_float32_rounding(rng):
    H, Hkv, d, D = 8, 2, 32, 64
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    x = rng.standard_normal((20, D))
    c, r = kvcache.KVCache(Hkv, d, dtype="f32"), ref.Cache(Hkv, d)
    for lo, hi in [(0, 12), (12, 13), (13, 20)]:
        got = kvcache.step(x[lo:hi], Wq, Wk, Wv, c, H, Hkv)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, ref.step(x[lo:hi], Wq, Wk, Wv, r, H, Hkv), atol=2e-5)


def test_read_write_round_trip_and_positions(rng):
    Hkv, d = 2, 4
    c = kvcache.KVCache(Hkv, d, page_size=3)
    k, v = rng.standard_normal((Hkv, 10, d)), rng.standard_normal((Hkv, 10, d))
    c.reserve(10)
    c.write(k, v)
    K, V = c.read(start=2, n=5)
    assert np.array_equal(K, k[:, 2:7]) and np.array_equal(V, v[:, 2:7])
    # write overwrites only the t newest positions
    c.write(k[:, :2] * 0, v[:, :2] * 0)
    K, _ = c.read()
    assert np.array_equal(K[:, :8], k[:, :8]) and not K[:, 8:].any()
    assert c.read(start=10)[0].shape == (Hkv, 0, d)


def test_sequences_fork_truncate_remove_and_stats(rng):
    Hkv, d, P = 1, 4, 4
    c = kvcache.KVCache(Hkv, d, page_size=P, n_pages=16, max_seqs=4)
    a = c.new_seq()
    k = rng.standard_normal((Hkv, 10, d))
    c.reserve(10, a)
    c.write(k, k, a)
    assert c.length(a) == 10 and c.stats().pages_used == 3 and c.stats().seqs == 1
    b = c.fork(a)
    s = c.stats()
    assert b != a and c.length(b) == 10 and s.pages_used == 3 and s.pages_shared == 3 and s.seqs == 2
    # the child's next write copies only the partly filled last page
    kb = rng.standard_normal((Hkv, 1, d))
    c.reserve(1, b)
    c.write(kb, kb, b)
    assert c.stats().pages_shared == 2
    assert np.array_equal(c.read(a)[0], k)                      # the parent is untouched
    assert np.array_equal(c.read(b)[0], np.concatenate([k, kb], axis=1))
    c.truncate(4, b)
    assert c.length(b) == 4 and np.array_equal(c.read(b)[0], k[:, :4])
    c.remove(a)
    s = c.stats()
    assert s.seqs == 1 and s.pages_used == 1 and s.pages_shared == 0
    assert s.pages_total == s.pages_used + s.pages_free + s.pages_cached
    assert s.bytes_per_token == kvcache.price_per_token(1, Hkv, d, "f64")
    c.remove(b)
    assert c.stats().pages_used == 0


@pytest.mark.parametrize("W", [1, 5, 8, 13])
def test_window_cache_matches_windowed_reference_and_bounds_pages(rng, W):
    H, Hkv, d, D, P = 4, 2, 8, 32, 4
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    x = rng.standard_normal((60, D))
    n_pages = (W + 8 - 1) // P + 3  # enough for the window plus one chunk, never the whole sequence
    c, r = kvcache.KVCache(Hkv, d, page_size=P, n_pages=n_pages, window=W,
                               max_seq_len=1000), ref.Cache(Hkv, d)
    at = 0
    for t in [7, 1, 1, 6, 1] + [1] * 44:
        got = kvcache.step(x[at:at + t], Wq, Wk, Wv, c, H, Hkv)
        np.testing.assert_allclose(got, ref.step(x[at:at + t], Wq, Wk, Wv, r, H, Hkv, window=W), atol=1e-12)
        at += t
        assert c.stats().pages_used <= (W + t - 1 + P - 1) // P + 1
    # append returns the keys the new rows can see
    K, V = c.append(np.ones((Hkv, 2, d)), np.ones((Hkv, 2, d)))
    assert K.shape[1] == min(W + 1, c.length())


def test_several_layers_append_and_step_each_layer(rng):
    L, H, Hkv, d, D = 3, 4, 2, 8, 16
    c = kvcache.KVCache(Hkv, d, n_layers=L, page_size=4)
    k = rng.standard_normal((L, Hkv, 6, d))
    K, V = c.append(k, -k)
    assert K.shape == (L, Hkv, 6, d) and np.array_equal(K, k) and np.array_equal(V, -k)
    with pytest.raises(ValueError, match="n_layers"):
        c.append(k[:2], k[:2])
    # one reserve per step, then every layer with reserve=False
    Ws = [weights(rng, D, H, Hkv, d) for _ in range(L)]
    refs = [ref.Cache(Hkv, d) for _ in range(L)]
    for l in range(L):
        refs[l].append(*c.read(layer=l))
    for t in [3, 1, 1]:
        x = rng.standard_normal((t, D))
        c.reserve(t)
        for l in range(L):
            got = c.step(x, *Ws[l], H, layer=l, reserve=False)
            np.testing.assert_allclose(got, ref.step(x, *Ws[l], refs[l], H, Hkv), atol=1e-12)
            x = got[:, :D] if got.shape[1] >= D else x
    assert c.length() == 11


def test_context_manager_frees_and_closed_cache_refuses():
    with kvcache.KVCache(1, 4) as c:
        c.append(np.zeros((1, 2, 4)), np.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match="closed"):
        c.length()
    assert "closed" in repr(c)


def test_params_and_repr():
    c = kvcache.KVCache(2, 8, dtype="bf16", page_size=8, n_pages=10, window=0, n_layers=2, max_seqs=3)
    p = c.params
    assert p == {"n_layers": 2, "n_kv_heads": 2, "head_dim": 8, "dtype": "bf16", "page_size": 8,
                 "n_pages": 10, "max_seqs": 3, "max_seq_len": 80, "window": 0}
    assert c.max_seq_len == 80 and c.compute_dtype == np.float32 and "bf16" in repr(c)


def test_prefix_clear_frees_cached_pages_and_a_skipped_lookup_still_publishes(rng):
    c = kvcache.KVCache(1, 8, dtype="f32", page_size=4, n_pages=16, max_seqs=3)
    toks = np.arange(1, 14)
    a = c.new_seq()
    c.reserve(8, a, toks[:8])
    c.write(rng.standard_normal((1, 8, 8)), rng.standard_normal((1, 8, 8)), a)
    c.remove(a)
    b = c.new_seq()                      # prefills 1..12 without a lookup, then decodes 13
    k, v = rng.standard_normal((1, 13, 8)), rng.standard_normal((1, 13, 8))
    c.reserve(12, b, toks[:12])
    c.write(k[:, :12], v[:, :12], b)
    c.reserve(1, b, toks[12:])
    c.write(k[:, 12:], v[:, 12:], b)
    s = c.new_seq()
    assert c.prefix_match(toks[:12], s) == 12
    np.testing.assert_array_equal(c.read(s)[0][:, 8:], k[:, 8:12].astype(np.float32))
    for q in (b, s):
        c.remove(q)
    assert c.stats().pages_cached == 3
    c.prefix_clear()
    st = c.stats()
    assert (st.pages_cached, st.pages_named, st.pages_free) == (0, 0, 16)
