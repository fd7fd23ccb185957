"""The paged KV cache: sequences, ragged batches, append/read/attend/step.

Shapes are one sequence's (k, v [Hkv, t, d], q [H, T, d]) in the single-sequence
calls and the C API's for ragged batches (rows stacked: k, v [rows, Hkv, d],
q [rows, H, d], x [rows, D]), because a ragged batch has no common T to put in an axis.
"""
import collections
import ctypes
import inspect
import os

import numpy as np

from . import _ffi
from ._ffi import Closing
from ._lock import RWLock, writes
from ._lock import reads as _reads_plain
from ._arrays import contiguous, int32_array, integer, null, ptr, real_array, scale_arg
from .attention import DTYPES, Rope, dtype_code
from .errors import KVCacheError, check

Stats = collections.namedtuple("Stats", [f for f, _ in _ffi.CacheStats._fields_])
Stats.__doc__ = "kv_cache_get_stats: page counts and bytes of one cache."


def reads(method):
    """The method only reads the cache (it shares the cache's lock). With
    seq=None it acts on the default sequence, which is created first, under
    the lock held alone, when it does not exist yet."""
    plain = _reads_plain(method)
    sig = inspect.signature(method)
    if "seq" not in sig.parameters:
        return plain

    def wrapper(self, *args, **kwargs):
        if sig.bind(self, *args, **kwargs).arguments.get("seq") is None:
            while True:
                if self._default is None:
                    with self._lock.writing():
                        self._seq(None)
                with self._lock.reading():
                    if self._default is not None or self._c is None:
                        return method(self, *args, **kwargs)
        return plain(self, *args, **kwargs)
    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = method.__name__, method.__doc__, method
    return wrapper


class Batch:
    """A ragged batch in CSR form, mirroring kv_batch: sequence seqs[b] owns the
    rows row_start[b] .. row_start[b+1]-1 of the stacked arrays, so its
    T_b = row_start[b+1] - row_start[b]. Row i of sequence b sits at absolute
    position S_b - T_b + i, S_b being the sequence's length at the call (the
    T_b new positions already reserved).

        Batch([3, 5], [0, 7, 8])          # CSR arrays: seq 3 has 7 rows, seq 5 one
        Batch.of([(3, 7), (5, 1)])        # the same from (seq_id, n_rows) pairs
    """

    def __init__(self, seqs, row_start):
        self.seqs = int32_array(seqs, "seqs")
        self.row_start = int32_array(row_start, "row_start")
        n = self.seqs.shape[0]
        if self.row_start.shape[0] != n + 1:
            raise ValueError(f"row_start must have n_seqs + 1 = {n + 1} entries, got {self.row_start.shape[0]}")
        if self.row_start[0] != 0:
            raise ValueError(f"row_start[0] must be 0, got {self.row_start[0]}")
        if np.any(np.diff(self.row_start) < 0):
            raise ValueError(f"row_start must be non-decreasing, got {self.row_start.tolist()}")
        self._c = _ffi.Batch(n, ptr(self.seqs), ptr(self.row_start))

    @classmethod
    def of(cls, pairs):
        """From a list of (seq_id, n_rows) pairs, in row order."""
        pairs = list(pairs)
        for p in pairs:
            if not (isinstance(p, (tuple, list)) and len(p) == 2):
                raise ValueError(f"a batch is a list of (seq_id, n_rows) pairs; got {p!r}")
        counts = [integer(n, "n_rows", 0) for _, n in pairs]
        row_start = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        return cls([integer(s, "seq_id") for s, _ in pairs], row_start)

    @property
    def n_seqs(self):
        return int(self.seqs.shape[0])

    @property
    def rows(self):
        """Total rows: row_start[n_seqs]."""
        return int(self.row_start[-1])

    @property
    def counts(self):
        """[n_seqs] T_b of each sequence."""
        return np.diff(self.row_start)

    def split(self, a):
        """The per-sequence pieces of a stacked [rows, ...] array."""
        return [a[self.row_start[b]:self.row_start[b + 1]] for b in range(self.n_seqs)]

    def __len__(self):
        return self.n_seqs

    def __iter__(self):
        return iter(zip(self.seqs.tolist(), self.counts.tolist()))

    def __repr__(self):
        return f"Batch.of({list(self)})"


