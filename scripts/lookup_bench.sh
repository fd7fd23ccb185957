#!/bin/sh
# Prompt-lookup speculative decoding on a copy-heavy prompt of about 4,000
# tokens: plain greedy and --draft-lookup N side by side in one run, same
# prompt, threads and context; fails unless the two texts are identical and
# prints both decode speeds, the speedup and the acceptance rate.
#
#   scripts/lookup_bench.sh [LINES] [N] [TOKENS]
#     LINES   inventory lines in the prompt (default 122: 4,003 tokens with the
#             SmolLM2 chat template)
#     N       --draft-lookup N (default 8)
#     TOKENS  tokens to generate (default 200)
#   KVCACHE_BIN (default build/kvcache), KVCACHE_MODEL, THREADS (default 2)
#
# The prompt is filled into the cache once and saved as a session; each run
# restores a copy of it (prefilling 1 token), so the timed decodes start from
# the same cache at the same depth and prefill time stays out of the figures.
set -eu
LINES=${1:-122}
N=${2:-8}
TOKENS=${3:-200}
BIN=${KVCACHE_BIN:-build/kvcache}
THREADS=${THREADS:-2}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

# A numbered inventory, then the request to copy it: each line recurs word for
# word in a faithful answer (random items from a fixed seed, so every run of
# the script sees the same prompt).
awk -v n="$LINES" 'BEGIN {
    srand(7);
    split("white silver yellow blue red green black orange purple brown", col, " ");
    split("backpack violin kettle bicycle umbrella lamp camera teapot compass lantern scarf hammer clock globe notebook telescope", thing, " ");
    split("Sofia Riga Osaka Lisbon Lima Nairobi Oslo Quito Hanoi Dakar Perth Tunis Berlin Cusco Accra Dublin", city, " ");
    printf "Inventory list:\n\n";
    for (i = 1; i <= n; i++)
        printf "%d. A %s %s from %s, weighing %d kg, priced at %d dollars, shipped on day %d.\n", i,
               col[int(rand() * 10) + 1], thing[int(rand() * 16) + 1], city[int(rand() * 16) + 1],
               int(rand() * 90) + 1, int(rand() * 997) + 3, int(rand() * 365) + 1;
    printf "\nCopy the inventory list above, line by line, with the same numbers.\n";
}' > "$DIR/prompt.txt"

CTX=4608
COMMON="-f $DIR/prompt.txt --chat --temp 0 -t $THREADS --ctx $CTX"
# shellcheck disable=SC2086
"$BIN" generate $COMMON -n 1 --session "$DIR/prompt.session" > /dev/null 2> "$DIR/prefill.err" || {
    cat "$DIR/prefill.err" >&2
    exit 1
}
grep '^session:' "$DIR/prefill.err"

run() { # $1: label, $2: --draft-lookup value
    cp "$DIR/prompt.session" "$DIR/run.session"
    # shellcheck disable=SC2086
    "$BIN" generate $COMMON -n "$TOKENS" --session "$DIR/run.session" --draft-lookup "$2" \
        > "$DIR/$1.txt" 2> "$DIR/$1.err" || { cat "$DIR/$1.err" >&2; exit 1; }
}
run plain 0
run lookup "$N"

if ! cmp -s "$DIR/plain.txt" "$DIR/lookup.txt"; then
    echo "FAIL: --draft-lookup $N changed the text" >&2
    diff "$DIR/plain.txt" "$DIR/lookup.txt" >&2 || true
    exit 1
fi
echo "text identical ($(wc -c < "$DIR/plain.txt") bytes)"
grep '^decode:' "$DIR/plain.err" | sed 's/^/plain   /'
grep '^decode:' "$DIR/lookup.err" | sed 's/^/lookup  /'
grep '^draft lookup:' "$DIR/lookup.err"
tps() { sed -n 's/^decode: .*(\([0-9.]*\) tokens\/s).*/\1/p' "$1"; }
awk -v a="$(tps "$DIR/plain.err")" -v b="$(tps "$DIR/lookup.err")" -v n="$N" \
    'BEGIN { printf "speedup of --draft-lookup %d: %.2fx (%.1f vs %.1f tokens/s)\n", n, b / a, b, a }'
