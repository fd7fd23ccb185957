"""Loading libkvengine and declaring include/kvengine.h for ctypes.

The structs mirror the header field by field (tests/test_abi.py compiles the
header and compares every offset). Nothing here is public; kvcache.Model
wraps it.

Where the library is found, first hit wins:
    1. $KVCACHE_ENGINE_LIB, a path to libkvengine.so (an error if it cannot be loaded)
    2. libkvengine.so next to this package (`pip install ./python` puts it there)
    3. build/libkvengine.so of the source tree this package sits in (python/../build)
    4. the system loader's search path (`make install` into a prefix it knows)

The library is loaded on first use, so `import kvcache` works without it."""
import ctypes
import ctypes.util
import os
import threading

from ._ffi import CacheStats, RopeParams, P_float, P_int32, c_char_p, c_float, c_int, c_int32, c_size_t, c_uint64, c_void_p

LIB_NAME = "libkvengine.so"


class ContextParams(ctypes.Structure):
    _fields_ = [("n_ctx", c_int32), ("n_seqs", c_int32), ("n_threads", c_int32), ("n_batch", c_int32),
                ("kv_type", c_int), ("n_pages", c_int32), ("max_waiting", c_int32)]


class ChatMessage(ctypes.Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class Event(ctypes.Structure):
    _fields_ = [("token", c_int32), ("text", c_void_p), ("text_len", c_size_t), ("logprob", c_float),
                ("stop", c_int), ("choice", c_int32), ("n_top", c_int32), ("top_ids", P_int32),
                ("top_logprobs", P_float), ("n_prompt", c_int32), ("n_cached", c_int32), ("n_generated", c_int32),
                ("status", c_int), ("error", c_char_p)]


class ContextOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("act_bits", c_int32), ("no_window", c_int32), ("context_shift", c_int32),
                ("n_keep", c_int32), ("draft_lookup", c_int32), ("no_prefix", c_int32), ("cache_dir", c_char_p),
                ("cache_disk_size", c_uint64), ("on_prefix", c_void_p), ("prefix_user", c_void_p),
                ("log", c_void_p), ("log_user", c_void_p)]


class ContextStats(ctypes.Structure):
    _fields_ = ([("size", c_size_t)] +
                [(n, c_int32) for n in ("running", "waiting", "pages_total", "pages_used", "pages_free",
                                        "pages_cached", "page_size")] +
                [(n, c_uint64) for n in ("prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens",
                                         "preemptions", "prefill_waits", "disk_waits", "steps", "rows", "shifts",
                                         "drafted", "accepted", "session_restores", "session_restored",
                                         "session_refused", "session_saves", "session_save_failures")] +
                [("session_seconds", ctypes.c_double), ("disk_on", c_int32)] +
                [(n, c_uint64) for n in ("disk_hits", "disk_misses", "disk_damaged", "disk_bytes_read",
                                         "disk_writes", "disk_bytes_written", "disk_dropped", "disk_evictions",
                                         "disk_entries", "disk_bytes")])


class LogitBias(ctypes.Structure):
    _fields_ = [("token", c_int32), ("bias", c_float)]


class RequestOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("n_choices", c_int32), ("repeat_last_n", c_int32),
                ("logit_bias", ctypes.POINTER(LogitBias)), ("n_logit_bias", c_int32), ("grammar", c_void_p),
                ("json_object", c_int32), ("callback_only", c_int32), ("session_file", c_char_p)]


EVENT_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.POINTER(Event))


class RequestParams(ctypes.Structure):
    _fields_ = [
        ("prompt", c_char_p), ("tokens", P_int32), ("n_tokens", c_int32),
        ("messages", ctypes.POINTER(ChatMessage)), ("n_messages", c_int32),
        ("max_tokens", c_int32), ("temperature", c_float), ("top_k", c_int32), ("top_p", c_float),
        ("min_p", c_float), ("repeat_penalty", c_float), ("presence_penalty", c_float),
        ("frequency_penalty", c_float), ("random_state", c_uint64),
        ("stops", ctypes.POINTER(c_char_p)), ("n_stops", c_int32), ("top_logprobs", c_int32),
        ("on_event", c_void_p), ("user", c_void_p), ("enable_thinking", c_int32),
    ]


class Output(ctypes.Structure):
    _fields_ = [
        ("text", c_void_p), ("text_len", c_size_t), ("tokens", P_int32), ("n_tokens", c_int32),
        ("logprobs", P_float), ("top_ids", P_int32), ("top_logprobs", P_float), ("n_top", c_int32),
        ("stop", c_int), ("status", c_int), ("error", c_char_p),
        ("n_prompt", c_int32), ("n_cached", c_int32), ("n_generated", c_int32),
    ]


