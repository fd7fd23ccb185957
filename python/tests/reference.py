"""An independent numpy reference for the binding's tests: the seed's
algorithm written out (explicit mask, np.repeat for GQA, float64 throughout),
RoPE from its definition, and the storage formats' rounding. Nothing here
calls the library."""
import numpy as np


def attention(q, k, v, window=0, scale=None):
    """q [H, T, d]; k, v [Hkv, S, d]. Query i at S - T + i sees key j iff
    j <= S - T + i and (window W > 0) j > S - T + i - W."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    if T == 0:
        return np.zeros_like(q)
    k = np.repeat(k, H // Hkv, axis=0)
    v = np.repeat(v, H // Hkv, axis=0)
    s = q @ k.transpose(0, 2, 1) * (1 / np.sqrt(d) if scale is None else scale)
    pos = np.arange(T)[:, None] + (S - T)
    key = np.arange(S)[None, :]
    mask = key <= pos
    if window:
        mask &= key > pos - window
    s = np.where(mask, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


class Cache:
    """The seed's KVCache: concatenation, one sequence."""

    def __init__(self, Hkv, d):
        self.k = np.zeros((Hkv, 0, d))
        self.v = np.zeros((Hkv, 0, d))

    def append(self, k_new, v_new):
        self.k = np.concatenate([self.k, k_new], axis=1)
        self.v = np.concatenate([self.v, v_new], axis=1)
        return self.k, self.v


def rope_inv_freq(rot_dim, theta=10000.0, llama3=None):
    """Angle per position of each of the rot_dim/2 pairs. llama3: (factor,
    low_freq_factor, high_freq_factor, original_context)."""
    f = theta ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    if llama3:
        factor, lo, hi, ctx = llama3
        wavelen = 2 * np.pi / f
        low_wl, high_wl = ctx / lo, ctx / hi
        smooth = (ctx / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * f / factor + smooth * f
        f = np.where(wavelen > low_wl, f / factor, np.where(wavelen < high_wl, f, mid))
    return f


def rope(x, pos, layout="neox", rot_dim=None, theta=10000.0, llama3=None):
    """x [n, heads, d] rotated: row t by pos[t] * inv_freq, as complex products."""
    x = np.array(x, dtype=np.float64)
    d = x.shape[-1]
    r = rot_dim or d
    ang = np.asarray(pos, dtype=np.float64)[:, None] * rope_inv_freq(r, theta, llama3)[None, :]
    rot = np.exp(1j * ang)[:, None, :]                          # [n, 1, r/2]
    if layout == "neox":
        z = x[..., : r // 2] + 1j * x[..., r // 2: r]
        z = z * rot
        x[..., : r // 2], x[..., r // 2: r] = z.real, z.imag
    else:
        z = x[..., 0:r:2] + 1j * x[..., 1:r:2]
        z = z * rot
        x[..., 0:r:2], x[..., 1:r:2] = z.real, z.imag
    return x


def step(x, Wq, Wk, Wv, cache, H, Hkv, rope_args=None, window=0):
    """The seed's step; rope_args (a dict for rope()) rotates q and k at their
    absolute positions S_before + i before k is cached."""
    t, D = x.shape
    d = Wq.shape[1] // H
    q = (x @ Wq).reshape(t, H, d)
    k = (x @ Wk).reshape(t, Hkv, d)
    v = (x @ Wv).reshape(t, Hkv, d).transpose(1, 0, 2)
    if rope_args is not None:
        pos = cache.k.shape[1] + np.arange(t)
        q = rope(q, pos, **rope_args)
        k = rope(k, pos, **rope_args)
    K, V = cache.append(k.transpose(1, 0, 2), v)
    return attention(q.transpose(1, 0, 2), K, V, window).transpose(1, 0, 2).reshape(t, H * d)


# ------------------------------------------------------------------ storage rounding

def round_f16(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


def round_bf16(a):
    """Round to nearest even on the top 16 bits of float32 (finite inputs)."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def round_q8(a):
    """Per row of the last axis: scale = max|x| / 127, x ~ scale * round(x / scale)."""
    a = np.asarray(a, dtype=np.float32)
    scale = np.abs(a).max(axis=-1, keepdims=True) / np.float32(127)
    safe = np.where(scale > 0, scale, 1)
    return (np.rint(a / safe).clip(-127, 127) * scale).astype(np.float32)


ROUND = {"f64": lambda a: np.asarray(a, dtype=np.float64),
         "f32": lambda a: np.asarray(a, dtype=np.float32), "f16": round_f16, "bf16": round_bf16,
         "q8": round_q8}


def int16_query_bound(q, k, v):
    """The largest error the avx512 kernels' q8 decode may add by taking each
    query vector (times 1/sqrt(d)) as int16 with one scale per vector: an
    element is off by at most qs/2, qs = max|q|/sqrt(d)/32767, a score so by
    at most qs/2 |k_j|_1, and an output, a softmax average of V, by at most
    twice that times max|v|."""
    d = q.shape[-1]
    qmax = np.abs(q).max() / np.sqrt(d)
    return qmax / 32767 * np.abs(k).sum(axis=-1).max() * np.abs(v).max()
