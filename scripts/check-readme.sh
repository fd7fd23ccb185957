#!/bin/sh
# The README's C example must be examples/readme_decode.c, which `make test`
# compiles and runs: print the difference and fail when they drift apart.
awk '/^```c$/{on=1; next} /^```$/{on=0} on' README.md > "${1:-build}/readme_example.c"
diff -u examples/readme_decode.c "${1:-build}/readme_example.c" >&2 || {
    echo "README.md's C example differs from examples/readme_decode.c" >&2
    exit 1
}
