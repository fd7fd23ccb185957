"""Attention without a cache, RoPE, and the price of a token: the pure
functions of libkvcache (safe to call from several threads at once; ctypes
releases the GIL for the duration of each C call)."""
import ctypes

import numpy as np

from . import _ffi
from ._arrays import contiguous, int32_array, integer, precision_of, ptr, real_array, scale_arg
from .errors import check

DTYPES = {"f64": 0, "f32": 1, "f16": 2, "bf16": 3, "q8": 4}


def dtype_code(dtype):
    """The kv_dtype code of a storage type name ('f64', 'f32', 'f16', 'bf16', 'q8')."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")


def dtype_size(dtype):
    """Bytes one stored element takes (q8: 1, its scale counted apart)."""
    return int(_ffi.fn("kv_dtype_size")(dtype_code(dtype)))


def simd_name():
    """The instruction set of the FP32 kernels: 'scalar', 'avx2' or 'avx512'."""
    return _ffi.fn("kv_simd_name")().decode()


def simd_select(name):
    """Chooses the FP32 kernels' instruction set process-wide ('auto' for the
    best this CPU has); KVCacheError ERR_UNSUPPORTED when this CPU or build
    lacks it. Not thread-safe: call it before starting work."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    check(_ffi.fn("kv_simd_select")(name.encode()), "kv_simd_select")


def price_per_token(n_layers, n_kv_heads, head_dim, dtype="bf16"):
    """KV bytes one token costs: 2 x layers x kv_heads x head_dim x bytes per
    element (+ the f32 scales for q8). Llama 3.1 8B: price_per_token(32, 8, 128)
    == 131072."""
    args = [integer(n_layers, "n_layers", 1), integer(n_kv_heads, "n_kv_heads", 1),
            integer(head_dim, "head_dim", 1)]
    return int(_ffi.fn("kv_price_per_token")(*args, dtype_code(dtype)))


def price_tokens(n_layers, n_kv_heads, head_dim, dtype, n_tokens):
    """price_per_token x n_tokens, saturating at 2**64 - 1."""
    args = [integer(n_layers, "n_layers", 1), integer(n_kv_heads, "n_kv_heads", 1),
            integer(head_dim, "head_dim", 1)]
    n = integer(n_tokens, "n_tokens", 0, 2**64 - 1)
    return int(_ffi.fn("kv_price_tokens")(*args, dtype_code(dtype), n))


def attention(q, k, v, window=0, scale=None):
    """Attention over plain arrays of one sequence, no cache.

    q [H, T, d]; k, v [Hkv, S, d] with S >= T and H % Hkv == 0. Query i sits at
    absolute position S - T + i and sees key j when j <= S - T + i (and, for
    window W > 0, j > S - T + i - W). scale None means 1/sqrt(d). Returns
    [H, T, d]: float64 computed in float64 when any input is float64, else
    float32 with FP32 accumulation (kv_attention_f64 / kv_attention_f32).
    """
    q = real_array(q, "q", 3)
    k = real_array(k, "k", 3)
    v = real_array(v, "v", 3)
    H, T, d = q.shape
    Hkv, S, dk = k.shape
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {k.shape}, got {v.shape}")
    if dk != d:
        raise ValueError(f"q and k must share head_dim: q {q.shape}, k {k.shape}")
    if not (1 <= d <= _ffi.KV_MAX_HEAD_DIM):
        raise ValueError(f"head_dim must be in 1..{_ffi.KV_MAX_HEAD_DIM}, got {d}")
    if H == 0 or Hkv == 0 or H % Hkv:
        raise ValueError(f"the query heads ({H}) must be a positive multiple of the KV heads ({Hkv})")
    if T > S:
        raise ValueError(f"more queries than keys: T = {T} > S = {S}")
    window = integer(window, "window", 0)
    dt = precision_of(q, k, v)
    if T == 0:
        return np.zeros((H, 0, d), dtype=dt)
    # the C call takes [T, H, d] and [S, Hkv, d]
    qc = contiguous(q.transpose(1, 0, 2), dt)
    kc = contiguous(k.transpose(1, 0, 2), dt)
    vc = contiguous(v.transpose(1, 0, 2), dt)
    out = np.empty((T, H, d), dtype=dt)
    name = "kv_attention_f64" if dt == np.float64 else "kv_attention_f32"
    check(_ffi.fn(name)(T, S, H, Hkv, d, ptr(qc), ptr(kc), ptr(vc), ptr(out), window,
                        scale_arg(scale)), name)
    return np.ascontiguousarray(out.transpose(1, 0, 2))


