"""The binding against include/kvcache.h itself: every struct ctypes mirrors
has the C compiler's size and field offsets, every status code matches, and
every function the header declares is bound with its number of arguments.
A header change that the binding misses fails here, not as corrupt memory."""
import os
import re
import shutil
import subprocess

import pytest

from kvcache import Status, _ffi
from conftest import ROOT

HEADER = os.path.join(ROOT, "include", "kvcache.h")
pytestmark = pytest.mark.skipif(not os.path.exists(HEADER), reason="no source tree (include/kvcache.h)")


def declared_functions(header=HEADER, prefix="kv_"):
    """{name: n_args} of every function a header declares (kvcache.h's kv_ ones by default)."""
    text = re.sub(r"/\*.*?\*/", "", open(header).read(), flags=re.S)
    out = {}
    for m in re.finditer(rf"^[A-Za-z_][\w \*]*?\b({prefix}\w+)\s*\(([^)]*)\)\s*;", text, flags=re.M):
        args = " ".join(m.group(2).split())
        out[m.group(1)] = 0 if args in ("", "void") else args.count(",") + 1
    return out


def test_every_declared_function_is_bound_with_its_arity():
    decl = declared_functions()
    assert len(decl) > 30
    unbound = sorted(set(decl) - set(_ffi.PROTOTYPES))
    assert not unbound, f"functions in kvcache.h the binding does not declare: {unbound}"
    stale = sorted(set(_ffi.PROTOTYPES) - set(decl))
    assert not stale, f"binding declares functions kvcache.h no longer has: {stale}"
    for name, n in decl.items():
        assert len(_ffi.PROTOTYPES[name][1]) == n, f"{name}: {n} arguments in C"
    assert not _ffi.missing, f"declared in kvcache.h but not in {_ffi.lib_path}: {_ffi.missing}"


def test_status_codes_match_the_header():
    text = open(HEADER).read()
    codes = {m.group(1): int(m.group(2)) for m in re.finditer(r"\bKV_(OK|ERR_\w+)\s*=\s*(-?\d+)", text)}
    assert codes == {s.name: s.value for s in Status}


