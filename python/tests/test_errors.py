"""Failures: the library's refusals arrive as KVCacheError carrying the status
code and kv_status_str's message, and leave the cache as it was; wrong shapes
and dtypes are refused in Python with ValueError/TypeError before any call."""
import numpy as np
import pytest

import kvcache
from kvcache import KVCacheError, Status


def raises(status, fn, *args, **kw):
    with pytest.raises(KVCacheError) as e:
        fn(*args, **kw)
    assert e.value.status == status
    assert e.value.message == kvcache.status_str(status)
    assert e.value.message in str(e.value) and f"KV_{status.name}" in str(e.value)
    return e.value


def test_every_status_has_a_library_message():
    assert kvcache.status_str(0) == "ok"
    for s in Status:
        if s != Status.OK:
            assert kvcache.status_str(s) != "unknown status", s
    assert kvcache.status_str(-999) == "unknown status"


@pytest.mark.parametrize("kw,status", [
    ({"n_kv_heads": 0}, Status.ERR_SHAPE),
    ({"head_dim": 513}, Status.ERR_SHAPE),
    ({"page_size": 0}, Status.ERR_SHAPE),
    ({"window": -1}, Status.ERR_WINDOW),
    ({"max_seqs": 0}, Status.ERR_SHAPE),
])
def test_bad_cache_parameters(kw, status):
    args = {"n_kv_heads": 1, "head_dim": 8, **kw}
    e = raises(status, kvcache.KVCache, **args)
    assert e.call == "kv_cache_create"


def test_out_of_pages_changes_nothing():
    c = kvcache.KVCache(1, 4, page_size=4, n_pages=3, max_seq_len=100)
    c.append(np.ones((1, 9, 4)), np.ones((1, 9, 4)))
    before, K = c.stats(), c.read()[0]
    raises(Status.ERR_OUT_OF_PAGES, c.reserve, 4)
    raises(Status.ERR_OUT_OF_PAGES, c.append, np.zeros((1, 4, 4)), np.zeros((1, 4, 4)))
    assert c.stats() == before and c.length() == 9 and np.array_equal(c.read()[0], K)


def test_capacity_sequence_slots_and_unknown_sequences():
    c = kvcache.KVCache(1, 4, max_seq_len=10, max_seqs=2)
    a = c.new_seq()
    b = c.new_seq()
    raises(Status.ERR_CAPACITY, c.reserve, 11, a)
    raises(Status.ERR_SEQ, c.new_seq)
    raises(Status.ERR_SEQ, c.fork, a)
    c.remove(b)
    raises(Status.ERR_SEQ, c.length, b)
    raises(Status.ERR_SEQ, c.length, 7)
    raises(Status.ERR_SEQ, c.remove, b)
    assert c.length(a) == 0


def test_truncate_and_read_out_of_range():
    c = kvcache.KVCache(1, 4)
    c.append(np.ones((1, 5, 4)), np.ones((1, 5, 4)))
    raises(Status.ERR_LENGTH, c.truncate, 6)
    raises(Status.ERR_LENGTH, c.read, start=3, n=3)
    with pytest.raises(ValueError, match="new_len must be >= 0"):
        c.truncate(-1)
    assert c.length() == 5


def test_window_eviction_refuses_reads_and_truncates_of_evicted_keys():
    c = kvcache.KVCache(1, 4, page_size=4, n_pages=4, window=4, max_seq_len=100)
    for _ in range(20):
        c.append(np.ones((1, 1, 4)), np.ones((1, 1, 4)))
    raises(Status.ERR_WINDOW, c.read, start=0, n=1)
    raises(Status.ERR_WINDOW, c.truncate, 3)
    assert c.read(start=16)[0].shape == (1, 4, 4)


def test_writing_a_shared_page_without_reserve_is_refused():
    c = kvcache.KVCache(1, 4, page_size=4, max_seqs=2)
    c.append(np.ones((1, 6, 4)), np.ones((1, 6, 4)))
    child = c.fork()
    raises(Status.ERR_SHARED, c.write, np.zeros((1, 1, 4)), np.zeros((1, 1, 4)))
    assert np.array_equal(c.read(child)[0], np.ones((1, 6, 4)))


