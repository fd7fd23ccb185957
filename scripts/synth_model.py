#!/usr/bin/env python3
"""Writes a GGUF model of random weights at a given architecture and shape,
with a real tokenizer: to measure fidelity (kvcache's perplexity beside
llama.cpp's on the same file) and speed at the shapes of models that cannot
be fetched here.

    python3 -m venv /tmp/synthvenv
    /tmp/synthvenv/bin/pip install numpy gguf        # or llama.cpp's gguf-py
    /tmp/synthvenv/bin/python scripts/synth_model.py --preset llama-3.2-1b \\
        --type Q4_K_M -o /tmp/llama1b.gguf
    build/kvcache info -m /tmp/llama1b.gguf

Weights are N(0, --std) (default 1/sqrt(inputs), 0.022 at D = 2048, so
every layer's output is about as large as its input), token_embd and output.weight
N(0, --logit-std / sqrt(D)) so that the logits spread (sigma about 3): the
perplexity then depends on what every layer computes, where at 0.02 it would
sit near the vocabulary's size whatever the layers did. Norm weights 1 + N(0, 0.05), biases
N(0, 0.1), quantized per tensor: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and F16 through
gguf.quants.quantize; the K types (which gguf-py only dequantizes) by the
quantizers below, plain min/max fits per sub-block (check: --verify
dequantizes every tensor with gguf.quants.dequantize and reports the error).
A matrix whose rows do not divide into the type's blocks falls back as
llama.cpp's quantizer does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
Q2_K/Q3_K -> Q4_0 where llama.cpp would use IQ4_NL).

The tokenizer is copied from a model in models/: SmolLM2's byte-level BPE
(49152 tokens) for llama, qwen2, qwen3 and phi3, Gemma 3's SentencePiece
(262144 tokens) for gemma3. The family's turn markers are added where the
vocabulary lacks them, and the vocabulary is padded with unused control
tokens to the preset's size, so the embedding and output matrices have the
real model's shape (Phi-3's 32064 is smaller than SmolLM2's vocabulary: its
file keeps 49156 tokens). --pre sets tokenizer.ggml.pre (default: the
family's own, llama-bpe, qwen2, or the source's).
"""
import argparse
import math
import os
import sys

import numpy as np

try:
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT
except ImportError:  # llama.cpp's gguf-py beside a source tree
    here = os.environ.get("GGUF_PY", "/tmp/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py")
    sys.path.insert(0, here)
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BPE_SOURCE = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
SPM_SOURCE = os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf")

# The published configurations (config.json of each model).
PRESETS = {
    "llama-3.2-1b": dict(arch="llama", layers=16, embd=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                         vocab=128256, ctx=131072, theta=500000.0, eps=1e-5, tied=True, llama3_scaling=True),
    "llama-3.2-3b": dict(arch="llama", layers=28, embd=3072, heads=24, kv_heads=8, head_dim=128, ffn=8192,
                         vocab=128256, ctx=131072, theta=500000.0, eps=1e-5, tied=True, llama3_scaling=True),
    "mistral-7b-v0.1": dict(arch="llama", layers=32, embd=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                            vocab=32000, ctx=32768, theta=10000.0, eps=1e-5, tied=False, window=4096),
    "qwen2.5-0.5b": dict(arch="qwen2", layers=24, embd=896, heads=14, kv_heads=2, head_dim=64, ffn=4864,
                         vocab=151936, ctx=32768, theta=1000000.0, eps=1e-6, tied=True),
    "qwen2.5-1.5b": dict(arch="qwen2", layers=28, embd=1536, heads=12, kv_heads=2, head_dim=128, ffn=8960,
                         vocab=151936, ctx=32768, theta=1000000.0, eps=1e-6, tied=True),
    "qwen3-0.6b": dict(arch="qwen3", layers=28, embd=1024, heads=16, kv_heads=8, head_dim=128, ffn=3072,
                       vocab=151936, ctx=40960, theta=1000000.0, eps=1e-6, tied=True),
    "qwen3-1.7b": dict(arch="qwen3", layers=28, embd=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144,
                       vocab=151936, ctx=40960, theta=1000000.0, eps=1e-6, tied=True),
    "phi-3-mini": dict(arch="phi3", layers=32, embd=3072, heads=32, kv_heads=32, head_dim=96, ffn=8192,
                       vocab=32064, ctx=4096, theta=10000.0, eps=1e-5, tied=False, window=2047),
    "gemma-3-1b": dict(arch="gemma3", layers=26, embd=1152, heads=4, kv_heads=1, head_dim=256, ffn=6912,
                       vocab=262144, ctx=32768, theta=1000000.0, eps=1e-6, tied=True, window=512),
}
DEFAULT_PRESET = {"llama": "llama-3.2-1b", "qwen2": "qwen2.5-0.5b", "qwen3": "qwen3-0.6b", "phi3": "phi-3-mini",
                  "gemma3": "gemma-3-1b"}

