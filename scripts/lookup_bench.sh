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
#   REPEAT (default 1): runs of each, alternating
#   BIN_B: a second build whose lookup runs alternate with the others (A/B)
#   ASK=copy (default): ask for the list copied, most drafts are taken;
#   ASK=story: ask for a story about it, little is copied (drafts must not
#   slow decoding down there)
#
# The prompt is filled into the cache once and saved as a session; each run
# restores a copy of it (prefilling 1 token), so the timed decodes start from
# the same cache at the same depth and prefill time stays out of the figures.
set -eu
LINES=${1:-122}
N=${2:-8}
TOKENS=${3:-200}
ASK=${ASK:-copy}
case $ASK in
copy) REQUEST="Copy the inventory list above, line by line, with the same numbers." ;;
story) REQUEST="Write a short story about a traveller who buys three of the items above." ;;
*) echo "ASK must be copy or story, not $ASK" >&2; exit 2 ;;
esac
BIN=${KVCACHE_BIN:-build/kvcache}
BIN_B=${BIN_B:-}
REPEAT=${REPEAT:-1}
THREADS=${THREADS:-2}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

# A numbered inventory, then the request to copy it: each line recurs word for
# word in a faithful answer (random items from a fixed seed, so every run of
# the script sees the same prompt).
awk -v n="$LINES" -v ask="$REQUEST" 'BEGIN {
    srand(7);
    split("white silver yellow blue red green black orange purple brown", col, " ");
    split("backpack violin kettle bicycle umbrella lamp camera teapot compass lantern scarf hammer clock globe notebook telescope", thing, " ");
    split("Sofia Riga Osaka Lisbon Lima Nairobi Oslo Quito Hanoi Dakar Perth Tunis Berlin Cusco Accra Dublin", city, " ");
    printf "Inventory list:\n\n";
    for (i = 1; i <= n; i++)
        printf "%d. A %s %s from %s, weighing %d kg, priced at %d dollars, shipped on day %d.\n", i,
               col[int(rand() * 10) + 1], thing[int(rand() * 16) + 1], city[int(rand() * 16) + 1],
               int(rand() * 90) + 1, int(rand() * 997) + 3, int(rand() * 365) + 1;
    printf "\n%s\n", ask;
}' > "$DIR/prompt.txt"

CTX=4608
COMMON="-f $DIR/prompt.txt --chat --temp 0 -t $THREADS --ctx $CTX"
# shellcheck disable=SC2086
"$BIN" generate $COMMON -n 1 --session "$DIR/prompt.session" > /dev/null 2> "$DIR/prefill.err" || {
    cat "$DIR/prefill.err" >&2
    exit 1
}
grep '^session:' "$DIR/prefill.err"

run() { # $1: label, $2: --draft-lookup value, $3: binary
    cp "$DIR/prompt.session" "$DIR/run.session"
    # shellcheck disable=SC2086
    "$3" generate $COMMON -n "$TOKENS" --session "$DIR/run.session" --draft-lookup "$2" \
        > "$DIR/$1.txt" 2> "$DIR/$1.err" || { cat "$DIR/$1.err" >&2; exit 1; }
    sed -n 's/^decode: .* in \([0-9.]*\) s .*/\1/p' "$DIR/$1.err" >> "$DIR/$1.secs"
}
# plain and lookup (and BIN_B's lookup) alternate REPEAT times; speeds from the summed times
i=0
while [ "$i" -lt "$REPEAT" ]; do
    run plain 0 "$BIN"
    run lookup "$N" "$BIN"
    [ -z "$BIN_B" ] || run lookup_b "$N" "$BIN_B"
    i=$((i + 1))
done

for v in lookup ${BIN_B:+lookup_b}; do
    if ! cmp -s "$DIR/plain.txt" "$DIR/$v.txt"; then
        echo "FAIL: --draft-lookup $N ($v) changed the text" >&2
        diff "$DIR/plain.txt" "$DIR/$v.txt" >&2 || true
        exit 1
    fi
done
echo "text identical ($(wc -c < "$DIR/plain.txt") bytes)"
grep '^draft lookup:' "$DIR/lookup.err" | sed 's/^/lookup    /'
[ -z "$BIN_B" ] || grep '^draft lookup:' "$DIR/lookup_b.err" | sed 's/^/lookup_b  /'
tps() { awk -v n="$TOKENS" '{ s += $1; k++ } END { printf "%.2f", n * k / s }' "$DIR/$1.secs"; }
for v in lookup ${BIN_B:+lookup_b}; do
    awk -v a="$(tps plain)" -v b="$(tps $v)" -v n="$N" -v v="$v" -v r="$REPEAT" \
        'BEGIN { printf "%s: speedup of --draft-lookup %d: %.2fx (%.1f vs %.1f tokens/s, %d runs each)\n", v, n, b / a, b, a, r }'
done