def check_layouts(structs, header, tmp_path):
    """Every ctypes struct of `structs` has the C compiler's size and field offsets under header."""
    lines = []
    for cname, st in structs.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for field, _ in st._fields_:
            lines.append(f'printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));')
    src = tmp_path / "abi.c"
    src.write_text(f"#include <stdio.h>\n#include <stddef.h>\n#include \"{os.path.basename(header)}\"\n"
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "abi"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-I", os.path.dirname(header), str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                       text=True).stdout.splitlines())
    import ctypes
    for cname, st in structs.items():
        assert int(got[cname]) == ctypes.sizeof(st), f"sizeof({cname})"
        for field, _ in st._fields_:
            assert int(got[f"{cname}.{field}"]) == getattr(st, field).offset, f"{cname}.{field}"


@pytest.mark.skipif(not shutil.which(os.environ.get("CC", "cc")), reason="no C compiler")
def test_struct_layouts_match_the_c_compiler(tmp_path):
    check_layouts(_ffi.STRUCTS, HEADER, tmp_path)


def test_by_value_structs_and_dtype_names_agree_with_the_library():
    import kvcache
    p = _ffi.fn("kv_cache_default_params")()
    assert (p.n_layers, p.n_kv_heads, p.head_dim, p.dtype, p.page_size, p.n_pages, p.max_seqs,
            p.max_seq_len, p.window) == (1, 1, 64, kvcache.DTYPES["f32"], 16, 256, 1, 0, 0)
    r = _ffi.fn("kv_rope_default_params")(96)
    assert (r.head_dim, r.rot_dim, r.layout, r.theta, r.scaling) == (96, 96, 0, 10000.0, 0)
    for name, code in kvcache.DTYPES.items():
        out = _ffi.c_int()
        assert _ffi.fn("kv_dtype_parse")(name.encode(), out) == 0 and out.value == code
        assert _ffi.fn("kv_dtype_name")(code).decode() == name


@pytest.mark.skipif(not shutil.which("nm"), reason="no nm (binutils)")
def test_the_shared_library_exports_exactly_the_header_functions():
    """libkvcache.so is built with -fvisibility=hidden and KV_API on each
    declaration: its dynamic symbol table is the header, nothing more."""
    out = subprocess.run(["nm", "-D", "--defined-only", _ffi.lib_path], check=True, capture_output=True,
                         text=True).stdout
    rows = [line.split() for line in out.splitlines()]
    exported = {f[2].split("@")[0] for f in rows if len(f) == 3} - {"_init", "_fini"}
    declared = set(declared_functions())
    assert sorted(exported - declared) == [], "exported but not in kvcache.h"
    assert sorted(declared - exported) == [], "in kvcache.h but not exported"


# ------------------------------------------------------------------ kvengine.h and libkvengine.so

ENGINE_HEADER = os.path.join(ROOT, "include", "kvengine.h")


def engine_declared():
    """{name: n_args} of every function kvengine.h declares."""
    return declared_functions(ENGINE_HEADER, "kve_")


def _engine_lib():
    from kvcache import _engine
    try:
        _engine.lib()
    except ImportError as e:
        pytest.skip(str(e))
    return _engine


def test_every_engine_function_is_bound_with_its_arity():
    _engine = _engine_lib()
    decl = engine_declared()
    assert len(decl) > 15
    assert sorted(decl) == sorted(_engine.PROTOTYPES), "kvengine.h and kvcache/_engine.py declare different functions"
    for name, n in decl.items():
        assert len(_engine.PROTOTYPES[name][1]) == n, f"{name}: {n} arguments in C"


def test_engine_status_codes_are_the_engines():
    """kvengine.h's codes are engine/status.h's (the engine returns them as they are)."""
    text = open(ENGINE_HEADER).read()
    kve = {m.group(1): m.group(2) for m in re.finditer(r"\bKVE_(ERR_\w+)\s*=\s*(-?\d+|KV_ERR_\w+)", text)}
    status = open(os.path.join(ROOT, "engine", "status.h")).read()
    llm = {m.group(1): m.group(2) for m in re.finditer(r"\bLLM_(ERR_\w+)\s*=\s*(-?\d+|KV_ERR_\w+)", status)}
    shared = set(kve) & set(llm)
    assert len(shared) >= 9
    assert {k: kve[k] for k in shared} == {k: llm[k] for k in shared}
    assert not set(kve.values()) & {llm[k] for k in set(llm) - shared}, "a kvengine code reuses another engine code"


@pytest.mark.skipif(not shutil.which(os.environ.get("CC", "cc")), reason="no C compiler")
def test_engine_struct_layouts_match_the_c_compiler(tmp_path):
    check_layouts(_engine_lib().STRUCTS, ENGINE_HEADER, tmp_path)


@pytest.mark.skipif(not shutil.which("nm"), reason="no nm (binutils)")
def test_the_engine_library_exports_exactly_the_two_headers():
    """libkvengine.so is the engine and the library, both built with
    -fvisibility=hidden: its dynamic symbols are kvengine.h's KVE_API and
    kvcache.h's KV_API functions, nothing more."""
    _engine = _engine_lib()
    out = subprocess.run(["nm", "-D", "--defined-only", _engine.lib_path], check=True, capture_output=True,
                         text=True).stdout
    rows = [line.split() for line in out.splitlines()]
    exported = {f[2].split("@")[0] for f in rows if len(f) == 3} - {"_init", "_fini"}
    declared = set(declared_functions()) | set(engine_declared())
    assert sorted(exported - declared) == [], "exported but in neither header"
    assert sorted(declared - exported) == [], "in a header but not exported"


def test_the_server_and_the_cli_include_only_the_public_headers():
    """server/ and all of cli/ run on kvengine.h and kvcache.h: besides system
    headers each file includes those two and its own folder's headers (cli/
    also the server's server.h), never an engine/ or src/ header."""
    own = {"server": {"internal.h", "request.h", "server.h"},
           "cli": {"cli.h", "verify.h", "../server/server.h"}}
    wrong, n_files = [], 0
    for folder, headers in own.items():
        allowed = {"kvengine.h", "kvcache.h"} | headers
        d = os.path.join(ROOT, folder)
        for f in sorted(os.listdir(d)):
            if not f.endswith((".c", ".h")):
                continue
            n_files += 1
            for n, line in enumerate(open(os.path.join(d, f)), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if m and m.group(1) not in allowed:
                    wrong.append(f"{folder}/{f}:{n}: {m.group(1)}")
    assert n_files > 25
    assert not os.path.exists(os.path.join(ROOT, "cli", "internal.h")), "cli/internal.h (engine insides) is back"
    assert not wrong, "engine-internal headers included: " + ", ".join(wrong)