class ModelShape(ctypes.Structure):
    _fields_ = [("n_layers", c_int32), ("dim", c_int32), ("n_heads", c_int32), ("n_kv_heads", c_int32),
                ("head_dim", c_int32), ("ffn_dim", c_int32), ("n_groups", c_int32), ("weight_bytes", c_uint64),
                ("packed_bytes", c_uint64), ("streamed_bytes", c_uint64)]


class GGUFInfo(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("alignment", ctypes.c_uint32), ("data_offset", c_uint64),
                ("file_size", c_uint64), ("n_kv", ctypes.c_int64), ("n_tensors", ctypes.c_int64)]


class GGUFKV(ctypes.Structure):
    _fields_ = [("key", c_char_p), ("key_len", c_size_t), ("type", c_int), ("elem_type", c_int), ("n", c_uint64)]


class GGUFValue(ctypes.Structure):
    _fields_ = [("type", c_int), ("i", ctypes.c_int64), ("u", c_uint64), ("f", ctypes.c_double), ("str", c_void_p),
                ("len", c_size_t)]


class GGUFTensor(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("type", c_int32), ("type_name", c_char_p), ("n_dims", c_int32),
                ("dims", ctypes.c_int64 * 4), ("offset", c_uint64), ("n_bytes", c_uint64)]


class HParams(ctypes.Structure):
    _fields_ = [("n_vocab", c_int32), ("dim", c_int32), ("n_layers", c_int32), ("n_heads", c_int32),
                ("n_kv_heads", c_int32), ("head_dim", c_int32), ("ffn_dim", c_int32), ("ctx_train", c_int32),
                ("norm_eps", c_float), ("rope", RopeParams)]


class SessionOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("window", c_int32)]


class SessionParams(ctypes.Structure):
    _fields_ = [("n_ctx", c_int32), ("n_threads", c_int32), ("n_batch", c_int32), ("kv_type", c_int),
                ("act_bits", c_int32), ("no_window", c_int32)]


TOKEN_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_int32)
TEXT_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)
PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_int64, ctypes.c_int64)


class GenerateParams(ctypes.Structure):
    _fields_ = [
        ("max_tokens", c_int32), ("temperature", c_float), ("top_k", c_int32), ("top_p", c_float),
        ("min_p", c_float), ("repeat_penalty", c_float), ("repeat_last_n", c_int32),
        ("presence_penalty", c_float), ("frequency_penalty", c_float), ("random_state", c_uint64),
        ("stops", ctypes.POINTER(c_char_p)), ("n_stops", c_int32), ("grammar", c_void_p),
        ("reserve", c_int32), ("context_shift", c_int32), ("n_keep", c_int32), ("draft_lookup", c_int32),
        ("on_token", c_void_p), ("on_text", c_void_p), ("user", c_void_p),
        ("on_progress", c_void_p), ("progress_user", c_void_p), ("ignore_eog", c_int32),
    ]


class GenerateResult(ctypes.Structure):
    _fields_ = [
        ("stop", c_int), ("status", c_int), ("n_prompt", c_int32), ("n_reused", c_int32),
        ("n_generated", c_int32), ("eog_token", c_int32), ("t_prefill", ctypes.c_double),
        ("t_decode", ctypes.c_double), ("n_shifts", c_int32), ("n_discarded", c_int32), ("n_passes", c_int32),
        ("n_drafted", c_int32), ("n_accepted", c_int32), ("message", ctypes.c_char * 192),
    ]


STRUCTS = {"kve_model_shape": ModelShape, "kve_context_params": ContextParams, "kve_chat_message": ChatMessage, "kve_event": Event,
           "kve_request_params": RequestParams, "kve_output": Output, "kve_session_params": SessionParams,
           "kve_generate_params": GenerateParams, "kve_generate_result": GenerateResult,
           "kve_context_options": ContextOptions, "kve_context_stats": ContextStats, "kve_logit_bias": LogitBias,
           "kve_request_options": RequestOptions, "kve_gguf_info": GGUFInfo, "kve_gguf_kv": GGUFKV,
           "kve_gguf_value": GGUFValue, "kve_gguf_tensor": GGUFTensor, "kve_hparams": HParams,
           "kve_session_options": SessionOptions}

