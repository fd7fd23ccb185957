"""Status codes of libkvcache and the exception that carries them."""
import enum

from . import _ffi


class Status(enum.IntEnum):
    """kv_status of include/kvcache.h."""
    OK = 0
    ERR_NULL = -1
    ERR_SHAPE = -2
    ERR_HEADS = -3
    ERR_LENGTH = -4
    ERR_CAPACITY = -5
    ERR_OUT_OF_PAGES = -6
    ERR_WINDOW = -7
    ERR_DTYPE = -8
    ERR_NOMEM = -9
    ERR_SEQ = -10
    ERR_ROPE = -11
    ERR_IO = -12
    ERR_FORMAT = -13
    ERR_SHARED = -14
    ERR_MISMATCH = -15
    ERR_UNSUPPORTED = -16
    ERR_DUPLICATE = -17


def status_str(status):
    """kv_status_str: the library's description of a status code."""
    return _ffi.fn("kv_status_str")(int(status)).decode()


class KVCacheError(RuntimeError):
    """A libkvcache call failed. `status` is the kv_status code (an int, a
    Status member when known), `message` the library's kv_status_str text and
    `call` the C function that returned it. The cache is as it was before."""

    def __init__(self, status, call=""):
        self.status = Status(status) if status in Status._value2member_map_ else int(status)
        self.message = status_str(status)
        self.call = call
        name = self.status.name if isinstance(self.status, Status) else str(int(status))
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{self.message} (KV_{name}, {int(status)})")


def check(status, call=""):
    """Raises KVCacheError for a negative status; returns it otherwise."""
    if status < 0:
        raise KVCacheError(status, call)
    return status
