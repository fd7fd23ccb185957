#!/bin/sh
# scripts/check-readme.sh [BUILD] - keeps README.md's commands working:
#  - its C examples must be examples/readme_generate.c and readme_decode.c, which
#    `make test` compiles and runs (the difference is printed when they drift apart);
#  - in its ```sh blocks, every `kvcache` command names a subcommand whose --help
#    lists each option the line uses (`kvcache price` lines run as they are, and
#    `kvcache --version`), every `make TARGET` names a target of the Makefile,
#    and every scripts/ file named exists.
# Needs BUILD/kvcache (default build/).
build=${1:-build}
kv=$build/kvcache
status=0
fail() { echo "check-readme: $*" >&2; status=1; }

# the first ```c block is examples/readme_generate.c, the second examples/readme_decode.c
awk '/^```c$/{n++; on=1; next} /^```$/{on=0} on && n == 1' README.md > "$build/readme_generate.c"
awk '/^```c$/{n++; on=1; next} /^```$/{on=0} on && n == 2' README.md > "$build/readme_example.c"
diff -u examples/readme_generate.c "$build/readme_generate.c" >&2 ||
    fail "README.md's first C example differs from examples/readme_generate.c"
diff -u examples/readme_decode.c "$build/readme_example.c" >&2 ||
    fail "README.md's second C example differs from examples/readme_decode.c"
[ "$(grep -c '^```c$' README.md)" = 2 ] || fail "README.md should have exactly two C examples"

# the ```sh lines, without their comments (no README command quotes a '#')
awk '/^```sh$/{on=1; next} /^```$/{on=0} on' README.md | sed -e 's/[[:space:]]#.*$//' -e 's/^#.*$//' \
    > "$build/readme_commands.txt"
[ -s "$build/readme_commands.txt" ] || fail "README.md has no \`\`\`sh block"
while IFS= read -r line; do
    [ -n "$line" ] || continue
    eval "set -- $line"
    case $1 in
    kvcache | build/kvcache)
        shift
        sub=$1
        [ "$sub" = bench ] && sub="bench $2" && shift
        [ "$sub" = --version ] && { "$kv" --version > /dev/null || fail "'$line' fails"; continue; }
        shift
        # shellcheck disable=SC2086  # "bench model" is two words
        help=$("$kv" $sub --help 2> /dev/null) || { fail "'$line': no subcommand '$sub'"; continue; }
        for a in "$@"; do
            case $a in
            --* | -[a-zA-Z]) printf '%s\n' "$help" | grep -q -e "$a\\b" || fail "'$line': $sub --help has no $a" ;;
            esac
        done
        if [ "$sub" = price ]; then
            # shellcheck disable=SC2086
            "$kv" $sub "$@" > /dev/null || fail "'$line' fails"
        fi
        ;;
    make)
        for t in $(printf '%s\n' "$@" | grep -v '='); do
            [ "$t" = make ] && continue
            grep -q "^$t:" Makefile || fail "'$line': the Makefile has no target $t"
        done
        ;;
    sh | python3) [ -f "$2" ] || fail "'$line': no file $2" ;;
    curl | \#*) ;;
    *) ;;
    esac
done < "$build/readme_commands.txt"
exit $status