def c_path(path):
    """A file name as C reads it. A NUL byte would end it early, so C would
    use another file: refused as open() refuses it."""
    b = os.fsencode(path)
    if b"\0" in b:
        raise ValueError(f"embedded null byte in path {path!r}")
    return b


def as_batch(batch):
    return batch if isinstance(batch, Batch) else Batch.of(batch)


class KVCache(Closing):
    """A paged KV cache (kv_cache_create): a pool of n_pages pages of page_size
    positions of K and V, for n_layers layers and n_kv_heads heads of head_dim.

    dtype is the storage type: 'f64' (computed in float64: the reference grade),
    'f32', 'f16', 'bf16' or 'q8' (int8 with a scale per token and head), the last
    four computed with FP32 accumulation. window W > 0 makes a sliding-window
    cache that returns pages older than the window to the pool; no_evict=True
    keeps them (attention still sees only the window), as a full cache would.

    Methods that take seq=None act on the cache's default sequence, created on
    first use; the single-sequence flow (append, attend, step) needs no
    more. Several sequences: new_seq, fork, remove, and the *_batch methods.

    Threads: any number of Python threads may use one cache. Calls that change
    it run one at a time, calls that only read it (attend, read, length,
    stats, save) run together; close() waits for the calls in flight, and
    every call after it raises ValueError.
    """

    def __init__(self, n_kv_heads, head_dim, dtype="f64", page_size=16, n_pages=256, window=0,
                 n_layers=1, max_seqs=1, max_seq_len=0, no_evict=False):
        self._lock = RWLock()
        self._c = None
        self._default = None
        p = _ffi.CacheParams(n_layers=integer(n_layers, "n_layers"),
                             n_kv_heads=integer(n_kv_heads, "n_kv_heads"),
                             head_dim=integer(head_dim, "head_dim"), dtype=dtype_code(dtype),
                             page_size=integer(page_size, "page_size"), n_pages=integer(n_pages, "n_pages"),
                             max_seqs=integer(max_seqs, "max_seqs"), max_seq_len=integer(max_seq_len, "max_seq_len"),
                             window=integer(window, "window"), no_evict=1 if no_evict else 0)
        self._c = None
        self._pool = None
        handle = ctypes.c_void_p()
        check(_ffi.fn("kv_cache_create")(ctypes.byref(p), ctypes.byref(handle)), "kv_cache_create")
        self._c = handle
        self._params = self._read_params()  # fixed for the cache's life
        self._default = None
        self.dtype = dtype
        # the precision of every data call: *_f64 for an f64 cache, *_f32 otherwise
        self.compute_dtype = np.float64 if dtype == "f64" else np.float32
        self._sfx = "f64" if dtype == "f64" else "f32"

    # ---------------------------------------------------------------- lifetime

    @writes
    def close(self):
        """Frees the cache (kv_cache_free) once the calls in flight are done;
        later calls raise ValueError."""
        if self._c is not None:
            _ffi.fn("kv_cache_free")(self._c)
            self._c = None
            self._pool = None

    @writes
    def set_pool(self, pool):
        """Runs this cache's attention on a kvcache.Pool (None: the calling
        thread only), kv_cache_set_pool. The cache keeps the pool alive."""
        from .threads import Pool
        if pool is not None and not isinstance(pool, Pool):
            raise TypeError(f"pool must be a kvcache.Pool or None, got {type(pool).__name__}")
        if pool is None:
            _ffi.fn("kv_cache_set_pool")(self._h(), None)
            self._pool = None
            return
        with pool._lock.reading():  # the pool cannot close meanwhile
            _ffi.fn("kv_cache_set_pool")(self._h(), pool._h())
            self._pool = pool
            pool._users.add(self)

    def _h(self):
        if self._c is None:
            raise ValueError("the cache is closed")
        return self._c

    def _call(self, name, *args):
        return check(_ffi.fn(name)(self._h(), *args), name)

    # ---------------------------------------------------------------- configuration

    def _read_params(self):
        p = _ffi.fn("kv_cache_get_params")(self._h())
        d = {f: getattr(p, f) for f, _ in _ffi.CacheParams._fields_}
        d["dtype"] = {v: k for k, v in DTYPES.items()}[d["dtype"]]
        return d

    @property
    @reads
    def params(self):
        """kv_cache_get_params as a dict (max_seq_len resolved, dtype by name)."""
        self._h()
        return dict(self._params)

    n_layers = property(lambda self: self._params["n_layers"])
    n_kv_heads = property(lambda self: self._params["n_kv_heads"])
    head_dim = property(lambda self: self._params["head_dim"])
    page_size = property(lambda self: self._params["page_size"])
    n_pages = property(lambda self: self._params["n_pages"])
    max_seqs = property(lambda self: self._params["max_seqs"])
    max_seq_len = property(lambda self: self._params["max_seq_len"])
    window = property(lambda self: self._params["window"])

    @reads
    def stats(self):
        """kv_cache_get_stats as a Stats named tuple (pages_used, bytes_per_token, ...)."""
        s = _ffi.fn("kv_cache_get_stats")(self._h())
        return Stats(*(getattr(s, f) for f in Stats._fields))

    @reads
    def __repr__(self):
        if self._c is None:
            return "KVCache(closed)"
        p = self.params
        return "KVCache(" + ", ".join(f"{k}={v!r}" for k, v in p.items()) + ")"

    # ---------------------------------------------------------------- sequences

    def _seq(self, seq):
        if seq is None:
            if self._default is None:
                self._default = self.new_seq()
            return self._default
        return integer(seq, "seq")

    @writes
    def new_seq(self):
        """Takes a free sequence slot (kv_seq_new); returns its id."""
        out = ctypes.c_int32()
        self._call("kv_seq_new", ctypes.byref(out))
        return out.value

    @writes
    def remove(self, seq=None):
        """Releases the sequence and its pages (kv_seq_remove)."""
        s = self._seq(seq)
        self._call("kv_seq_remove", s)
        if s == self._default:
            self._default = None

    @reads
    def length(self, seq=None):
        """S, the positions the sequence holds (kv_seq_length)."""
        return self._call("kv_seq_length", self._seq(seq))

    @writes
    def reserve(self, n_new, seq=None, tokens=None):
        """Room for n_new positions after the current length, all or nothing
        (kv_seq_reserve). tokens [n_new] are their token ids, which name full
        pages for the prefix cache; None when unknown. The new positions must
        then be written in every layer (write, or step with reserve=False)."""
        n_new = integer(n_new, "n_new", 0)
        tok = self._tokens(tokens, n_new)
        self._call("kv_seq_reserve", self._seq(seq), n_new, ptr(tok) if tok is not None else null(_ffi.P_int32))

    @writes
    def fork(self, seq=None):
        """A new sequence sharing every page of seq, copy-on-write (kv_seq_fork)."""
        out = ctypes.c_int32()
        self._call("kv_seq_fork", self._seq(seq), ctypes.byref(out))
        return out.value

    @writes
    def truncate(self, new_len, seq=None):
        """Drops every position >= new_len (kv_seq_truncate)."""
        self._call("kv_seq_truncate", self._seq(seq), integer(new_len, "new_len", 0))

    @writes
    def rerotate(self, rope, delta, start=0, n=None, seq=None):
        """Turns the cached K of positions [start, start + n) (n None: to the
        end) by delta positions in every layer, so a key rotated at p becomes
        the key rotated at p + delta (kv_seq_rerotate)."""
        s = self._seq(seq)
        start = integer(start, "start", 0)
        n = self.length(s) - start if n is None else integer(n, "n", 0)
        self._call("kv_seq_rerotate", s, start, n, integer(delta, "delta"), ctypes.byref(rope._rope))

    @writes
    def shift(self, n_keep, n_discard, rope=None, seq=None):
        """Context shift (kv_seq_shift): drops positions [n_keep, n_keep +
        n_discard) and moves the later ones down by n_discard, their keys
        re-rotated by -n_discard with rope (None: moved unrotated)."""
        self._call("kv_seq_shift", self._seq(seq), integer(n_keep, "n_keep", 0),
                   integer(n_discard, "n_discard", 0), ctypes.byref(rope._rope) if rope is not None else None)

    @writes
    def prefix_match(self, tokens, seq=None):
        """On an empty sequence, reuses cached pages holding the longest
        page-aligned prefix of tokens (kv_seq_prefix_match); returns how many
        positions (a multiple of page_size) are now cached."""
        tok = int32_array(tokens, "tokens")
        out = ctypes.c_int32()
        self._call("kv_seq_prefix_match", self._seq(seq), ptr(tok), tok.shape[0], ctypes.byref(out))
        return out.value

    @reads
    def prefix_lookup(self, tokens):
        """How many positions prefix_match would reuse for tokens, changing
        nothing (kv_prefix_lookup)."""
        tok = int32_array(tokens, "tokens")
        out = ctypes.c_int32()
        self._call("kv_prefix_lookup", ptr(tok), tok.shape[0], ctypes.byref(out))
        return out.value

    @writes
    def prefix_clear(self):
        """Empties the prefix cache (kv_prefix_clear): cached pages become free
        and no page can be found by prefix_match until named again."""
        self._call("kv_prefix_clear")

    @reads
    def save(self, path, seq=None):
        """Writes the sequence's tokens and K/V to a file (kv_seq_save)."""
        self._call("kv_seq_save", self._seq(seq), c_path(path))

    @writes
    def restore(self, path):
        """Reads a kv_seq_save file into a new sequence (kv_seq_restore); returns its id."""
        out = ctypes.c_int32()
        self._call("kv_seq_restore", c_path(path), ctypes.byref(out))
        return out.value

    def _tokens(self, tokens, n):
        if tokens is None:
            return None
        tok = int32_array(tokens, "tokens")
        if tok.shape[0] != n:
            raise ValueError(f"tokens must have one id per new position ({n}), got {tok.shape[0]}")
        return tok

    # ---------------------------------------------------------------- checks

    def _kv(self, k, v, lead, name_k="k", name_v="v"):
        """k and v [*lead, Hkv, d] in the cache's precision (lead: the leading axes)."""
        Hkv, d = self.n_kv_heads, self.head_dim
        k = real_array(k, name_k, len(lead) + 2)
        v = real_array(v, name_v, len(lead) + 2)
        want = tuple(lead) + (Hkv, d)
        for a, name in ((k, name_k), (v, name_v)):
            if a.shape != want:
                raise ValueError(f"{name} must have shape {want} [rows, Hkv, d], got {a.shape}")
        return contiguous(k, self.compute_dtype), contiguous(v, self.compute_dtype)

    def _sequence_layout(self, k, v, name_k, name_v):
        """k and v [Hkv, t, d] (or [n_layers, Hkv, t, d] when ndim is 4), the
        one sequence's layout, checked as the caller wrote them; returns t."""
        multi = k.ndim == 4
        t = k.shape[-2]
        want = ((self.n_layers,) if multi else ()) + (self.n_kv_heads, t, self.head_dim)
        names = "[n_layers, Hkv, t, d]" if multi else "[Hkv, t, d]"
        for a, name in ((k, name_k), (v, name_v)):
            if a.shape != want:
                raise ValueError(f"{name} must have shape {want} {names}, got {a.shape}")
        return t

    def _heads(self, H):
        H = integer(H, "H", 1)
        if H % self.n_kv_heads:
            raise ValueError(f"the query heads ({H}) must be a multiple of the KV heads ({self.n_kv_heads})")
        return H

    def _layer(self, layer):
        return integer(layer, "layer", 0, self.n_layers - 1)

    # ---------------------------------------------------------------- one sequence

    @writes
    def append(self, k_new, v_new, seq=None):
        """Appends to one sequence: reserves t positions and writes k_new,
        v_new [Hkv, t, d] (with n_layers > 1: [n_layers, Hkv, t, d], every layer
        at once), then returns the cached K, V [Hkv, S, d] (or [n_layers, Hkv, S, d]),
        read back as stored (rounded for f16/bf16/q8). In a window cache only the
        keys the new rows can see come back: positions max(0, S - t - W + 1) .. S - 1."""
        multi = self.n_layers > 1
        ndim = 4 if multi else 3
        k_new = real_array(k_new, "k_new", ndim)
        v_new = real_array(v_new, "v_new", ndim)
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new and v_new must have one shape, got {k_new.shape} and {v_new.shape}")
        t = self._sequence_layout(k_new, v_new, "k_new", "v_new")
        kl = k_new if multi else k_new[None]
        vl = v_new if multi else v_new[None]
        # [L, Hkv, t, d] -> [L, t, Hkv, d], the C layout; checked before anything changes
        rows = [self._kv(kl[l].transpose(1, 0, 2), vl[l].transpose(1, 0, 2), (t,), "k_new", "v_new")
                for l in range(self.n_layers)]
        s = self._seq(seq)
        before = self.length(s)
        self.reserve(t, s)
        try:
            for layer, (k, v) in enumerate(rows):
                self._write(Batch([s], [0, t]), k, v, layer)
        except Exception:
            self.truncate(before, s)
            raise
        S = before + t
        W = self.window
        start = max(0, S - t - W + 1) if W > 0 else 0
        out = [self.read(s, layer, start, S - start) for layer in range(self.n_layers)]
        if not multi:
            return out[0]
        return np.stack([o[0] for o in out]), np.stack([o[1] for o in out])

    @writes
    def write(self, k, v, seq=None, layer=0):
        """kv_append for one sequence: writes k, v [Hkv, t, d] at its t newest
        (already reserved) positions in `layer`."""
        k = real_array(k, "k", 3)
        v = real_array(v, "v", 3)
        t = self._sequence_layout(k, v, "k", "v")
        kc, vc = self._kv(k.transpose(1, 0, 2), v.transpose(1, 0, 2), (t,))
        self._write(Batch([self._seq(seq)], [0, t]), kc, vc, self._layer(layer))

    def _write(self, batch, k, v, layer):
        name = "kv_append_" + self._sfx
        self._call(name, layer, ctypes.byref(batch._c), ptr(k), ptr(v))

    @reads
    def read(self, seq=None, layer=0, start=0, n=None):
        """The cached K, V of positions [start, start + n) as [Hkv, n, d]
        (kv_read; n None: up to the sequence's length)."""
        s = self._seq(seq)
        layer = self._layer(layer)
        start = integer(start, "start", 0)
        n = self.length(s) - start if n is None else integer(n, "n", 0)
        if n < 0:
            raise ValueError(f"start {start} is past the sequence's length {self.length(s)}")
        Hkv, d = self.n_kv_heads, self.head_dim
        k = np.empty((n, Hkv, d), dtype=self.compute_dtype)
        v = np.empty_like(k)
        self._call("kv_read_" + self._sfx, layer, s, start, n, ptr(k), ptr(v))
        return np.ascontiguousarray(k.transpose(1, 0, 2)), np.ascontiguousarray(v.transpose(1, 0, 2))

    @reads
    def attend(self, q, seq=None, layer=0, scale=None):
        """q [H, T, d] of the sequence's T newest positions attends over its
        cache (kv_attend); returns [H, T, d]. Query i sits at S - T + i."""
        q = real_array(q, "q", 3)
        H, T, d = q.shape
        if d != self.head_dim:
            raise ValueError(f"q must have head_dim {self.head_dim}, got shape {q.shape}")
        H = self._heads(H)
        out = self.attend_batch(Batch([self._seq(seq)], [0, T]), q.transpose(1, 0, 2), layer, scale)
        return np.ascontiguousarray(out.transpose(1, 0, 2))

    @writes
    def step(self, x, Wq, Wk, Wv, H, rope=None, seq=None, layer=0, scale=None, reserve=True,
             tokens=None):
        """One layer's step on one sequence: x [t, D] holds the new tokens only;
        reserves t positions (unless reserve=False: with several layers, reserve
        once and step each layer with reserve=False), projects them once
        (Wq [D, H*d], Wk and Wv [D, Hkv*d]), rotates q and k at their absolute
        positions when a Rope is given, appends k and v in place and attends
        (kv_step). Returns [t, H*d]."""
        x = real_array(x, "x", 2)
        return self.step_batch(Batch([self._seq(seq)], [0, x.shape[0]]), x, Wq, Wk, Wv, H, rope, layer,
                               scale, reserve, tokens)

    # ---------------------------------------------------------------- ragged batches

    @writes
    def reserve_batch(self, batch, tokens=None):
        """kv_batch_reserve: T_b new positions for every sequence of the batch,
        all or nothing across the batch. tokens [rows] or None."""
        b = as_batch(batch)
        tok = self._tokens(tokens, b.rows)
        self._call("kv_batch_reserve", ctypes.byref(b._c), ptr(tok) if tok is not None else null(_ffi.P_int32))

    @writes
    def append_batch(self, batch, k, v, layer=0):
        """kv_append: k, v [rows, Hkv, d] go to the T_b newest (reserved)
        positions of each sequence of the batch, in `layer`."""
        b = as_batch(batch)
        kc, vc = self._kv(k, v, (b.rows,))
        self._write(b, kc, vc, self._layer(layer))

    @reads
    def attend_batch(self, batch, q, layer=0, scale=None):
        """kv_attend: q [rows, H, d] over the cache of `layer`; returns [rows, H, d].
        Row i of sequence b sits at S_b - T_b + i."""
        b = as_batch(batch)
        q = real_array(q, "q", 3)
        if q.shape[0] != b.rows or q.shape[2] != self.head_dim:
            raise ValueError(f"q must have shape [rows={b.rows}, H, d={self.head_dim}], got {q.shape}")
        H = self._heads(q.shape[1])
        qc = contiguous(q, self.compute_dtype)
        out = np.zeros_like(qc)
        name = "kv_attend_" + self._sfx
        self._call(name, self._layer(layer), ctypes.byref(b._c), H, ptr(qc), ptr(out), scale_arg(scale))
        return out

    @writes
    def step_batch(self, batch, x, Wq, Wk, Wv, H, rope=None, layer=0, scale=None, reserve=True,
                   tokens=None):
        """kv_step over a ragged batch: x [rows, D], row i of sequence b at
        absolute position S_b - T_b + i (S_b after the reserve). With
        reserve=True, first kv_batch_reserve (all or nothing), undone if the
        step then fails. Returns [rows, H*d]."""
        b = as_batch(batch)
        x = real_array(x, "x", 2)
        Wq = real_array(Wq, "Wq", 2)
        Wk = real_array(Wk, "Wk", 2)
        Wv = real_array(Wv, "Wv", 2)
        H = self._heads(H)
        rows, D = x.shape
        Hkv, d = self.n_kv_heads, self.head_dim
        if rows != b.rows:
            raise ValueError(f"x must have one row per batch row ({b.rows}), got shape {x.shape}")
        for W, name, cols in ((Wq, "Wq", H * d), (Wk, "Wk", Hkv * d), (Wv, "Wv", Hkv * d)):
            if W.shape != (D, cols):
                raise ValueError(f"{name} must have shape [D={D}, {cols}], got {W.shape}")
        if rope is not None:
            if not isinstance(rope, Rope):
                raise TypeError(f"rope must be a kvcache.Rope or None, got {type(rope).__name__}")
            if rope.head_dim != d:
                raise ValueError(f"rope.head_dim ({rope.head_dim}) must equal the cache's head_dim ({d})")
        layer = self._layer(layer)
        dt = self.compute_dtype
        xc, wq, wk, wv = (contiguous(a, dt) for a in (x, Wq, Wk, Wv))
        L = _ffi.Layer(layer=layer, dim=D, n_heads=H, wq=wq.ctypes.data,
                       wk=wk.ctypes.data, wv=wv.ctypes.data,
                       rope=ctypes.pointer(rope._rope) if rope is not None else None,
                       scale=scale_arg(scale))
        out = np.zeros((rows, H * d), dtype=dt)
        scratch = np.empty(max(int(_ffi.fn("kv_step_scratch")(self._h(), ctypes.byref(L), rows)), 1), dtype=dt)
        before = None
        if reserve:
            before = [self.length(s) for s in b.seqs.tolist()]
            self.reserve_batch(b, tokens)
        elif tokens is not None:
            raise ValueError("tokens go with reserve=True (they name the reserved positions)")
        try:
            self._call("kv_step_" + self._sfx, ctypes.byref(L), ctypes.byref(b._c), ptr(xc), ptr(out), ptr(scratch))
        except KVCacheError:
            if before is not None:
                for s, n in zip(b.seqs.tolist(), before):
                    self.truncate(n, s)
            raise
        return out


def step(x, Wq, Wk, Wv, cache, H, Hkv, rope=None, **kwargs):
    """step(x, Wq, Wk, Wv, cache, H, Hkv) on one sequence: x [t, D] new tokens only;
    returns [t, H*d]. Hkv must be the cache's n_kv_heads; keyword arguments
    (seq, layer, scale, reserve, tokens) go to KVCache.step."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a kvcache.KVCache, got {type(cache).__name__}")
    if integer(Hkv, "Hkv", 1) != cache.n_kv_heads:
        raise ValueError(f"Hkv ({Hkv}) must equal the cache's n_kv_heads ({cache.n_kv_heads})")
    return cache.step(x, Wq, Wk, Wv, H, rope=rope, **kwargs)
