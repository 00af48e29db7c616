#!/usr/bin/env bash
# Compile each C header of the compiled twin (src_cython/*.h) on its own, warnings as errors: once
# as the extension sees it (_GNU_SOURCE, which Python.h defines) and once without, so the guards
# for GNU-only functions are exercised both ways; clang-format, where installed, must leave them as
# they are (.clang-format). CROSS_CC (e.g. aarch64-linux-gnu-gcc) adds a
# pass with that compiler, where the x86-only kernel must drop out cleanly.
#
#   tools/check_headers.sh              # CC (default gcc)
#   CROSS_CC=aarch64-linux-gnu-gcc tools/check_headers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
compilers=("${CC:-gcc}")
if [ -n "${CROSS_CC:-}" ]; then compilers+=("$CROSS_CC"); fi
status=0
for cc in "${compilers[@]}"; do
    for header in src_cython/*.h; do
        for defines in "-D_GNU_SOURCE" ""; do
            # shellcheck disable=SC2086  # $defines is one flag or none
            if ! printf '#include "%s"\n' "$(basename "$header")" \
                | "$cc" -x c -std=gnu11 -Wall -Wextra -Werror -fsyntax-only $defines -Isrc_cython -; then
                echo "FAILED: $cc $defines $header" >&2
                status=1
            fi
        done
    done
    echo "$cc: $(ls src_cython/*.h | wc -l) headers compile cleanly with -Wall -Wextra -Werror"
done
if command -v clang-format >/dev/null; then
    if clang-format --dry-run --Werror src_cython/*.h; then
        echo "clang-format: headers formatted"
    else
        status=1
    fi
fi
exit $status
