#!/bin/sh
# scripts/cluster.sh - N `kvcache serve` replicas on loopback behind HAProxy,
# which sends the requests of one conversation to the same replica, so that
# its prefix cache holds their common start (docs/SCALE.md).
#
#   scripts/cluster.sh N [--port P] [-- serve options...]
#
# Each replica takes a free port (--port 0) and prints its URL; HAProxy then
# listens on 127.0.0.1:P (8080 by default) and routes by a consistent hash of
#   1. the X-Session-Id header, when present;
#   2. else the body's "session" field;
#   3. else a chat's first two messages (the system prompt and the first turn),
#      which every later turn of that chat resends unchanged;
#   4. else the first KVCACHE_KEY_BYTES (256) bytes of the body (a completion's prompt).
# A replica failing /health is taken out; a request that finds its replica
# dead is retried on another. KVCACHE_BALANCE=roundrobin routes without the
# hash (for comparison). The script prints one line per replica
# ("replica I pid PID URL"), then "cluster http://127.0.0.1:P", and runs until
# SIGTERM or SIGINT, when it stops HAProxy and the replicas.
#
# Environment: KVCACHE_BIN (build/kvcache), KVCACHE_SERVE_MODEL (the
# project's SmolLM2), KVCACHE_CLUSTER_DIR (a new temporary folder, kept: haproxy.cfg
# and each process's log).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVCACHE_BIN:-$root/build/kvcache}
model=${KVCACHE_SERVE_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
balance=${KVCACHE_BALANCE:-hash}
key_bytes=${KVCACHE_KEY_BYTES:-256}

usage() { echo "usage: $0 N [--port P] [-- kvcache serve options...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
n=$1; shift
case $n in ''|*[!0-9]*) usage ;; esac
[ "$n" -ge 1 ] || usage
port=8080
while [ $# -gt 0 ]; do
    case $1 in
        --port) [ $# -ge 2 ] || usage; port=$2; shift 2 ;;
        --) shift; break ;;
        *) usage ;;
    esac
done
command -v haproxy >/dev/null || { echo "cluster: haproxy is missing (sh scripts/deps.sh)" >&2; exit 1; }
[ -x "$bin" ] || { echo "cluster: $bin is missing (make)" >&2; exit 1; }

dir=${KVCACHE_CLUSTER_DIR:-$(mktemp -d)}
mkdir -p "$dir"
pids=""
cleanup() {
    trap - EXIT INT TERM
    # shellcheck disable=SC2086  # one word per pid
    [ -z "$pids" ] || kill -TERM $pids 2>/dev/null || true
    for p in $pids; do wait "$p" 2>/dev/null || true; done
}
trap 'cleanup; exit 0' INT TERM
trap cleanup EXIT

servers=""
i=1
while [ "$i" -le "$n" ]; do
    : >"$dir/replica$i.out"   # there before the loop below reads it
    "$bin" serve -m "$model" --port 0 "$@" >>"$dir/replica$i.out" 2>"$dir/replica$i.log" &
    pid=$!
    pids="$pids $pid"
    url=""
    while [ -z "$url" ]; do  # the URL line comes once the model is loaded
        kill -0 "$pid" 2>/dev/null || { echo "cluster: replica $i exited:" >&2; cat "$dir/replica$i.log" >&2; exit 1; }
        url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$dir/replica$i.out" | head -n 1 || true)
        [ -n "$url" ] || sleep 0.1
    done
    echo "replica $i pid $pid $url"
    servers="$servers    server r$i ${url#http://}
"
    i=$((i + 1))
done

if [ "$balance" = hash ]; then
    route="    # the routing key, first found wins; a request with none is balanced round robin
    http-request set-var(txn.key) req.hdr(X-Session-Id) if { req.hdr(X-Session-Id) -m found }
    http-request set-var(txn.key) req.body,json_query('\$.session') if !{ var(txn.key) -m found }
    http-request set-var(txn.turn) req.body,json_query('\$.messages[1].content') if !{ var(txn.key) -m found }
    http-request set-var(txn.key) req.body,json_query('\$.messages[0].content'),concat(|,txn.turn) if !{ var(txn.key) -m found }
    http-request set-var(txn.key) req.body,bytes(0,$key_bytes) if !{ var(txn.key) -m found }
    balance hash var(txn.key)
    hash-type consistent"
else
    route="    balance $balance"
fi

cat >"$dir/haproxy.cfg" <<EOF
global
    maxconn 512
    # a whole request body in one buffer: the routing key reads it, and a
    # retry resends it (larger bodies pass, but are not retried after a reply began)
    tune.bufsize 262144

defaults
    mode http
    timeout connect 2s
    timeout client 600s
    timeout server 600s
    timeout queue 60s
    # a replica that refuses the connection, dies mid-request or answers 503
    # (loading, stopping): try again, on another replica each time
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response response-timeout 503

frontend kvcache
    bind 127.0.0.1:$port
    option http-buffer-request
    default_backend replicas

backend replicas
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 500ms fall 2 rise 2
$route
$servers
EOF

haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
pids="$pids $!"
hp=$!
# ready once the frontend answers: a replica passed its checks (2 x 500 ms);
# the others pass theirs at the same pace
tries=0
until curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    kill -0 "$hp" 2>/dev/null || { echo "cluster: haproxy exited:" >&2; cat "$dir/haproxy.log" >&2; exit 1; }
    tries=$((tries + 1))
    [ "$tries" -le 100 ] || { echo "cluster: haproxy does not answer on port $port" >&2; exit 1; }
    sleep 0.1
done
echo "cluster http://127.0.0.1:$port"
while :; do sleep 1 & wait $! || true; done
