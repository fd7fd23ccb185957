#!/usr/bin/env python3
"""Expected token ids of the tokenizer corpus, from an independent tokenizer.

    python3 scripts/tokenizer-fixtures.py --llama-tokenize PATH/llama-tokenize \\
        [--model smollm2=models/SmolLM2-135M-Instruct.Q4_1.gguf] \\
        [--model gemma3=models/gemma-3-270m-Q4_K_M.gguf]

The reference is llama.cpp's tokenizer (its `llama-tokenize` tool), the one its
`llama-perplexity` uses, so that equal ids mean equal perplexity inputs. Build it
yourself from llama.cpp's sources, outside this tree (nothing of it is kept
here); any recent version does.

For every text tests/data/tokenizer/NAME.txt and every model it writes
tests/data/tokenizer/expected/NAME.MODEL.ids: the ids of the file's exact bytes,
without BOS, with special-token text treated as plain text (what message
content gets). chat.txt and the chat-template renderings template_*.txt are
also tokenized with special tokens parsed, into NAME.special.MODEL.ids (what a
rendered chat template gets). Each .ids file is
one line of decimal ids separated by spaces.

The chat templates of models not at hand (Llama 3, Llama 2, Zephyr) are held to
it too: their renderings are tokenized with the smollm2 vocabulary plus their
markers as control tokens (TEMPLATE_MARKERS).

The byte-level BPE pre-tokenizers are held to the same standard: the smollm2
vocabulary is also written into vocabulary-only GGUF files whose
tokenizer.ggml.pre names another pattern (BPE_VARIANTS), and each text gets
NAME.smollm2-PRE.ids from them (needs `pip install gguf`).

It also rewrites tests/data/gemma3_cases.txt (the short strings of
tests/data/gen_tokenizer_refs.py and a few Gemma-specific ones, special tokens
parsed: "<hex utf-8> <n> <ids...>") with the same reference when a gemma3 model
is given.
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "tokenizer")
# Chat templates whose models are not here: their renderings (template_NAME.txt)
# are tokenized with the smollm2 vocabulary plus the template's markers as
# control tokens, into template_NAME.special.smollm2+NAME.ids.
TEMPLATE_MARKERS = {
    "llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "llama2": ["<s>", "</s>"],
    "zephyr": ["<|system|>", "<|user|>", "<|assistant|>", "</s>"],
}

# Other tokenizer.ggml.pre values tried with the smollm2 vocabulary.
BPE_VARIANTS = ["gpt-2", "default", "llama-bpe", "qwen2"]

# Gemma-specific strings for gemma3_cases.txt, beside the shared ones.
GEMMA_EXTRA = [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>Hello<eos>",
    "a  b   c    d",
    "\t\tindented\n\n\n\nparagraph",
    "<b>bold</b> and <table><tr><td>cell</td></tr></table>",
    "The tower is 324 metres (1,063 ft) tall, about the same height as an 81-storey building.",
    "\u2581literal lower one eighth block",
    "\x00\x01 control bytes \x7f",
]
DEFAULT_MODELS = {
    "smollm2": os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf"),
}


def tokenize(tool, model, path, parse_special):
    """llama.cpp's ids of the bytes of the file at path."""
    cmd = [tool, "-m", model, "-f", path, "--ids", "--no-bos", "--no-escape", "--log-disable"]
    if not parse_special:  # llama-tokenize parses them by default
        cmd.append("--no-parse-special")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    body = line.strip()[1:-1].strip()
    return [int(x) for x in body.split(",")] if body else []


def vocab_only_gguf(src, dst, pre=None, controls=()):
    """A copy of src's metadata, no tensors, with tokenizer.ggml.pre = pre
    (unless None) and the tokens controls appended as control tokens."""
    import gguf
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "tokenizer.ggml.pre" and pre is not None:
            value = pre
        elif key == "tokenizer.ggml.tokens":
            value = value + list(controls)
        elif key == "tokenizer.ggml.token_type":
            value = value + [3] * len(controls)
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, field.types[0], sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, field.types[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_ids(path, ids):
    with open(path, "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-tokenize", required=True, help="path to llama.cpp's llama-tokenize")
    ap.add_argument("--model", action="append", default=[], help="NAME=GGUF (default: both bundled models)")
    args = ap.parse_args()
    models = dict(m.split("=", 1) for m in args.model) if args.model else dict(DEFAULT_MODELS)
    out_dir = os.path.join(CORPUS, "expected")
    os.makedirs(out_dir, exist_ok=True)
    texts = sorted(f for f in os.listdir(CORPUS) if f.endswith(".txt"))
    tmp = tempfile.TemporaryDirectory()
    if "smollm2" in models:
        for pre in BPE_VARIANTS:
            path = os.path.join(tmp.name, f"smollm2-{pre}.gguf")
            vocab_only_gguf(models["smollm2"], path, pre)
            models[f"smollm2-{pre}"] = path
        for name, controls in TEMPLATE_MARKERS.items():
            path = os.path.join(tmp.name, f"smollm2+{name}.gguf")
            vocab_only_gguf(models["smollm2"], path, controls=controls)
            write_ids(os.path.join(out_dir, f"template_{name}.special.smollm2+{name}.ids"),
                      tokenize(args.llama_tokenize, path, os.path.join(CORPUS, f"template_{name}.txt"), True))
    for name, gguf in models.items():
        for t in texts:
            path = os.path.join(CORPUS, t)
            stem = t[:-4]
            write_ids(os.path.join(out_dir, f"{stem}.{name}.ids"), tokenize(args.llama_tokenize, gguf, path, False))
            if "-" not in name and (stem == "chat" or stem.startswith("template_")):
                write_ids(os.path.join(out_dir, f"{stem}.special.{name}.ids"),
                          tokenize(args.llama_tokenize, gguf, path, True))
        print(f"{name}: {len(texts)} texts", file=sys.stderr)
    if "gemma3" in models:
        sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
        from gen_tokenizer_refs import cases, hexs
        lines = ["# generated by scripts/tokenizer-fixtures.py (llama.cpp's llama-tokenize) from "
                 f"{os.path.basename(models['gemma3'])}: <hex utf-8> <n> <ids>"]
        with tempfile.TemporaryDirectory() as tmp:
            for s in cases() + GEMMA_EXTRA:
                p = os.path.join(tmp, "case.txt")
                with open(p, "wb") as f:
                    f.write(s.encode("utf-8"))
                ids = tokenize(args.llama_tokenize, models["gemma3"], p, True)
                lines.append(f"{hexs(s)} {len(ids)} {' '.join(map(str, ids))}".rstrip())
        with open(os.path.join(ROOT, "tests", "data", "gemma3_cases.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"gemma3_cases.txt: {len(lines) - 1} strings", file=sys.stderr)


if __name__ == "__main__":
    main()