PP = ctypes.POINTER(c_void_p)
# name: (restype, argtypes), in the header's order
PROTOTYPES = {
    "kve_status_str": (c_char_p, [c_int]),
    "kve_stop_reason_str": (c_char_p, [c_int]),
    "kve_model_load": (c_int, [c_char_p, PP, c_char_p, c_size_t]),
    "kve_model_free": (None, [c_void_p]),
    "kve_model_n_vocab": (c_int32, [c_void_p]),
    "kve_model_n_ctx_train": (c_int32, [c_void_p]),
    "kve_model_name": (c_char_p, [c_void_p]),
    "kve_model_has_chat_template": (c_int, [c_void_p]),
    "kve_model_bos": (c_int32, [c_void_p]),
    "kve_model_get_shape": (ModelShape, [c_void_p]),
    "kve_model_group": (c_int, [c_void_p, c_int32, P_int32, P_int32]),
    "kve_kernels": (c_char_p, []),
    "kve_tokenize": (c_int, [c_void_p, c_char_p, c_size_t, c_int, c_int, P_int32, c_int32, P_int32]),
    "kve_detokenize": (c_int, [c_void_p, P_int32, c_int32, c_int, c_char_p, c_size_t, ctypes.POINTER(c_size_t)]),
    "kve_chat_apply": (c_int, [c_void_p, ctypes.POINTER(ChatMessage), c_int32, c_int, c_char_p, c_size_t,
                               ctypes.POINTER(c_size_t)]),
    "kve_chat_apply_ex": (c_int, [c_void_p, ctypes.POINTER(ChatMessage), c_int32, c_int, c_int, c_char_p, c_size_t,
                                  ctypes.POINTER(c_size_t)]),
    "kve_chat_tokenize": (c_int, [c_void_p, ctypes.POINTER(ChatMessage), c_int32, c_int32, c_int, c_int, c_int,
                                  P_int32, c_int32, P_int32]),
    "kve_chat_turn_end": (c_char_p, [c_void_p]),
    "kve_model_tool_style": (c_int, [c_void_p]),
    "kve_chat_default_system": (c_char_p, [c_void_p]),
    "kve_token_piece": (c_void_p, [c_void_p, c_int32, ctypes.POINTER(c_size_t)]),
    "kve_gguf_open": (c_int, [c_char_p, PP, c_char_p, c_size_t]),
    "kve_gguf_open_memory": (c_int, [c_void_p, c_size_t, PP, c_char_p, c_size_t]),
    "kve_gguf_close": (None, [c_void_p]),
    "kve_gguf_get_info": (GGUFInfo, [c_void_p]),
    "kve_gguf_type_name": (c_char_p, [c_int]),
    "kve_gguf_kv_at": (c_int, [c_void_p, ctypes.c_int64, ctypes.POINTER(GGUFKV)]),
    "kve_gguf_find_key": (ctypes.c_int64, [c_void_p, c_char_p]),
    "kve_gguf_value_at": (c_int, [c_void_p, ctypes.c_int64, c_uint64, ctypes.POINTER(GGUFValue)]),
    "kve_gguf_tensor_at": (c_int, [c_void_p, ctypes.c_int64, ctypes.POINTER(GGUFTensor)]),
    "kve_gguf_find_tensor": (ctypes.c_int64, [c_void_p, c_char_p]),
    "kve_gguf_hparams": (c_int, [c_void_p, ctypes.POINTER(HParams), c_char_p, c_size_t]),
    "kve_grammar_parse": (c_int, [c_void_p, c_char_p, c_size_t, c_int, PP, c_char_p, c_size_t]),
    "kve_grammar_free": (None, [c_void_p]),
    "kve_grammar_check": (c_int, [c_char_p, c_size_t, c_int, c_char_p, c_size_t]),
    "kve_grammar_tool_calls": (c_int, [c_void_p, c_int32, ctypes.POINTER(c_char_p), ctypes.POINTER(c_char_p),
                                       c_char_p, c_char_p, c_char_p, PP, c_char_p, c_size_t]),
    "kve_context_default_params": (ContextParams, []),
    "kve_context_create": (c_int, [c_void_p, ctypes.POINTER(ContextParams), PP, c_char_p, c_size_t]),
    "kve_context_free": (None, [c_void_p]),
    "kve_context_get_params": (ContextParams, [c_void_p]),
    "kve_context_default_options": (ContextOptions, []),
    "kve_context_create_ex": (c_int, [c_void_p, ctypes.POINTER(ContextParams), ctypes.POINTER(ContextOptions), PP,
                                      c_char_p, c_size_t]),
    "kve_context_stop": (None, [c_void_p]),
    "kve_context_get_stats": (c_int, [c_void_p, ctypes.POINTER(ContextStats)]),
    "kve_session_dir_clean": (c_int, [c_char_p, c_char_p, c_size_t]),
    "kve_request_default_params": (RequestParams, []),
    "kve_submit": (c_int, [c_void_p, ctypes.POINTER(RequestParams), PP, c_char_p, c_size_t]),
    "kve_request_default_options": (RequestOptions, []),
    "kve_submit_ex": (c_int, [c_void_p, ctypes.POINTER(RequestParams), ctypes.POINTER(RequestOptions), PP, c_char_p,
                              c_size_t]),
    "kve_request_poll": (c_int, [c_void_p, c_int, ctypes.POINTER(Output)]),
    "kve_request_cancel": (None, [c_void_p]),
    "kve_request_free": (None, [c_void_p]),
    "kve_session_default_params": (SessionParams, []),
    "kve_session_create": (c_int, [c_void_p, ctypes.POINTER(SessionParams), PP, c_char_p, c_size_t]),
    "kve_session_free": (None, [c_void_p]),
    "kve_session_get_params": (SessionParams, [c_void_p]),
    "kve_session_default_options": (SessionOptions, []),
    "kve_session_create_ex": (c_int, [c_void_p, ctypes.POINTER(SessionParams), ctypes.POINTER(SessionOptions), PP,
                                      c_char_p, c_size_t]),
    "kve_generate_default_params": (GenerateParams, []),
    "kve_session_generate": (c_int, [c_void_p, P_int32, c_int32, ctypes.POINTER(GenerateParams),
                                     ctypes.POINTER(GenerateResult)]),
    "kve_session_feed": (c_int, [c_void_p, P_int32, c_int32]),
    "kve_session_eval": (c_int, [c_void_p, P_int32, c_int32, c_int32, ctypes.POINTER(c_float)]),
    "kve_session_eval_reference": (c_int, [c_void_p, P_int32, c_int32, c_int32, ctypes.POINTER(c_float)]),
    "kve_session_shift": (c_int, [c_void_p, c_int32, c_int32, P_int32]),
    "kve_session_truncate": (c_int, [c_void_p, c_int32]),
    "kve_session_reset": (None, [c_void_p]),
    "kve_session_clear_prefixes": (None, [c_void_p]),
    "kve_session_tokens": (P_int32, [c_void_p, P_int32]),
    "kve_session_n_cached": (c_int32, [c_void_p]),
    "kve_session_save": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "kve_session_load": (c_int, [c_void_p, c_char_p, P_int32, c_int32, P_int32, c_char_p, c_size_t]),
    "kve_session_cache_stats": (CacheStats, [c_void_p]),
    "kve_session_cache_group": (c_int, [c_void_p, c_int32, P_int32, P_int32, ctypes.POINTER(CacheStats)]),
    "kve_session_read_kv": (c_int, [c_void_p, c_int32, c_int32, c_int32, c_int32, P_float, P_float]),
}

