#!/bin/sh
# Prefix reuse across cache groups and in flight (issue 42), side by side with
# llama-server, in one sitting, the servers taking turns (never two at once):
#   1. 8 clients x 4 turns over one shared ~900-token system prompt, 32 tokens
#      a reply (scripts/bench_multiturn.py): later-turn TTFT p50 and content
#      chunks (tokens) per second, for kvcache serve and llama-server
#      (16 slots, --swa-full so that it can reuse Gemma's window layers).
#   2. 8 simultaneous first turns against one first turn alone, each on a
#      fresh kvcache server (cold cache): TTFT p50.
#
#   scripts/bench_prefix_groups.sh LLAMA_SERVER [MODEL ...]
# Environment: THREADS (2), PORT (18642), PY (python3), ROUNDS (2).
set -eu
LLAMA=$1; shift
MODELS=${*:-models/gemma-3-270m-Q4_K_M.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}; PORT=${PORT:-18642}; PY=${PY:-python3}; ROUNDS=${ROUNDS:-2}
URL=http://127.0.0.1:$PORT
BENCH="$PY scripts/bench_multiturn.py $URL"

wait_up() {   # up to 10 minutes for /health
    for _ in $(seq 600); do
        curl -sf $URL/health >/dev/null 2>&1 && return 0
        sleep 1
    done
    echo "server did not come up" >&2; return 1
}
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }

kv() {   # kv MODEL ARGS...: one kvcache serve run of bench_multiturn ARGS
    m=$1; shift
    build/kvcache serve -m "$m" -t "$THREADS" --port "$PORT" --parallel 16 --ctx 2048 2>/dev/null >/dev/null &
    pid=$!; wait_up
    $BENCH --replicas $URL "$@"
    stop $pid
}
ll() {
    m=$1; shift
    "$LLAMA" -m "$m" -t "$THREADS" --port "$PORT" -np 16 -c 32768 --swa-full >/dev/null 2>&1 &
    pid=$!; wait_up
    $BENCH "$@"
    stop $pid
}

for r in $(seq "$ROUNDS"); do
    for m in $MODELS; do
        echo "== round $r $m: kvcache serve, 8 clients x 4 turns"; kv "$m" --clients 8 --turns 4 --max-tokens 32
        echo "== round $r $m: llama-server, 8 clients x 4 turns"; ll "$m" --clients 8 --turns 4 --max-tokens 32
        echo "== round $r $m: kvcache serve, 1 first turn alone"; kv "$m" --clients 1 --turns 1 --max-tokens 32
        echo "== round $r $m: kvcache serve, 8 first turns at once"; kv "$m" --clients 8 --turns 1 --max-tokens 32
    done
done
