"""kvengine.h's GGUF inspector (kve_gguf_*) against the PyPI `gguf`
package's reader, an independent implementation of the format: on the real
models, every metadata entry (key, type, every scalar and every array
element) and every tensor (name, type, dims, offset, size) must agree; on a
file of an architecture the engine does not know, written by gguf's own
writer, the inspector still reads everything and the engine names the
architecture it cannot run; a truncated file is refused with a message
naming the entry that does not fit. `kvcache info` on the same files prints
the entries and says why the engine cannot run them."""
import ctypes
import os
import subprocess

import numpy as np
import pytest

from conftest import ROOT

gguf = pytest.importorskip("gguf", reason="pip install gguf (python/requirements-test.txt)")

MODELS = [os.environ.get("KVCACHE_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")),
          os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf")]
BIN = os.environ.get("KVCACHE_BIN", os.path.join(ROOT, "build", "kvcache"))
VT = gguf.GGUFValueType
KVE_OK, KVE_ERR_IO, KVE_ERR_PARAM, KVE_ERR_MODEL = 0, -12, -101, -102


@pytest.fixture(scope="module")
def eng():
    from kvcache import _engine
    try:
        return _engine.lib()
    except ImportError as e:
        pytest.skip(str(e))


def status_value(name):
    import re
    text = open(os.path.join(ROOT, "include", "kvcache.h")).read()
    return int(re.search(rf"\b{name}\s*=\s*(-?\d+)", text).group(1))


