"""Loading libkvcache and declaring its C API for ctypes.

Everything here mirrors include/kvcache.h: the structs field by field (the
tests compile the header and compare every offset), and the prototype of every
function. Nothing here is public; the package's modules wrap it.

Where the library is found, first hit wins:
    1. $KVCACHE_LIB, a path to libkvcache.so (an error if it cannot be loaded)
    2. libkvcache.so next to this package (`pip install ./python` puts it there)
    3. build/libkvcache.so of the source tree this package sits in (python/../build)
    4. the system loader's search path (`make install` into a prefix it knows)
"""
import ctypes
import ctypes.util
import os

c_int32 = ctypes.c_int32
c_int = ctypes.c_int  # C enums
c_double = ctypes.c_double
c_float = ctypes.c_float
c_uint64 = ctypes.c_uint64
c_size_t = ctypes.c_size_t
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
P_int32 = ctypes.POINTER(c_int32)
P_double = ctypes.POINTER(c_double)
P_float = ctypes.POINTER(c_float)

KV_MAX_HEAD_DIM = 512
LIB_NAME = "libkvcache.so"


def _candidates():
    env = os.environ.get("KVCACHE_LIB")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, LIB_NAME),
             os.path.join(os.path.dirname(os.path.dirname(here)), "build", LIB_NAME)]
    return paths, False


def _load():
    paths, from_env = _candidates()
    if from_env:
        try:
            return ctypes.CDLL(paths[0]), paths[0]
        except OSError as e:
            raise ImportError(f"kvcache: KVCACHE_LIB={paths[0]} could not be loaded: {e}") from e
    for p in paths:
        if os.path.exists(p):
            return ctypes.CDLL(p), p
    found = ctypes.util.find_library("kvcache")
    if found:
        return ctypes.CDLL(found), found
    raise ImportError("kvcache: libkvcache.so not found. Build it with `make lib` in the source tree, "
                      "set KVCACHE_LIB=/path/to/libkvcache.so, or `pip install ./python`. Looked in: "
                      + ", ".join(paths) + " and the system library path")


lib, lib_path = _load()


# ------------------------------------------------------------------ structs

