"""A pool of worker threads (kv_pool): attention on a cache given a pool
splits its work over the pool's threads. Work is cut into tasks independently
of the thread count, so results are the same bit for bit with any pool."""
import ctypes
import weakref

from . import _ffi
from ._ffi import Closing
from ._arrays import integer
from ._lock import RWLock, reads, writes
from .errors import check


class Pool(Closing):
    """kv_pool_create(n_threads): n_threads counts the calling thread (1 starts
    no worker); 0 means one per core. Give it to caches with
    KVCache.set_pool(pool); a cache keeps its pool alive, and close() refuses
    while an open cache still uses it. Any number of Python threads may run
    jobs on one pool; close() waits for the jobs in flight."""

    def __init__(self, n_threads=0):
        self._lock = RWLock()
        handle = ctypes.c_void_p()
        self._p = None
        self._users = weakref.WeakSet()
        check(_ffi.fn("kv_pool_create")(integer(n_threads, "n_threads", 0), ctypes.byref(handle)),
              "kv_pool_create")
        self._p = handle

    @property
    @reads
    def threads(self):
        """kv_pool_threads: the threads a job runs on, the caller included."""
        return int(_ffi.fn("kv_pool_threads")(self._h()))

    @reads
    def run(self, n_tasks, fn):
        """kv_pool_run: calls fn(task, thread) for every task in [0, n_tasks),
        spread over the pool, and returns when all are done. fn runs with the
        GIL held, so this serves tests and demonstrations more than speed. The
        first exception fn raised is raised here once every task has run."""
        n_tasks = integer(n_tasks, "n_tasks", 0)
        errors = []

        def trampoline(ctx, task, thread):
            try:
                fn(task, thread)
            except BaseException as e:  # an exception must not cross the C frames
                errors.append(e)

        cb = _ffi.TASK_FN(trampoline)   # kept alive in this frame for the call
        check(_ffi.fn("kv_pool_run")(self._h(), n_tasks, cb, None), "kv_pool_run")
        if errors:
            raise errors[0]

    def _h(self):
        if self._p is None:
            raise ValueError("the pool is closed")
        return self._p

    @writes
    def close(self):
        """kv_pool_free, once no open cache uses the pool."""
        if self._p is None:
            return
        if any(c._c is not None and c._pool is self for c in self._users):
            raise ValueError("the pool is still set on an open cache: close it or set_pool(None) first")
        _ffi.fn("kv_pool_free")(self._p)
        self._p = None

    def __repr__(self):
        return "Pool(closed)" if self._p is None else f"Pool(threads={self.threads})"