def test_python_side_checks_name_the_problem():
    c = kvcache.KVCache(2, 8)
    with pytest.raises(ValueError, match="dtype must be one of"):
        kvcache.KVCache(2, 8, dtype="float16")
    with pytest.raises(ValueError, match=r"k_new must have shape \(2, 3, 8\) \[Hkv, t, d\], got \(2, 3, 4\)"):
        c.append(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="one shape"):
        c.append(np.zeros((2, 3, 8)), np.zeros((2, 2, 8)))
    with pytest.raises(TypeError, match="float64 or float32"):
        c.append(np.zeros((2, 3, 8), dtype=np.int32), np.zeros((2, 3, 8)))
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        c.attend(np.zeros((3, 1, 8)))
    with pytest.raises(ValueError, match="layer must be <= 0"):
        c.read(layer=1)
    x, W = np.zeros((2, 16)), np.zeros((16, 16))
    with pytest.raises(ValueError, match=r"Wq must have shape \[D=16, 32\]"):
        kvcache.step(x, W, W, W, c, 4, 2)
    with pytest.raises(ValueError, match="Hkv \\(1\\) must equal"):
        kvcache.step(x, W, W, W, c, 4, 1)
    with pytest.raises(TypeError, match="cache must be a kvcache.KVCache"):
        kvcache.step(x, W, W, W, None, 4, 2)
    with pytest.raises(ValueError, match="tokens must have one id per new position"):
        c.reserve(2, tokens=[1])
    assert c.length() == 0


def test_shape_errors_state_the_layout_the_caller_writes():
    """Issue 10 item 9: an [Hkv, t, d] argument is described as [Hkv, t, d], with
    the caller's own shape, never the transposed one the C call takes."""
    c = kvcache.KVCache(2, 8)
    with pytest.raises(ValueError, match=r"k_new must have shape \(2, 1, 8\) \[Hkv, t, d\], got \(3, 1, 8\)$"):
        c.append(np.zeros((3, 1, 8)), np.zeros((3, 1, 8)))
    c.reserve(2)
    with pytest.raises(ValueError, match=r"k must have shape \(2, 2, 8\) \[Hkv, t, d\], got \(2, 2, 4\)$"):
        c.write(np.zeros((2, 2, 4)), np.zeros((2, 2, 4)))
    with pytest.raises(ValueError, match=r"k must have shape \(2, 2, 8\) \[rows, Hkv, d\], got \(2, 8, 2\)$"):
        c.append_batch([(0, 2)], np.zeros((2, 8, 2)), np.zeros((2, 8, 2)))
    m = kvcache.KVCache(2, 8, n_layers=3)
    with pytest.raises(ValueError, match=r"\(3, 2, 1, 8\) \[n_layers, Hkv, t, d\], got \(2, 2, 1, 8\)$"):
        m.append(np.zeros((2, 2, 1, 8)), np.zeros((2, 2, 1, 8)))


def test_a_sequence_twice_in_a_batch_is_reported_as_such():
    """Issue 10 item 9: not "no such sequence", which it is not."""
    c = kvcache.KVCache(1, 8, max_seqs=2)
    s = c.new_seq()
    for call in (lambda: c.reserve_batch([(s, 1), (s, 1)]),
                 lambda: c.attend_batch([(s, 0), (s, 0)], np.zeros((0, 1, 8)))):
        with pytest.raises(KVCacheError, match="appears more than once in the batch") as e:
            call()
        assert e.value.status == Status.ERR_DUPLICATE
    assert c.length(s) == 0


def test_a_nul_inside_a_save_path_is_refused(tmp_path):
    """Issue 10 item 7: C would stop at the NUL and write the truncated path."""
    c = kvcache.KVCache(1, 8)
    c.append(np.ones((1, 3, 8)), np.ones((1, 3, 8)))
    target = tmp_path / "a.kv"
    for bad in (str(target) + "\0.suffix", bytes(target) + b"\0x"):
        with pytest.raises(ValueError, match="embedded null byte"):
            c.save(bad)
        with pytest.raises(ValueError, match="embedded null byte"):
            c.restore(bad)
    assert not target.exists()
    c.save(target)
    assert target.exists()
