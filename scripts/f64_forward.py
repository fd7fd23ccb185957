#!/usr/bin/env python3
"""A float64 forward pass of a qwen2 or llama GGUF over one window of a
text, scored as `kvcache perplexity` and llama.cpp's llama-perplexity score
it: an independent reference for who is right when the two disagree.

    pip install numpy gguf
    build/kvcache tokenize --ids -m FILE -f TEXT > ids.txt
    python3 scripts/f64_forward.py -m FILE --ids ids.txt -o ref.npy [--window K] \\
        [--kl RUN.kl ...] [--nll OTHER.npy ...]

The weights are dequantized by gguf-py (gguf.quants.dequantize, not
kvcache's code) and every product is taken in float64: embedding, RMSNorm
(epsilon from the file), Q/K/V with their biases when the file has them,
RoPE (theta from the file; NEOX pairs (i, i + d/2) for qwen2, adjacent
pairs for llama), causal attention with grouped K/V heads, SwiGLU, the
output norm and the output matrix (token_embd when tied). Positions
ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1; their negative
log-likelihoods go to -o (.npy) and their perplexity is printed.

--window K scores the K-th window (from 0) instead of the first. --kl FILE
reads a `kvcache perplexity --kl-base FILE` (f32 log-probabilities of every
scored position; its K-th window's) and --nll FILE a .npy of
per-token negative log-likelihoods from elsewhere (llama.cpp's through its
C API, say); each is reported against the reference: its perplexity, and
the mean and largest |difference| of the per-token losses.
"""
import argparse
import sys
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def forward(path, ids, ctx):
    r = GGUFReader(path)
    fld = lambda k: r.fields[k].contents()  # noqa: E731
    arch = fld("general.architecture")
    if arch not in ("qwen2", "llama"):
        sys.exit(f"f64_forward: architecture {arch!r}: only qwen2 and llama")
    L, D = fld(f"{arch}.block_count"), fld(f"{arch}.embedding_length")
    H, Hkv = fld(f"{arch}.attention.head_count"), fld(f"{arch}.attention.head_count_kv")
    eps = float(fld(f"{arch}.attention.layer_norm_rms_epsilon"))
    theta = float(fld(f"{arch}.rope.freq_base")) if f"{arch}.rope.freq_base" in r.fields else 10000.0
    hd = D // H
    T = {t.name: t for t in r.tensors}

    def W(name):
        t = T[name]
        shape = [int(s) for s in reversed(t.shape)]
        return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)

    def bias(name, n):
        return W(name) if name in T else np.zeros(n)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    ang = np.arange(ctx, dtype=np.float64)[:, None] * theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):   # [ctx, heads, hd]
        if arch == "qwen2":
            a, b = x[..., : hd // 2], x[..., hd // 2:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    t0 = time.time()
    emb = W("token_embd.weight")
    x = emb[ids].copy()
    mask = np.triu(np.full((ctx, ctx), -np.inf), 1)
    for layer in range(L):
        p = f"blk.{layer}."
        h = rms(x, W(p + "attn_norm.weight"))
        q = h @ W(p + "attn_q.weight").T + bias(p + "attn_q.bias", H * hd)
        k = h @ W(p + "attn_k.weight").T + bias(p + "attn_k.bias", Hkv * hd)
        v = h @ W(p + "attn_v.weight").T + bias(p + "attn_v.bias", Hkv * hd)
        q, k, v = rope(q.reshape(ctx, H, hd)), rope(k.reshape(ctx, Hkv, hd)), v.reshape(ctx, Hkv, hd)
        o = np.empty((ctx, H, hd))
        for j in range(H):
            g = j // (H // Hkv)
            s = q[:, j] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, j] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
        x = x + o.reshape(ctx, D) @ W(p + "attn_output.weight").T
        h = rms(x, W(p + "ffn_norm.weight"))
        gate, up = h @ W(p + "ffn_gate.weight").T, h @ W(p + "ffn_up.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W(p + "ffn_down.weight").T
        print(f"layer {layer} done, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    first = ctx // 2
    h = rms(x[first:ctx - 1], W("output_norm.weight"))
    logits = h @ (W("output.weight") if "output.weight" in T else emb).T
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    return lse - logits[np.arange(len(h)), ids[first + 1:ctx]], logits.shape[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--ids", required=True, help="token ids of the text (kvcache tokenize --ids)")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--window", type=int, default=0, help="which window of ctx tokens (from 0)")
    ap.add_argument("-o", "--out", required=True, help="the reference's per-token losses (.npy)")
    ap.add_argument("--kl", nargs="*", default=[], help="kvcache perplexity --kl-base files to compare")
    ap.add_argument("--nll", nargs="*", default=[], help=".npy per-token losses to compare")
    a = ap.parse_args()
    ids = np.array([int(t) for t in open(a.ids).read().replace(",", " ").replace("[", " ").replace("]", " ").split()])
    if len(ids) < (a.window + 1) * a.ctx:
        sys.exit(f"f64_forward: {len(ids)} tokens, fewer than {a.window + 1} windows of {a.ctx}")
    ids = ids[a.window * a.ctx:(a.window + 1) * a.ctx]
    ref, V = forward(a.model, ids, a.ctx)
    np.save(a.out, ref)
    print(f"{'run':40s} {'ppl':>14s} {'vs f64':>8s} {'mean|d|':>8s} {'max|d|':>7s}")
    print(f"{'f64 reference':40s} {np.exp(ref.mean()):14.1f}")
    n, tgt = len(ref), ids[a.ctx // 2 + 1:]
    runs = []
    for f in a.kl:   # header: magic, version, n_vocab, ctx (u32), n_scored, hash (u64)
        rows = int(np.fromfile(f, np.uint64, 1, offset=16)[0])
        lp = np.memmap(f, np.float32, "r", 32, (rows, V))[a.window * n:(a.window + 1) * n]
        runs.append((f, -lp[np.arange(n), tgt].astype(np.float64)))
    runs += [(f, np.load(f)) for f in a.nll]
    for name, x in runs:
        d = x - ref
        print(f"{name[-40:]:40s} {np.exp(x.mean()):14.1f} {100 * np.expm1(x.mean() - ref.mean()):+7.3f}% "
              f"{np.abs(d).mean():8.5f} {np.abs(d).max():7.4f}")


if __name__ == "__main__":
    main()
