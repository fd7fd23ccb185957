"""The thread pool through the binding: attention on a cache gives the same
result bit for bit with any number of threads, a job runs every task once,
and a pool outlives the caches that use it."""
import threading
import time

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


# ------------------------------------------------------------------ one cache, many threads

def run_threads(n, target):
    """Runs target(i) on n threads at once; returns the exceptions they raised."""
    errors, start = [], threading.Barrier(n)

    def body(i):
        try:
            start.wait()
            target(i)
        except BaseException as e:  # collected, re-raised by the test
            errors.append(e)
    ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


def test_eight_threads_appending_to_one_cache_each_get_their_own_rows_back():
    """Each append (reserve, write, read back) is one exclusive call: its rows
    are the newest of what it returns, never another thread's."""
    c = kvcache.KVCache(2, 16, dtype="f32", page_size=4, n_pages=4096)
    n_threads, n_appends, t = 8, 150, 3

    def work(i):
        r = np.random.default_rng(i)
        for _ in range(n_appends):
            k = r.standard_normal((2, t, 16)).astype(np.float32)
            K, V = c.append(k, -k)
            np.testing.assert_array_equal(K[:, -t:], k)
            np.testing.assert_array_equal(V[:, -t:], -k)
    errors = run_threads(n_threads, work)
    assert not errors, errors[0]
    assert c.length() == n_threads * n_appends * t
    assert c.stats().pages_used == n_threads * n_appends * t // 4


def test_readers_and_writers_on_one_cache_at_once(rng):
    """Attend on one sequence from several threads while others grow, fork and
    remove other sequences: every attention equals the serial result."""
    c = kvcache.KVCache(2, 32, dtype="f16", page_size=16, n_pages=512, max_seqs=12)
    a = c.new_seq()
    c.append(rng.standard_normal((2, 300, 32)), rng.standard_normal((2, 300, 32)), a)
    qs = [rng.standard_normal((4, 5, 32)).astype(np.float32) for _ in range(8)]
    want = [c.attend(q, a) for q in qs]

    def work(i):
        r = np.random.default_rng(100 + i)
        for it in range(40):
            if i % 2:
                np.testing.assert_array_equal(c.attend(qs[it % 8], a), want[it % 8])
                assert c.length(a) == 300
            else:
                s = c.new_seq()
                c.append(r.standard_normal((2, 20, 32)), r.standard_normal((2, 20, 32)), s)
                f = c.fork(s)
                c.append(r.standard_normal((2, 1, 32)), r.standard_normal((2, 1, 32)), f)
                c.remove(s)
                c.remove(f)
    errors = run_threads(8, work)
    assert not errors, errors[0]
    assert c.stats().seqs == 1


@pytest.mark.parametrize("round", range(4))
def test_close_waits_for_calls_in_flight_and_later_calls_raise(rng, round):
    # a pool over 2 MiB is mapped, and unmapped by the free: a call still
    # reading it after the close would fault, not read stale memory
    c = kvcache.KVCache(2, 16, dtype="f32", page_size=4, n_pages=4096)
    c.append(np.ones((2, 2000, 16)), np.ones((2, 2000, 16)))
    q = rng.standard_normal((4, 64, 16)).astype(np.float32)
    want = c.attend(q)
    done, closed = [], threading.Event()

    def work(i):
        if i == 0:
            time.sleep(0.005 * (round + 1))
            c.close()
            closed.set()
            return
        for _ in range(1000):
            try:
                out = c.attend(q)
            except ValueError as e:
                assert "closed" in str(e)
                done.append(i)
                return
            np.testing.assert_array_equal(out, want)
    errors = run_threads(7, work)
    assert not errors, errors[0]
    assert sorted(done) == list(range(1, 7))  # every reader saw the close, as an error
    with pytest.raises(ValueError, match="closed"):
        c.append(np.ones((2, 1, 16)), np.ones((2, 1, 16)))
    c.close()                                 # twice is fine


def test_pool_close_waits_for_jobs_in_flight():
    pool = kvcache.Pool(2)
    ran = []

    def work(i):
        if i == 0:
            time.sleep(0.01)
            pool.close()
            return
        try:
            for _ in range(50):
                pool.run(8, lambda task, thread: ran.append(task))
        except ValueError as e:
            assert "closed" in str(e)
    errors = run_threads(3, work)
    assert not errors, errors[0]
    assert len(ran) % 8 == 0                 # no job was cut short by the close