LAYOUTS = {"neox": 0, "interleaved": 1}
SCALINGS = {None: 0, "none": 0, "llama3": 1}


class Rope:
    """Rotary position embeddings at absolute positions (kv_rope_init/apply).

    layout 'neox' rotates the pairs (x[i], x[i + r/2]) (split halves, HF Llama),
    'interleaved' the pairs (x[2i], x[2i+1]) (GPT-J, GGUF). rot_dim r <= head_dim,
    even; 0 means head_dim. scaling 'llama3' is Llama 3.1's frequency scaling
    with factor, low_freq_factor, high_freq_factor and original_context.
    """

    def __init__(self, head_dim, rot_dim=0, layout="neox", theta=10000.0, scaling=None, factor=8.0,
                 low_freq_factor=1.0, high_freq_factor=4.0, original_context=8192):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be 'neox' or 'interleaved', got {layout!r}")
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be None or 'llama3', got {scaling!r}")
        p = _ffi.RopeParams(head_dim=integer(head_dim, "head_dim"), rot_dim=integer(rot_dim, "rot_dim"),
                            layout=LAYOUTS[layout], theta=float(theta), scaling=SCALINGS[scaling],
                            factor=float(factor), low_freq_factor=float(low_freq_factor),
                            high_freq_factor=float(high_freq_factor),
                            original_context=integer(original_context, "original_context"))
        self._rope = _ffi.Rope()
        check(_ffi.fn("kv_rope_init")(ctypes.byref(self._rope), ctypes.byref(p)), "kv_rope_init")
        self.layout = layout
        self.scaling = scaling or "none"

    @property
    def head_dim(self):
        return self._rope.params.head_dim

    @property
    def rot_dim(self):
        return self._rope.params.rot_dim

    @property
    def theta(self):
        return self._rope.params.theta

    @property
    def inv_freq(self):
        """[rot_dim / 2] angle per position of each pair."""
        return np.array(self._rope.inv_freq[: self.rot_dim // 2])

    def apply(self, x, positions):
        """Returns x rotated: x [n, n_heads, head_dim] (or [n, head_dim]); row t
        by the angle positions[t] x inv_freq. positions: [n] ints >= 0, or an int
        p0 meaning p0, p0 + 1, ... float64 in, float64 out; float32 otherwise."""
        x = real_array(x, "x", (2, 3))
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x's last dimension must be head_dim = {self.head_dim}, got shape {x.shape}")
        n = x.shape[0]
        if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
            p0 = integer(positions, "positions", 0)
            integer(p0 + max(n - 1, 0), "last position")
            pos = np.arange(p0, p0 + n, dtype=np.int32)
        else:
            pos = int32_array(positions, "positions")
            if pos.shape[0] != n:
                raise ValueError(f"positions must have one entry per row of x ({n}), got {pos.shape[0]}")
        dt = precision_of(x)
        out = np.array(x, dtype=dt, order="C", copy=True)
        n_heads = 1 if x.ndim == 2 else x.shape[1]
        if n == 0 or n_heads == 0:
            return out
        name = "kv_rope_apply_f64" if dt == np.float64 else "kv_rope_apply_f32"
        check(_ffi.fn(name)(ctypes.byref(self._rope), ptr(out), n, n_heads, ptr(pos)), name)
        return out

    def __repr__(self):
        return (f"Rope(head_dim={self.head_dim}, rot_dim={self.rot_dim}, layout={self.layout!r}, "
                f"theta={self.theta}, scaling={self.scaling!r})")