def sample(n):
    """The element indices compared: all of a short array; of a long one (a
    vocabulary) about 600 spread over it, its first and last among them."""
    return range(n) if n <= 600 else sorted(set(range(0, n, n // 600)) | {n - 1})


def open_gguf(eng, path):
    g, err = ctypes.c_void_p(), ctypes.create_string_buffer(512)
    rc = eng.kve_gguf_open(path.encode(), ctypes.byref(g), err, len(err))
    return rc, g, err.value.decode()


def value(eng, g, i, e):
    from kvcache import _engine
    v = _engine.GGUFValue()
    assert eng.kve_gguf_value_at(g, i, e, ctypes.byref(v)) == KVE_OK
    if v.type == VT.STRING:
        return ctypes.string_at(v.str, v.len) if v.len else b""
    if v.type in (VT.FLOAT32, VT.FLOAT64):
        return v.f
    if v.type == VT.BOOL:
        return bool(v.i)
    assert v.f == float(v.u if v.i == 0 and v.u else v.i)   # the double agrees with the integer
    return v.u if v.type in (VT.UINT8, VT.UINT16, VT.UINT32, VT.UINT64) else v.i


def inspect(eng, g):
    """(info, [(key, type, elem_type, n, [sampled values])], [(name, type_name, dims, offset, n_bytes)]) of an open file."""
    from kvcache import _engine
    info = eng.kve_gguf_get_info(g)
    entries, tensors = [], []
    kv = _engine.GGUFKV()
    i = 0
    while eng.kve_gguf_kv_at(g, i, ctypes.byref(kv)) == KVE_OK:
        entries.append((ctypes.string_at(kv.key, kv.key_len), kv.type, kv.elem_type,
                        kv.n, [value(eng, g, i, e) for e in sample(kv.n)]))
        assert eng.kve_gguf_find_key(g, kv.key) == i
        i += 1
    assert i == info.n_kv
    t = _engine.GGUFTensor()
    i = 0
    while eng.kve_gguf_tensor_at(g, i, ctypes.byref(t)) == KVE_OK:
        tensors.append((t.name, t.type_name.decode(), list(t.dims[:t.n_dims]), info.data_offset + t.offset, t.n_bytes))
        assert eng.kve_gguf_find_tensor(g, t.name) == i
        i += 1
    assert i == info.n_tensors
    return info, entries, tensors


def reference(path):
    """The same as gguf's GGUFReader reads it."""
    r = gguf.GGUFReader(path)
    entries = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):   # the reader's header pseudo-fields
            continue
        t = f.types[0]
        elem = f.types[1] if t == VT.ARRAY else t
        parts = [f.parts[f.data[k]] for k in sample(len(f.data))]
        if elem == VT.STRING:
            vals = [bytes(p) for p in parts]
        elif elem in (VT.FLOAT32, VT.FLOAT64):
            vals = [float(p[0]) for p in parts]
        elif elem == VT.BOOL:
            vals = [bool(p[0]) for p in parts]
        else:
            vals = [int(p[0]) for p in parts]
        entries.append((name.encode(), int(t), int(elem), len(f.data), vals))
    tensors = [(t.name.encode(), t.tensor_type.name, [int(d) for d in t.shape], int(t.data_offset), int(t.n_bytes))
               for t in r.tensors]
    return r, entries, tensors


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_the_inspector_reads_what_gguf_py_reads(eng, path):
    if not os.path.exists(path):
        pytest.skip(f"{path} missing (make test-models)")
    rc, g, err = open_gguf(eng, path)
    assert rc == KVE_OK, err
    try:
        info, entries, tensors = inspect(eng, g)
    finally:
        eng.kve_gguf_close(g)
    r, want_entries, want_tensors = reference(path)
    assert (info.alignment, info.data_offset, info.file_size) == (r.alignment, r.data_offset, os.path.getsize(path))
    assert len(entries) == len(want_entries) > 20
    for got, want in zip(entries, want_entries):
        assert got == want, got[0]
    assert len(tensors) == len(want_tensors) > 100
    for got, want in zip(tensors, want_tensors):
        assert got == want, got[0]


def write_unknown_arch(path):
    w = gguf.GGUFWriter(path, "mamba9")
    w.add_block_count(2)
    w.add_uint64("mamba9.big", 2**64 - 1)
    w.add_int8("mamba9.neg", -128)
    w.add_float64("mamba9.f64", -1 / 3)
    w.add_bool("mamba9.flag", True)
    w.add_array("mamba9.layers", [1, -2, 3])
    w.add_array("mamba9.names", ["a", "", "h\u00e9"])
    w.add_string("mamba9.text", 'q"uote\nline')
    w.add_tensor("t0", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("t1", np.ones((3, 8), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_file_of_an_unknown_architecture_is_read_and_named(eng, tmp_path):
    from kvcache import _engine
    path = str(tmp_path / "mamba9.gguf")
    write_unknown_arch(path)
    rc, g, err = open_gguf(eng, path)
    assert rc == KVE_OK, err
    try:
        info, entries, tensors = inspect(eng, g)
        hp, err2 = _engine.HParams(), ctypes.create_string_buffer(256)
        assert eng.kve_gguf_hparams(g, ctypes.byref(hp), err2, len(err2)) == KVE_ERR_MODEL
        assert b"mamba9" in err2.value
        v = _engine.GGUFValue()
        assert eng.kve_gguf_value_at(g, info.n_kv, 0, ctypes.byref(v)) == KVE_ERR_PARAM
        assert eng.kve_gguf_value_at(g, 0, 1, ctypes.byref(v)) == KVE_ERR_PARAM
    finally:
        eng.kve_gguf_close(g)
    _, want_entries, want_tensors = reference(path)
    assert entries == want_entries
    assert tensors == want_tensors
    got = {k: vals for k, _, _, _, vals in entries}
    assert got[b"mamba9.big"] == [2**64 - 1] and got[b"mamba9.neg"] == [-128]
    assert got[b"mamba9.names"] == [b"a", b"", "h\u00e9".encode()]
    m, err3 = ctypes.c_void_p(), ctypes.create_string_buffer(256)
    assert eng.kve_model_load(path.encode(), ctypes.byref(m), err3, len(err3)) == KVE_ERR_MODEL
    if os.path.exists(BIN):
        p = subprocess.run([BIN, "info", "-m", path, "--tensors"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert 'mamba9.text                                  string "q\\"uote\\nline"' in p.stdout
        assert "mamba9.layers                                i32[3] [1, -2, 3]" in p.stdout
        assert "t1                                           F16   [8, 3] 48 bytes at" in p.stdout
        assert "engine: cannot run this model:" in p.stdout and "mamba9" in p.stdout


def test_a_truncated_or_missing_file_is_refused_with_what_was_wrong(eng, tmp_path):
    src = MODELS[0]
    if not os.path.exists(src):
        pytest.skip(f"{src} missing (make test-models)")
    path = str(tmp_path / "cut.gguf")
    with open(src, "rb") as f, open(path, "wb") as out:
        out.write(f.read(100000))   # inside the vocabulary's strings
    rc, g, err = open_gguf(eng, path)
    assert rc == KVE_ERR_MODEL and not g
    assert path in err and "tokenizer.ggml.tokens" in err and "bytes" in err, err
    with pytest.raises(Exception):
        gguf.GGUFReader(path)   # the independent reader agrees the file is broken
    rc, g, err = open_gguf(eng, str(tmp_path / "missing.gguf"))
    assert rc == status_value("KV_ERR_IO") == KVE_ERR_IO and "cannot open" in err, err
    data = open(src, "rb").read(4096)
    g = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(b"GGUF\x07\x00\x00\x00" + data[8:])
    err = ctypes.create_string_buffer(256)
    assert eng.kve_gguf_open_memory(buf, len(data), ctypes.byref(g), err, len(err)) == KVE_ERR_MODEL
    assert b"version 7" in err.value
    if os.path.exists(BIN):
        p = subprocess.run([BIN, "info", "-m", path], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "tokenizer.ggml.tokens" in p.stderr


def test_every_tensor_type_the_format_defines_is_listed_with_its_size(eng, tmp_path):
    """Tensors of the types the engine does not run (IQ*, Q8_K, I8..I64, TQ*,
    MXFP4) are listed too, their sizes those gguf gives (GGML_QUANT_SIZES);
    only a type newer than the engine's table is refused, by number."""
    from kvcache import _engine
    read, refused = [], []
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        path = str(tmp_path / f"{qt.name}.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_tensor("t", np.zeros((3, 2 * size), dtype=np.uint8), raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        rc, g, err = open_gguf(eng, path)
        if rc != KVE_OK:
            assert rc == KVE_ERR_MODEL and f"unknown type {int(qt)}" in err, (qt.name, err)
            refused.append(int(qt))
            continue
        t = _engine.GGUFTensor()
        assert eng.kve_gguf_tensor_at(g, 0, ctypes.byref(t)) == KVE_OK
        eng.kve_gguf_close(g)
        (want,) = gguf.GGUFReader(path).tensors
        assert (t.type_name.decode(), t.type, list(t.dims[:t.n_dims]), t.n_bytes) == \
            (qt.name, int(qt), [2 * block, 3], int(want.n_bytes)), qt.name
        read.append(qt.name)
    assert all(q > 39 for q in refused), refused
    assert {"IQ2_XXS", "Q8_K", "I32", "MXFP4", "TQ1_0", "Q4_K"} <= set(read)
    if os.path.exists(BIN):
        p = subprocess.run([BIN, "info", "-m", str(tmp_path / "IQ2_XXS.gguf"), "--tensors"], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "IQ2_XXS [512, 3] 396 bytes at 0" in p.stdout
        assert "engine: cannot run this model:" in p.stdout