class Closing:
    """A handle on a C object freed by close(): usable as a context manager,
    and closed when collected (quietly: the interpreter may be going down)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class RopeParams(ctypes.Structure):
    _fields_ = [
        ("head_dim", c_int32),
        ("rot_dim", c_int32),
        ("layout", c_int),
        ("theta", c_double),
        ("scaling", c_int),
        ("factor", c_double),
        ("low_freq_factor", c_double),
        ("high_freq_factor", c_double),
        ("original_context", c_int32),
    ]


class Rope(ctypes.Structure):
    _fields_ = [("params", RopeParams), ("inv_freq", c_double * (KV_MAX_HEAD_DIM // 2))]


class CacheParams(ctypes.Structure):
    _fields_ = [
        ("n_layers", c_int32),
        ("n_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("dtype", c_int),
        ("page_size", c_int32),
        ("n_pages", c_int32),
        ("max_seqs", c_int32),
        ("max_seq_len", c_int32),
        ("window", c_int32),
        ("no_evict", c_int32),
    ]


class CacheStats(ctypes.Structure):
    _fields_ = [
        ("pages_total", c_int32),
        ("pages_used", c_int32),
        ("pages_free", c_int32),
        ("pages_cached", c_int32),
        ("pages_shared", c_int32),
        ("pages_named", c_int32),
        ("seqs", c_int32),
        ("bytes_per_token", c_uint64),
        ("bytes_per_page", c_uint64),
        ("bytes_in_use", c_uint64),
        ("bytes_total", c_uint64),
    ]


class Batch(ctypes.Structure):
    _fields_ = [("n_seqs", c_int32), ("seqs", P_int32), ("row_start", P_int32)]


class ReserveCost(ctypes.Structure):
    _fields_ = [(name, c_int32) for name in (
        "fits", "pages_taken", "pages_reclaimed", "pages_adopted", "pages_given_back",
        "used_delta", "shared_delta", "free_delta", "cached_delta")]


class Layer(ctypes.Structure):
    _fields_ = [
        ("layer", c_int32),
        ("dim", c_int32),
        ("n_heads", c_int32),
        ("wq", c_void_p),
        ("wk", c_void_p),
        ("wv", c_void_p),
        ("rope", ctypes.POINTER(Rope)),
        ("scale", c_double),
    ]


STRUCTS = {"kv_rope_params": RopeParams, "kv_rope": Rope, "kv_cache_params": CacheParams,
           "kv_cache_stats": CacheStats, "kv_batch": Batch, "kv_layer": Layer,
           "kv_reserve_cost": ReserveCost}

# ------------------------------------------------------------------ functions

P_cache = c_void_p
P_pool = c_void_p
P_batch = ctypes.POINTER(Batch)
P_rope = ctypes.POINTER(Rope)
TASK_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int32, c_int32)  # kv_task_fn

# name: (restype, argtypes), in the header's order
PROTOTYPES = {
    "kv_status_str": (c_char_p, [c_int]),
    "kv_dtype_size": (c_size_t, [c_int]),
    "kv_dtype_bits": (c_int32, [c_int]),
    "kv_dtype_name": (c_char_p, [c_int]),
    "kv_dtype_parse": (c_int, [c_char_p, ctypes.POINTER(c_int)]),
    "kv_price_per_token": (c_uint64, [c_int32, c_int32, c_int32, c_int]),
    "kv_price_tokens": (c_uint64, [c_int32, c_int32, c_int32, c_int, c_uint64]),
    "kv_rope_default_params": (RopeParams, [c_int32]),
    "kv_rope_init": (c_int, [P_rope, ctypes.POINTER(RopeParams)]),
    "kv_rope_apply_f64": (c_int, [P_rope, P_double, c_int32, c_int32, P_int32]),
    "kv_rope_apply_f32": (c_int, [P_rope, P_float, c_int32, c_int32, P_int32]),
    "kv_attention_f64": (c_int, [c_int32, c_int32, c_int32, c_int32, c_int32, P_double, P_double,
                                 P_double, P_double, c_int32, c_double]),
    "kv_attention_f32": (c_int, [c_int32, c_int32, c_int32, c_int32, c_int32, P_float, P_float,
                                 P_float, P_float, c_int32, c_float]),
    "kv_pool_create": (c_int, [c_int32, ctypes.POINTER(c_void_p)]),
    "kv_pool_free": (None, [P_pool]),
    "kv_pool_threads": (c_int32, [P_pool]),
    "kv_pool_run": (c_int, [P_pool, c_int32, TASK_FN, c_void_p]),
    "kv_simd_name": (c_char_p, []),
    "kv_simd_select": (c_int, [c_char_p]),
    "kv_cache_default_params": (CacheParams, []),
    "kv_cache_create": (c_int, [ctypes.POINTER(CacheParams), ctypes.POINTER(c_void_p)]),
    "kv_cache_free": (None, [P_cache]),
    "kv_cache_get_params": (CacheParams, [P_cache]),
    "kv_cache_set_pool": (None, [P_cache, P_pool]),
    "kv_cache_get_stats": (CacheStats, [P_cache]),
    "kv_seq_new": (c_int, [P_cache, P_int32]),
    "kv_seq_remove": (c_int, [P_cache, c_int32]),
    "kv_seq_length": (c_int32, [P_cache, c_int32]),
    "kv_seq_reserve": (c_int, [P_cache, c_int32, c_int32, P_int32]),
    "kv_seq_fork": (c_int, [P_cache, c_int32, P_int32]),
    "kv_seq_truncate": (c_int, [P_cache, c_int32, c_int32]),
    "kv_seq_rerotate": (c_int, [P_cache, c_int32, c_int32, c_int32, c_int32, P_rope]),
    "kv_seq_shift": (c_int, [P_cache, c_int32, c_int32, c_int32, P_rope]),
    "kv_seq_prefix_match": (c_int, [P_cache, c_int32, P_int32, c_int32, P_int32]),
    "kv_prefix_lookup": (c_int, [P_cache, P_int32, c_int32, P_int32]),
    "kv_prefix_clear": (c_int, [P_cache]),
    "kv_cache_set_prefix_listener": (None, [P_cache, c_void_p, c_void_p]),   # a C function pointer: for C callers
    "kv_cache_set_spill": (None, [P_cache, c_void_p, c_void_p]),   # a C function pointer: for C callers
    "kv_prefix_spill_all": (c_int, [P_cache]),
    "kv_seq_prefix_next": (c_int, [P_cache, c_int32, P_int32, ctypes.POINTER(c_uint64), ctypes.POINTER(c_uint64),
                                   ctypes.POINTER(c_int)]),
    "kv_prefix_hashes": (c_int, [P_cache, P_int32, c_int32, ctypes.POINTER(c_uint64)]),
    "kv_seq_prefix_skip": (c_int, [P_cache, c_int32, P_int32, c_int32]),
    "kv_seq_prefix_load": (c_int, [P_cache, c_int32, P_int32, c_void_p, ctypes.c_size_t]),
    "kv_seq_save": (c_int, [P_cache, c_int32, c_char_p]),
    "kv_seq_restore": (c_int, [P_cache, c_char_p, P_int32]),
    "kv_seq_save_file": (c_int, [P_cache, c_int32, c_void_p]),     # FILE *: for C callers
    "kv_seq_restore_file": (c_int, [P_cache, c_void_p, P_int32]),
    "kv_batch_reserve": (c_int, [P_cache, P_batch, P_int32]),
    "kv_batch_reserve_cost": (c_int, [P_cache, P_batch, ctypes.POINTER(ReserveCost)]),
    "kv_seq_reserve_cost": (c_int, [P_cache, c_int32, c_int32, ctypes.POINTER(ReserveCost)]),
    "kv_append_f64": (c_int, [P_cache, c_int32, P_batch, P_double, P_double]),
    "kv_append_f32": (c_int, [P_cache, c_int32, P_batch, P_float, P_float]),
    "kv_read_f64": (c_int, [P_cache, c_int32, c_int32, c_int32, c_int32, P_double, P_double]),
    "kv_read_f32": (c_int, [P_cache, c_int32, c_int32, c_int32, c_int32, P_float, P_float]),
    "kv_attend_f64": (c_int, [P_cache, c_int32, P_batch, c_int32, P_double, P_double, c_double]),
    "kv_attend_f32": (c_int, [P_cache, c_int32, P_batch, c_int32, P_float, P_float, c_float]),
    "kv_step_scratch": (c_size_t, [P_cache, ctypes.POINTER(Layer), c_int32]),
    "kv_step_f64": (c_int, [P_cache, ctypes.POINTER(Layer), P_batch, P_double, P_double, P_double]),
    "kv_step_f32": (c_int, [P_cache, ctypes.POINTER(Layer), P_batch, P_float, P_float, P_float]),
}

missing = []
for _name, (_res, _args) in PROTOTYPES.items():
    _fn = getattr(lib, _name, None)
    if _fn is None:  # a library older than this binding: the call raises when used
        missing.append(_name)
        continue
    _fn.restype = _res
    _fn.argtypes = _args


def fn(name):
    """The C function `name`, or NotImplementedError when this library lacks it."""
    f = getattr(lib, name, None) if name not in missing else None
    if f is None:
        raise NotImplementedError(f"kvcache: {name} is not in {lib_path}; rebuild it (make lib)")
    return f
