"""Argument checks and numpy <-> C pointer plumbing shared by the modules.

Every array handed to C is made C-contiguous in the call's precision here, and
the caller keeps the returned array in a local for the duration of the call,
so numpy cannot free the memory under the library."""
import ctypes
import numbers

import numpy as np

from . import _ffi

INT32_MAX = 2**31 - 1


def real_array(a, name, ndim=None):
    """`a` as a numpy array of real floating type, checked for rank."""
    arr = np.asarray(a)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"{name} must be a float64 or float32 array, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        want = " or ".join(str(n) for n in (ndim if isinstance(ndim, tuple) else (ndim,)))
        raise ValueError(f"{name} must have {want} dimensions, got shape {arr.shape}")
    return arr


def precision_of(*arrays):
    """np.float64 when any array is float64 (or wider), else np.float32."""
    return np.float64 if any(a.dtype.itemsize >= 8 for a in arrays) else np.float32


def contiguous(a, dtype):
    return np.ascontiguousarray(a, dtype=dtype)


def ptr(a):
    """A typed pointer to the data of a C-contiguous float64/float32/int32 array."""
    assert a.flags.c_contiguous
    if a.dtype == np.float64:
        return a.ctypes.data_as(_ffi.P_double)
    if a.dtype == np.float32:
        return a.ctypes.data_as(_ffi.P_float)
    if a.dtype == np.int32:
        return a.ctypes.data_as(_ffi.P_int32)
    raise TypeError(f"no C pointer type for {a.dtype}")


def integer(x, name, lo=None, hi=INT32_MAX):
    """x as a Python int within [lo, hi], or TypeError/ValueError."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}")
    x = int(x)
    if lo is not None and x < lo:
        raise ValueError(f"{name} must be >= {lo}, got {x}")
    if hi is not None and x > hi:
        raise ValueError(f"{name} must be <= {hi}, got {x}")
    return x


def int32_array(a, name, ndim=1):
    arr = np.asarray(a)
    if arr.size == 0:
        arr = arr.astype(np.int32)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if arr.size and (arr.min() < -2**31 or arr.max() > INT32_MAX):
        raise ValueError(f"{name} has values outside int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def scale_arg(scale):
    """None means 1/sqrt(d), which the library spells 0."""
    if scale is None:
        return 0.0
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"scale must be a number or None, got {type(scale).__name__}")
    if not np.isfinite(scale) or scale == 0:
        raise ValueError(f"scale must be finite and nonzero (None for 1/sqrt(d)), got {scale}")
    return float(scale)


def null(ctype):
    return ctypes.cast(None, ctype)
