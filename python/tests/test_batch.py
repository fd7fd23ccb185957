"""Ragged batches (CSR, kv_batch): one call over sequences of different
lengths, one prefilling a chunk while others decode, equals running each
sequence alone, and equals the seed's step per sequence."""
import numpy as np
import pytest

import kvcache
import reference as ref
from conftest import weights

H, HKV, D, DH = 8, 2, 32, 8


def make(rng, dtype="f64", **kw):
    kw = {"page_size": 4, "n_pages": 64, "max_seqs": 4, **kw}
    return kvcache.KVCache(HKV, DH, dtype=dtype, **kw)


@pytest.mark.parametrize("with_rope", [False, True])
def test_step_batch_equals_per_sequence_runs(rng, with_rope):
    Wq, Wk, Wv = weights(rng, D, H, HKV, DH)
    rope = kvcache.Rope(DH, layout="interleaved") if with_rope else None
    rargs = {"layout": "interleaved"} if with_rope else None
    c = make(rng)
    seqs = [c.new_seq() for _ in range(4)]
    refs = [ref.Cache(HKV, DH) for _ in seqs]
    alone = [make(rng, max_seqs=1) for _ in seqs]
    # rounds of (rows per sequence): prefills of different lengths, then a mix
    # of a chunk of prefill with decodes, an idle sequence (0 rows), and decodes
    for counts in [[9, 3, 0, 1], [8, 1, 5, 1], [1, 1, 1, 0], [0, 1, 6, 1], [1, 1, 1, 1]]:
        batch = kvcache.Batch.of(zip(seqs, counts))
        x = rng.standard_normal((batch.rows, D))
        out = c.step_batch(batch, x, Wq, Wk, Wv, H, rope=rope)
        assert out.shape == (batch.rows, H * DH)
        for b, (xs, os_) in enumerate(zip(batch.split(x), batch.split(out))):
            np.testing.assert_allclose(os_, ref.step(xs, Wq, Wk, Wv, refs[b], H, HKV, rargs), atol=1e-12)
            np.testing.assert_array_equal(os_, alone[b].step(xs, Wq, Wk, Wv, H, rope=rope))
    assert [c.length(s) for s in seqs] == [r.k.shape[1] for r in refs]


def test_append_and_attend_batch_match_the_reference(rng):
    c = make(rng, dtype="f32")
    seqs = [c.new_seq() for _ in range(3)]
    refs = [ref.Cache(HKV, DH) for _ in seqs]
    for counts in [[5, 12, 1], [1, 3, 1], [1, 1, 0]]:
        batch = kvcache.Batch(seqs, np.concatenate([[0], np.cumsum(counts)]))  # CSR arrays
        k = rng.standard_normal((batch.rows, HKV, DH)).astype(np.float32)
        v = rng.standard_normal((batch.rows, HKV, DH)).astype(np.float32)
        q = rng.standard_normal((batch.rows, H, DH))
        c.reserve_batch(batch)
        c.append_batch(batch, k, v)
        out = c.attend_batch(batch, q)
        for b in range(3):
            K, V = refs[b].append(batch.split(k)[b].transpose(1, 0, 2), batch.split(v)[b].transpose(1, 0, 2))
            want = ref.attention(batch.split(q)[b].transpose(1, 0, 2), K, V).transpose(1, 0, 2)
            np.testing.assert_allclose(batch.split(out)[b], want, atol=2e-6)


def test_window_cache_in_a_ragged_batch(rng):
    Wq, Wk, Wv = weights(rng, D, H, HKV, DH)
    W = 6
    c = make(rng, window=W, max_seq_len=200)
    seqs = [c.new_seq() for _ in range(3)]
    refs = [ref.Cache(HKV, DH) for _ in seqs]
    for counts in [[7, 2, 1]] + [[1, 3, 1]] * 8:
        batch = kvcache.Batch.of(zip(seqs, counts))
        x = rng.standard_normal((batch.rows, D))
        out = c.step_batch(batch, x, Wq, Wk, Wv, H)
        for b in range(3):
            want = ref.step(batch.split(x)[b], Wq, Wk, Wv, refs[b], H, HKV, window=W)
            np.testing.assert_allclose(batch.split(out)[b], want, atol=1e-12)


def test_reserve_batch_is_all_or_nothing(rng):
    c = make(rng, n_pages=5)
    a, b = c.new_seq(), c.new_seq()
    c.reserve(6, a)                      # 2 pages
    before = c.stats()
    with pytest.raises(kvcache.KVCacheError, match="out of pages") as e:
        c.reserve_batch([(a, 2), (b, 13)])  # a keeps its 2 pages, b needs 4: 2 + 4 > 5
    assert e.value.status == kvcache.Status.ERR_OUT_OF_PAGES
    assert c.length(a) == 6 and c.length(b) == 0 and c.stats() == before
    # a step whose reserve fails leaves everything as it was, too
    Wq, Wk, Wv = weights(rng, D, H, HKV, DH)
    with pytest.raises(kvcache.KVCacheError, match="out of pages"):
        c.step_batch([(a, 1), (b, 13)], np.zeros((14, D)), Wq, Wk, Wv, H)
    assert c.length(a) == 6 and c.length(b) == 0 and c.stats() == before


def test_batch_construction_and_checks():
    b = kvcache.Batch.of([(3, 2), (0, 0), (1, 5)])
    assert b.rows == 7 and b.n_seqs == 3 and list(b) == [(3, 2), (0, 0), (1, 5)]
    assert b.row_start.tolist() == [0, 2, 2, 7] and b.counts.tolist() == [2, 0, 5]
    assert [p.shape[0] for p in b.split(np.zeros((7, 4)))] == [2, 0, 5]
    assert kvcache.Batch.of([]).rows == 0
    with pytest.raises(ValueError, match="n_seqs \\+ 1"):
        kvcache.Batch([0, 1], [0, 1])
    with pytest.raises(ValueError, match="non-decreasing"):
        kvcache.Batch([0, 1], [0, 3, 2])
    with pytest.raises(ValueError, match="row_start\\[0\\] must be 0"):
        kvcache.Batch([0], [1, 2])
    with pytest.raises(ValueError, match="pairs"):
        kvcache.Batch.of([0, 1])
    with pytest.raises(TypeError, match="integer array"):
        kvcache.Batch([0.5], [0, 1])


def test_library_rejects_bad_batches_with_its_message(rng):
    c = make(rng)
    a = c.new_seq()
    c.reserve(2, a)
    c.append_batch([(a, 2)], np.zeros((2, HKV, DH)), np.zeros((2, HKV, DH)))
    q = np.zeros((3, H, DH))
    with pytest.raises(kvcache.KVCacheError, match="appears more than once in the batch") as e:
        c.attend_batch([(a, 1), (a, 2)], q)                  # a sequence appears twice
    assert e.value.status == kvcache.Status.ERR_DUPLICATE and e.value.call == "kv_attend_f64"
    with pytest.raises(kvcache.KVCacheError, match="T > S"):
        c.attend_batch([(a, 3)], q)                          # more rows than positions
    with pytest.raises(kvcache.KVCacheError, match="no such sequence"):
        c.attend_batch([(3, 1)], q[:1])                      # a free slot
    with pytest.raises(ValueError, match="rows=2"):
        c.attend_batch([(a, 2)], q)
