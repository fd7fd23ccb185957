#!/bin/sh
# scripts/deps.sh - the Debian packages the build and the tests need, in one
# place for `make test`, `.ci/run` and a newcomer alike.
#
#   sh scripts/deps.sh            check; install what is missing when it can
#   sh scripts/deps.sh --list     print the package names, one a line
#
# A package missing is installed with apt-get when this runs as root and apt-get
# exists (`apt-get update` first only when apt does not know a package);
# otherwise the script prints the exact command to run and fails. On a system
# without dpkg it says which packages it would want and fails, unless
# KVCACHE_DEPS=skip (you installed the equivalents yourself).
#
# Python packages (numpy, pytest, openai) are not here: `make test` puts them
# into a virtual environment under build/ (see the Makefile, python/requirements-test.txt).
set -eu

# package          why
PACKAGES="
gcc                the library, engine and command
libc6-dev          C headers
make               the build
binutils           nm: the exported-symbol test
pkg-config         make test-install
clang              make test-asan, test-threads, fuzz
libclang-rt-14-dev clang's sanitizer and libFuzzer runtimes
python3            the binding's tests, scripts
python3-venv       the tests' virtual environment (build/venv)
python3-pip        scripts/fetch-model.sh downloads the model with pip
groff-base         the man page test renders docs/kvcache.1
curl               the server tests talk HTTP with it
libcivetweb-dev    the server's HTTP layer
libjansson-dev     the server's JSON
libedit-dev        chat's line editing and history on a terminal (the kvcache binary only)
haproxy            scripts/cluster.sh: the load balancer in front of replicas (tests/server/test_cluster.py)
libzmq3-dev        kvcache serve --kv-events: the ZeroMQ PUB socket (the kvcache binary only)
"

names=$(printf '%s\n' "$PACKAGES" | awk 'NF { print $1 }')
if [ "${1:-}" = "--list" ]; then
    printf '%s\n' "$names"
    exit 0
fi
[ "${KVCACHE_DEPS:-}" = skip ] && exit 0

if ! command -v dpkg-query >/dev/null 2>&1; then
    # shellcheck disable=SC2086  # one line of names
    echo "deps: not a Debian system (no dpkg-query). Install the equivalents of:" $names >&2
    echo "deps: then run with KVCACHE_DEPS=skip" >&2
    exit 1
fi

missing=""
for p in $names; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case $status in *"install ok installed"*) ;; *) missing="$missing $p" ;; esac
done
[ -z "$missing" ] && exit 0

cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: missing Debian packages:$missing" >&2
    echo "deps: install them with:  sudo $cmd" >&2
    exit 1
fi
echo "deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
known=yes
for p in $missing; do
    apt-cache show "$p" >/dev/null 2>&1 || known=no
done
[ $known = yes ] || apt-get update -qq
# shellcheck disable=SC2086  # one word per package
apt-get install -y -qq --no-install-recommends $missing >/dev/null || {
    echo "deps: '$cmd' failed" >&2
    exit 1
}
