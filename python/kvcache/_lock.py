"""The per-object reader-writer lock that makes a cache (or pool) safe to use
from any number of Python threads.

ctypes releases the GIL inside every C call, so two threads can be inside the
library on one cache at once; the C header leaves serializing them to the
caller. Here calls that change the cache take the lock exclusively, calls that
only read it share it, and close() takes it exclusively, so it waits for every
call in flight and the calls after it find the handle gone.

A thread that holds the lock may take it again (a method calling another):
a writer may read or write, a reader may read. A reader asking to write is a
bug in the binding and raises RuntimeError instead of deadlocking. Waiting
writers go before new readers, so a stream of readers cannot starve them."""
import contextlib
import functools
import threading


class RWLock:
    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0          # threads holding it shared
        self._writer = None        # ident of the thread holding it exclusively
        self._writer_depth = 0
        self._waiting_writers = 0
        self._local = threading.local()  # .reads: this thread's shared depth

    def _reads(self):
        return getattr(self._local, "reads", 0)

    @contextlib.contextmanager
    def reading(self):
        me = threading.get_ident()
        if self._writer == me or self._reads() > 0:  # nested: already inside
            self._local.reads = self._reads() + 1
            try:
                yield
            finally:
                self._local.reads -= 1
            return
        with self._cond:
            while self._writer is not None or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        self._local.reads = 1
        try:
            yield
        finally:
            self._local.reads = 0
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self):
        me = threading.get_ident()
        if self._writer == me:
            self._writer_depth += 1
            try:
                yield
            finally:
                self._writer_depth -= 1
            return
        if self._reads() > 0:
            raise RuntimeError("kvcache: a call that changes the cache was made while reading it")
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writer is not None or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._writer = me
            self._writer_depth = 1
        try:
            yield
        finally:
            with self._cond:
                self._writer = None
                self._writer_depth = 0
                self._cond.notify_all()


def reads(method):
    """The method only reads the object: it shares the object's lock."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock.reading():
            return method(self, *args, **kwargs)
    return wrapper


def writes(method):
    """The method changes the object: it holds the object's lock alone."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock.writing():
            return method(self, *args, **kwargs)
    return wrapper
