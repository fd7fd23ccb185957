"""Save/restore and the prefix cache through the binding: a restored
sequence continues exactly as if it had never left; a prefix match reuses the
K/V of full pages; bad files raise the library's errors and change nothing."""
import numpy as np
import pytest

import kvcache
from kvcache import KVCacheError, Status
from conftest import weights

H, HKV, D, DH = 4, 2, 16, 8


@pytest.mark.parametrize("dtype", ["f64", "f32", "q8"])
@pytest.mark.parametrize("page_size", [4, 8])
def test_restored_sequence_continues_as_if_it_never_left(rng, tmp_path, dtype, page_size):
    Wq, Wk, Wv = weights(rng, D, H, HKV, DH)
    rope = kvcache.Rope(DH)
    x = rng.standard_normal((12, D))
    c = kvcache.KVCache(HKV, DH, dtype=dtype, page_size=4, max_seqs=2)
    c.step(x[:9], Wq, Wk, Wv, H, rope=rope, tokens=np.arange(9))
    path = tmp_path / "seq.kv"
    c.save(path)
    # positions are saved, not pages: a cache of another page size restores it
    d = kvcache.KVCache(HKV, DH, dtype=dtype, page_size=page_size, max_seqs=2)
    d.new_seq()
    s = d.restore(str(path))
    assert s == 1 and d.length(s) == 9
    np.testing.assert_array_equal(d.read(s)[0], c.read()[0])
    for i in range(9, 12):
        got = d.step(x[i:i + 1], Wq, Wk, Wv, H, rope=rope, seq=s)
        want = c.step(x[i:i + 1], Wq, Wk, Wv, H, rope=rope)
        if page_size == 4:   # the same pages: bit for bit
            np.testing.assert_array_equal(got, want)
        else:                # other blocks of the online softmax: rounding only
            np.testing.assert_allclose(got, want, atol=1e-12 if dtype == "f64" else 1e-6)


def test_bad_files_raise_and_change_nothing(tmp_path):
    c = kvcache.KVCache(HKV, DH, page_size=4, max_seqs=2)
    c.append(np.ones((HKV, 5, DH)), np.ones((HKV, 5, DH)))
    path = tmp_path / "a.kv"
    c.save(path)
    before = c.stats()
    with pytest.raises(KVCacheError) as e:
        c.restore(tmp_path / "missing.kv")
    assert e.value.status == Status.ERR_IO and e.value.call == "kv_seq_restore"
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 0xFF
    (tmp_path / "bad.kv").write_bytes(bytes(raw))
    with pytest.raises(KVCacheError, match="corrupt") as e:
        c.restore(tmp_path / "bad.kv")
    assert e.value.status == Status.ERR_FORMAT
    (tmp_path / "short.kv").write_bytes(bytes(raw[:30]))
    with pytest.raises(KVCacheError) as e:
        c.restore(tmp_path / "short.kv")
    assert e.value.status == Status.ERR_FORMAT
    other = kvcache.KVCache(HKV, DH, dtype="f32")
    with pytest.raises(KVCacheError) as e:
        other.restore(path)
    assert e.value.status == Status.ERR_MISMATCH
    assert c.stats() == before and other.stats().seqs == 0
    with pytest.raises(KVCacheError) as e:
        c.save(tmp_path / "no" / "such" / "dir.kv")
    assert e.value.status == Status.ERR_IO


def test_prefix_match_reuses_full_pages(rng):
    P = 4
    c = kvcache.KVCache(HKV, DH, page_size=P, n_pages=16, max_seqs=2)
    tokens = np.arange(100, 111)               # 11 tokens: two full pages and a partial one
    k = rng.standard_normal((HKV, 11, DH))
    a = c.new_seq()
    c.reserve(11, a, tokens=tokens)
    c.write(k, -k, a)
    c.remove(a)                                # full pages stay cached, findable by their tokens
    s = c.stats()
    assert s.pages_cached >= 1 and s.pages_used == 0
    b = c.new_seq()
    assert c.prefix_lookup(tokens) == 8 and c.prefix_lookup(tokens[:7]) == 4   # asks, takes nothing
    assert c.stats().pages_used == 0
    n = c.prefix_match(tokens, b)
    assert n == 8 and c.length(b) == 8
    K, V = c.read(b)
    np.testing.assert_array_equal(K, k[:, :8])
    np.testing.assert_array_equal(V, -k[:, :8])
    e = c.new_seq()
    assert c.prefix_match(np.arange(11), e) == 0   # other tokens match nothing
    with pytest.raises(KVCacheError) as err:
        c.prefix_match(tokens, b)                  # only on an empty sequence
    assert err.value.status == Status.ERR_LENGTH
