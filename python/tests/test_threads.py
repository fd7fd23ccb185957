"""The thread pool through the binding: attention on a cache gives the same
result bit for bit with any number of threads, a job runs every task once,
and a pool outlives the caches that use it."""
import threading

import numpy as np
import pytest

import kvcache
from conftest import weights


@pytest.mark.parametrize("dtype", ["f64", "f32", "q8"])
def test_attention_is_identical_for_every_thread_count(rng, dtype):
    H, Hkv, d, D = 8, 2, 32, 64
    Wq, Wk, Wv = weights(rng, D, H, Hkv, d)
    x = rng.standard_normal((300, D))
    outs = []
    for n in [None, 1, 2, 3, 4]:
        pool = kvcache.Pool(n) if n else None
        c = kvcache.KVCache(Hkv, d, dtype=dtype, page_size=16, n_pages=64, max_seqs=3)
        c.set_pool(pool)
        a, b = c.new_seq(), c.new_seq()
        ys = [c.step_batch([(a, 250), (b, 40)], x[:290], Wq, Wk, Wv, H)]
        ys += [c.step_batch([(a, 1), (b, 7)], x[290:298], Wq, Wk, Wv, H)]
        outs.append(np.concatenate(ys))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_pool_runs_every_task_once():
    with kvcache.Pool(3) as pool:
        assert pool.threads == 3
        seen, lock = [], threading.Lock()

        def task(i, thread):
            assert 0 <= thread < 3
            with lock:
                seen.append(i)

        pool.run(100, task)
        assert sorted(seen) == list(range(100))
        pool.run(0, task)
        with pytest.raises(ZeroDivisionError):
            pool.run(5, lambda i, t: 1 / (i - 3))
    assert kvcache.Pool(1).threads == 1
    assert kvcache.Pool(0).threads >= 1          # one per core


def test_a_cache_keeps_its_pool_and_close_refuses_while_in_use(rng):
    pool = kvcache.Pool(2)
    c = kvcache.KVCache(1, 8)
    c.set_pool(pool)
    with pytest.raises(ValueError, match="still set on an open cache"):
        pool.close()
    c.set_pool(None)
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.threads
    with pytest.raises(TypeError, match="kvcache.Pool"):
        c.set_pool(2)
    with pytest.raises(ValueError, match="n_threads must be >= 0"):
        kvcache.Pool(-1)


def test_python_threads_may_attend_at_once(rng):
    """ctypes releases the GIL in C calls: dense attention, and attend on one cache
    that nothing changes meanwhile, from several Python threads at once."""
    from concurrent.futures import ThreadPoolExecutor
    c = kvcache.KVCache(2, 32, dtype="f16", page_size=16)
    c.append(rng.standard_normal((2, 500, 32)), rng.standard_normal((2, 500, 32)))
    qs = [rng.standard_normal((8, 4, 32)).astype(np.float32) for _ in range(16)]
    k, v = c.read()
    serial = [(c.attend(q), kvcache.attention(q, k, v)) for q in qs]
    with ThreadPoolExecutor(4) as ex:
        together = list(ex.map(lambda q: (c.attend(q), kvcache.attention(q, k, v)), qs))
    for (a, b), (x, y) in zip(serial, together):
        np.testing.assert_array_equal(a, x)
        np.testing.assert_array_equal(b, y)