# Each family's template as its tokenizer_config.json has it (shortened to
# what changes the prompt: roles, markers, generation prompt).
TEMPLATES = {
    "llama": (
        "{{- bos_token }}{%- for message in messages %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
        " + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"),
    "qwen2": (
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
        "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
        "{%- endif %}{%- for message in messages %}{%- if message.role != 'system' %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"),
    "qwen3": (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"),
    "phi3": (
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}"
        "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"),
    "gemma3": (
        "{{ bos_token }}{%- for message in messages -%}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
        "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"),
}

# Markers a family's template needs, added to the BPE vocabulary when
# missing (CONTROL tokens), and its BOS / EOS.
SPECIALS = {
    "llama": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
              "<|begin_of_text|>", "<|eot_id|>", True),
    "qwen2": ([], "<|endoftext|>", "<|im_end|>", False),
    "qwen3": (["<think>", "</think>"], "<|endoftext|>", "<|im_end|>", False),
    "phi3": (["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "<|endoftext|>", "<|end|>", False),
}
DEFAULT_PRE = {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2"}

TOKEN_CONTROL = 3

# ---------------------------------------------------------------- K-quants
# Block layouts as ggml defines them (256 weights a block); each function
# takes x [n, 256] float32 and returns [n, type_size] uint8.

F16 = np.float16


def _f16(v):
    """v rounded to f16 and back, and its bytes [n, 2]."""
    h = v.astype(F16)
    return h.astype(np.float32), h.view(np.uint8).reshape(-1, 2)


def _safe(v):
    return np.where(v > 0, v, 1.0).astype(np.float32)


def _fit_min(xb, qmax, smax):
    """x ~ d*sc*q - dmin*m per sub-block (rows of xb [n, S, k]), sc and m in
    [0, smax], q in [0, qmax]. Returns q, sc, m, d bytes, dmin bytes."""
    lo = np.minimum(xb.min(-1), 0.0)
    hi = np.maximum(xb.max(-1), 0.0)
    scale, mins = (hi - lo) / qmax, -lo
    d, d_b = _f16(scale.max(-1) / smax)
    dm, dm_b = _f16(mins.max(-1) / smax)
    sc = np.clip(np.rint(scale / _safe(d)[:, None]), 0, smax)
    m = np.clip(np.rint(mins / _safe(dm)[:, None]), 0, smax)
    es, em = d[:, None] * sc, dm[:, None] * m
    q = np.clip(np.rint((xb + em[..., None]) / _safe(es)[..., None]), 0, qmax)
    return q.astype(np.uint8), sc.astype(np.uint8), m.astype(np.uint8), d_b, dm_b


def _fit_sym(xb, qlo, qhi, smax):
    """x ~ d*sc*q per sub-block, sc in [0, smax], q in [qlo, qhi]."""
    amax = np.abs(xb).max(-1)
    scale = amax / -qlo
    d, d_b = _f16(scale.max(-1) / smax)
    sc = np.clip(np.rint(scale / _safe(d)[:, None]), 0, smax)
    es = d[:, None] * sc
    q = np.clip(np.rint(xb / _safe(es)[..., None]), qlo, qhi)
    return (q - qlo).astype(np.uint8), sc.astype(np.uint8), d_b


def _k4_scales(sc, m):
    """8 six-bit scales and mins into Q4_K/Q5_K's 12 bytes."""
    s = np.zeros((sc.shape[0], 12), np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return s


def _nibbles(q):
    """Q4_K/Q5_K low nibbles: sub-blocks 2j and 2j+1 share 32 bytes."""
    q = q.reshape(-1, 4, 2, 32) & 15
    return (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)


def _crumbs(q):
    """2-bit fields of Q2_K/Q3_K: each 128 weights fill 32 bytes, shift 2j for the j-th 32."""
    q = q.reshape(-1, 2, 4, 32) & 3
    out = q[:, :, 0, :] | (q[:, :, 1, :] << 2) | (q[:, :, 2, :] << 4) | (q[:, :, 3, :] << 6)
    return out.reshape(-1, 64)


def quant_q4_k(x):
    q, sc, m, d, dm = _fit_min(x.reshape(-1, 8, 32), 15, 63)
    return np.concatenate([d, dm, _k4_scales(sc, m), _nibbles(q)], axis=1)


def quant_q5_k(x):
    q, sc, m, d, dm = _fit_min(x.reshape(-1, 8, 32), 31, 63)
    hb = (q >> 4) & 1                          # [n, 8, 32]: bit s of qh[l] is sub-block s's fifth bit
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for s in range(8):
        qh |= hb[:, s, :] << s
    return np.concatenate([d, dm, _k4_scales(sc, m), qh, _nibbles(q)], axis=1)


def quant_q6_k(x):
    q, sc, d = _fit_sym(x.reshape(-1, 16, 16), -32, 31, 127)
    q = q.reshape(-1, 2, 4, 32)
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
                         (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], axis=2).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) |
          ((q[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d], axis=1)


def quant_q2_k(x):
    q, sc, m, d, dm = _fit_min(x.reshape(-1, 16, 16), 3, 15)
    return np.concatenate([sc | (m << 4), _crumbs(q), d, dm], axis=1)


def quant_q3_k(x):
    q, sc, d = _fit_sym(x.reshape(-1, 16, 16), -4, 3, 31)
    L = sc + 32                                # stored biased: scale - 32 is signed
    s = np.zeros((q.shape[0], 12), np.uint8)
    s[:, 0:8] = (L[:, 0:8] & 15) | ((L[:, 8:16] & 15) << 4)
    for j in range(16):
        s[:, 8 + j % 4] |= (L[:, j] >> 4) << (2 * (j // 4))
    hb = (q.reshape(-1, 2, 4, 32) >> 2) & 1
    hmask = np.zeros((q.shape[0], 32), np.uint8)
    for h in range(2):
        for j in range(4):
            hmask |= hb[:, h, j, :] << (4 * h + j)
    return np.concatenate([hmask, _crumbs(q), s, d], axis=1)


K_QUANTS = {QT.Q2_K: quant_q2_k, QT.Q3_K: quant_q3_k, QT.Q4_K: quant_q4_k, QT.Q5_K: quant_q5_k,
            QT.Q6_K: quant_q6_k}
FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0, QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0}

# --type: (the type of most matrices, its overrides by tensor suffix, general.file_type)
MIXES = {
    "F16": (QT.F16, {}, 1), "Q4_0": (QT.Q4_0, {}, 2), "Q4_1": (QT.Q4_1, {}, 3), "Q8_0": (QT.Q8_0, {}, 7),
    "Q5_0": (QT.Q5_0, {}, 8), "Q5_1": (QT.Q5_1, {}, 9), "Q2_K": (QT.Q2_K, {}, 10), "Q3_K": (QT.Q3_K, {}, 11),
    "Q4_K": (QT.Q4_K, {}, 14), "Q5_K": (QT.Q5_K, {}, 16), "Q6_K": (QT.Q6_K, {}, 18),
    # llama.cpp's _M mixes, simplified: the sensitive tensors one type up in every layer
    "Q3_K_M": (QT.Q3_K, {"attn_v.weight": QT.Q5_K, "ffn_down.weight": QT.Q4_K, "attn_output.weight": QT.Q4_K,
                         "output.weight": QT.Q6_K}, 12),
    "Q4_K_M": (QT.Q4_K, {"attn_v.weight": QT.Q6_K, "ffn_down.weight": QT.Q6_K, "output.weight": QT.Q6_K}, 15),
    "Q5_K_M": (QT.Q5_K, {"attn_v.weight": QT.Q6_K, "ffn_down.weight": QT.Q6_K, "output.weight": QT.Q6_K}, 17),
}


def quantize(x, t):
    """x [rows, cols] float32 as rows of type t: [rows, row_bytes] uint8 (or f16/f32)."""
    if t == QT.F32:
        return x
    if t == QT.F16:
        return x.astype(F16)
    if t in K_QUANTS:
        rows = x.shape[0]
        return K_QUANTS[t](x.reshape(-1, 256)).reshape(rows, -1)
    return gguf.quants.quantize(x, t)


def pick_type(mix, suffix, cols, tied):
    base, over, _ = MIXES[mix]
    t = over.get(suffix, base)
    if tied and suffix == "token_embd.weight" and "output.weight" in over:
        t = over["output.weight"]          # a tied embedding is the output: llama.cpp gives it the output's type
    block = GGML_QUANT_SIZES[t][0]
    while cols % block:
        t = FALLBACK.get(t, QT.F16)
        block = GGML_QUANT_SIZES[t][0]
    return t


# ---------------------------------------------------------------- tokenizer

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
       10: np.uint64, 11: np.int64, 12: np.float64}


def read_tokenizer(path):
    """The tokenizer.* keys of a GGUF file: {key: [value, type, array item type]}.
    Parsed here rather than by gguf.GGUFReader, which takes a minute over a
    262144-token vocabulary."""
    import struct
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:4] != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        n_kv = struct.unpack_from("<Q", head, 16)[0]
        buf = f.read(64 << 20)             # the metadata comes first and is smaller than this
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        v = buf[pos:pos + n].decode("utf-8", errors="surrogateescape")
        pos += n
        return v

    kv = {}
    for _ in range(n_kv):
        key, vt = string(), take("<I")
        if vt == 9:
            st, n = take("<I"), take("<Q")
            if st == 8:
                val = [string() for _ in range(n)]
            else:
                dt = np.dtype(_NP[st])
                val = np.frombuffer(buf, dt, n, pos).tolist()
                pos += n * dt.itemsize
            item = gguf.GGUFValueType(st)
        else:
            val = string() if vt == 8 else take(_SCALARS[vt])
            item = None
        if key.startswith("tokenizer."):
            kv[key] = [val, gguf.GGUFValueType(vt), item]
    return kv


def build_tokenizer(arch, vocab, pre):
    spm = arch == "gemma3"
    kv = read_tokenizer(SPM_SOURCE if spm else BPE_SOURCE)
    kv.pop("tokenizer.chat_template", None)
    tokens = kv["tokenizer.ggml.tokens"][0]
    types = kv["tokenizer.ggml.token_type"][0]
    scores = kv.get("tokenizer.ggml.scores", [None])[0]
    if not spm:
        specials, bos, eos, add_bos = SPECIALS[arch]
        have = set(tokens)
        for s in specials:
            if s not in have:
                tokens.append(s)
                types.append(TOKEN_CONTROL)
                if scores is not None:
                    scores.append(0.0)
        ids = {t: i for i, t in enumerate(tokens)}
        kv["tokenizer.ggml.bos_token_id"][0] = ids[bos]
        kv["tokenizer.ggml.eos_token_id"][0] = ids[eos]
        kv["tokenizer.ggml.add_bos_token"] = [add_bos, gguf.GGUFValueType.BOOL, None]
    if vocab is not None and vocab > len(tokens):
        for i in range(vocab - len(tokens)):
            tokens.append(f"<|unused_{i}|>")
            types.append(TOKEN_CONTROL)
            if scores is not None:
                scores.append(0.0)
    pre = pre or DEFAULT_PRE.get(arch)
    if pre:
        kv["tokenizer.ggml.pre"] = [pre, gguf.GGUFValueType.STRING, None]
    kv["tokenizer.chat_template"] = [TEMPLATES[arch], gguf.GGUFValueType.STRING, None]
    return kv, len(tokens)


# ---------------------------------------------------------------- model

def llama3_rope_factors(head_dim, theta, factor=32.0, low=1.0, high=4.0, orig=8192):
    """The divisors of Llama 3.1's frequencies (its rope_scaling "llama3")."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def tensor_plan(a):
    """[(name, rows, cols or None for a vector, kind)]: kind 'w' a weight
    matrix, 'n' a norm, 'b' a bias, 'f' rope factors."""
    D, H, Hkv, d, F = a.embd, a.heads, a.kv_heads, a.head_dim, a.ffn
    plan = [("token_embd.weight", a.vocab, D, "w")]
    for l in range(a.layers):
        p = f"blk.{l}."
        plan.append((p + "attn_norm.weight", D, None, "n"))
        if a.arch == "phi3":
            plan.append((p + "attn_qkv.weight", (H + 2 * Hkv) * d, D, "w"))
        else:
            plan += [(p + "attn_q.weight", H * d, D, "w"), (p + "attn_k.weight", Hkv * d, D, "w"),
                     (p + "attn_v.weight", Hkv * d, D, "w")]
        if a.arch == "qwen2":
            plan += [(p + "attn_q.bias", H * d, None, "b"), (p + "attn_k.bias", Hkv * d, None, "b"),
                     (p + "attn_v.bias", Hkv * d, None, "b")]
        if a.arch in ("qwen3", "gemma3"):
            plan += [(p + "attn_q_norm.weight", d, None, "n"), (p + "attn_k_norm.weight", d, None, "n")]
        plan.append((p + "attn_output.weight", D, H * d, "w"))
        if a.arch == "gemma3":
            plan.append((p + "post_attention_norm.weight", D, None, "n"))
        plan.append((p + "ffn_norm.weight", D, None, "n"))
        if a.arch == "phi3":
            plan.append((p + "ffn_up.weight", 2 * F, D, "w"))
        else:
            plan += [(p + "ffn_gate.weight", F, D, "w"), (p + "ffn_up.weight", F, D, "w")]
        plan.append((p + "ffn_down.weight", D, F, "w"))
        if a.arch == "gemma3":
            plan.append((p + "post_ffw_norm.weight", D, None, "n"))
    plan.append(("output_norm.weight", D, None, "n"))
    if not a.tied:
        plan.append(("output.weight", a.vocab, D, "w"))
    if a.llama3_scaling:
        plan.append(("rope_freqs.weight", d // 2, None, "f"))
    return plan


def write_hparams(w, a, file_type):
    arch = a.arch
    w.add_string("general.name", a.name)
    w.add_uint32("general.file_type", file_type)
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32(f"{arch}.block_count", a.layers)
    w.add_uint32(f"{arch}.context_length", a.ctx)
    w.add_uint32(f"{arch}.embedding_length", a.embd)
    w.add_uint32(f"{arch}.feed_forward_length", a.ffn)
    w.add_uint32(f"{arch}.attention.head_count", a.heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", a.kv_heads)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", a.eps)
    w.add_float32(f"{arch}.rope.freq_base", a.theta)
    w.add_uint32(f"{arch}.attention.key_length", a.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", a.head_dim)
    if arch in ("llama", "phi3"):
        w.add_uint32(f"{arch}.rope.dimension_count", a.head_dim)
    if arch == "llama":
        w.add_uint32("llama.vocab_size", a.vocab)
    if arch == "phi3":
        w.add_uint32("phi3.rope.scaling.original_context_length", a.ctx)
    if a.window:
        w.add_uint32(f"{arch}.attention.sliding_window", a.window)


def tensor_data(rng, a, name, rows, cols, kind, t):
    if kind == "f":
        return llama3_rope_factors(a.head_dim, a.theta)
    if kind == "n":
        return (1.0 + 0.05 * rng.standard_normal(rows, dtype=np.float32)).astype(np.float32)
    if kind == "b":
        return (0.1 * rng.standard_normal(rows, dtype=np.float32)).astype(np.float32)
    if name in ("token_embd.weight", "output.weight"):
        std = a.logit_std / math.sqrt(a.embd)
    else:
        std = a.std or 1.0 / math.sqrt(cols)
    step = max(1, (1 << 24) // cols)  # about 64 MiB of float32 at a time
    parts = []
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        x = std * rng.standard_normal((n, cols), dtype=np.float32)
        parts.append(quantize(x, t))
    return np.concatenate(parts, axis=0)


def verify(path):
    """Dequantizes every tensor with gguf-py's independent dequantizer and
    checks that the values are finite and of the scale written (default --std)."""
    r = gguf.GGUFReader(path)
    worst = {}
    for t in r.tensors:
        if t.tensor_type in (QT.F32, QT.F16):
            continue
        x = gguf.quants.dequantize(t.data[:64], t.tensor_type)
        rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
        std = 1.0 / math.sqrt(x.shape[-1]) if t.name not in ("token_embd.weight", "output.weight") else rms
        ok = bool(np.isfinite(x).all()) and 0.25 * std < rms < 4 * std
        name = t.tensor_type.name
        worst[name] = worst.get(name, True) and ok
    print("dequantized: finite, rms within 4x of 1/sqrt(inputs):", worst)
    return all(worst.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a real model's shape")
    ap.add_argument("--arch", choices=sorted(TEMPLATES), help="architecture (default: the preset's)")
    ap.add_argument("--type", default="Q4_K_M", choices=sorted(MIXES), help="weight type (default Q4_K_M)")
    ap.add_argument("-o", "--output", required=True)
    for k in ("layers", "embd", "heads", "kv_heads", "head_dim", "ffn", "vocab", "ctx", "window"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, dest=k)
    ap.add_argument("--theta", type=float, help="rope.freq_base")
    ap.add_argument("--eps", type=float, help="RMS norm epsilon")
    ap.add_argument("--tied", type=int, choices=(0, 1), help="1: no output.weight (the output is token_embd)")
    ap.add_argument("--llama3-scaling", type=int, choices=(0, 1), help="1: write Llama 3.1's rope_freqs.weight")
    ap.add_argument("--pre", help="tokenizer.ggml.pre")
    ap.add_argument("--std", type=float, default=0.0,
                    help="standard deviation of the layers' weights (default 1/sqrt(inputs): 0.022 at D = 2048)")
    ap.add_argument("--logit-std", type=float, default=3.0,
                    help="spread of the logits: token_embd and output are N(0, this / sqrt(D)) (3)")
    ap.add_argument("--rng", type=int, default=1, help="random generator's initial state (1)")
    ap.add_argument("--verify", action="store_true", help="dequantize the file with gguf-py and check the scale")
    a = ap.parse_args()
    if not a.preset and not a.arch:
        ap.error("give --preset or --arch")
    preset = PRESETS[a.preset or DEFAULT_PRESET[a.arch]]
    if a.arch and a.arch != preset["arch"] and a.preset:
        ap.error(f"preset {a.preset} is {preset['arch']}, not {a.arch}")
    a.arch = a.arch or preset["arch"]
    for k, v in preset.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    a.window = a.window or 0
    a.tied = bool(a.tied)
    a.llama3_scaling = bool(a.llama3_scaling) and a.arch == "llama"
    if a.heads % a.kv_heads:
        ap.error(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    kv, n_vocab = build_tokenizer(a.arch, a.vocab, a.pre)
    if 0 < a.vocab < n_vocab:
        print(f"note: vocabulary {a.vocab} is smaller than the bundled tokenizer's; using {n_vocab}", file=sys.stderr)
    a.vocab = n_vocab
    a.name = f"synthetic {a.preset or a.arch} {a.type}"

    w = gguf.GGUFWriter(a.output, a.arch)
    write_hparams(w, a, MIXES[a.type][2])
    for k, (v, vt, sub) in kv.items():
        w.add_key_value(k, v, vt, sub)
    plan = []
    for name, rows, cols, kind in tensor_plan(a):
        if cols is None:
            t = QT.F32
            nbytes = rows * 4
        else:
            t = pick_type(a.type, name.split(".", 2)[-1] if name.startswith("blk.") else name, cols, a.tied)
            bs, ts = GGML_QUANT_SIZES[t]
            nbytes = rows * (cols // bs) * ts
        plan.append((name, rows, cols, kind, t))
        shape = (rows,) if cols is None else (rows, cols) if t == QT.F16 else (rows, nbytes // rows)
        w.add_tensor_info(name, shape, np.float32 if t == QT.F32 else np.float16 if t == QT.F16 else np.uint8,
                          nbytes, raw_dtype=None if t in (QT.F32, QT.F16) else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(a.rng)
    total = 0
    for name, rows, cols, kind, t in plan:
        data = tensor_data(rng, a, name, rows, cols, kind, t)
        w.write_tensor_data(np.ascontiguousarray(data))
        total += rows * (cols or 1)
    w.close()
    print(f"{a.output}: {a.arch} L={a.layers} D={a.embd} H={a.heads}/{a.kv_heads} d={a.head_dim} F={a.ffn} "
          f"V={a.vocab} {a.type}, {total / 1e9:.3f}B parameters")
    if a.verify and not verify(a.output):
        sys.exit(1)


if __name__ == "__main__":
    main()