STOP_NAMES = ["none", "eog", "string", "length", "context", "cancel", "error"]
KVE_ERR_TIMEOUT = -302
KVE_ERR_SPACE = -303

_lock = threading.Lock()
_lib = None
lib_path = None


def _candidates():
    env = os.environ.get("KVCACHE_ENGINE_LIB")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, LIB_NAME), os.path.join(os.path.dirname(os.path.dirname(here)), "build", LIB_NAME)], False


def lib():
    """libkvengine with every prototype declared; ImportError when it cannot be found."""
    global _lib, lib_path
    with _lock:
        if _lib is not None:
            return _lib
        paths, from_env = _candidates()
        found = None
        if from_env:
            found = paths[0]
        else:
            found = next((p for p in paths if os.path.exists(p)), None) or ctypes.util.find_library("kvengine")
        if not found:
            raise ImportError("kvcache: libkvengine.so not found. Build it with `make lib` in the source tree, set "
                              "KVCACHE_ENGINE_LIB=/path/to/libkvengine.so, or `pip install ./python`. Looked in: "
                              + ", ".join(paths) + " and the system library path")
        try:
            handle = ctypes.CDLL(found)
        except OSError as e:
            raise ImportError(f"kvcache: {found} could not be loaded: {e}") from e
        for name, (res, args) in PROTOTYPES.items():
            f = getattr(handle, name)
            f.restype, f.argtypes = res, args
        _lib, lib_path = handle, found
        return _lib
