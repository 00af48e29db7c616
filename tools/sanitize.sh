#!/usr/bin/env bash
# Build fastaccum._cy with gcc's AddressSanitizer + UBSan in a separate directory, run the test
# suite and the fuzz corpus against it (libasan preloaded, pymalloc off), then run a smaller subset
# under valgrind memcheck against a plain -O1 -g build. Never touches the in-place build.
#
#   tools/sanitize.sh                    # ASan/UBSan suite + corpus, then valgrind subset
#   tools/sanitize.sh --asan-only        # skip valgrind
#   tools/sanitize.sh --valgrind-only
#   tools/sanitize.sh --fuzz 60          # also fuzz the ASan build for 60 s
#   tools/sanitize.sh --corpus DIR ...   # also replay a grown fuzz corpus (e.g. from a long run)
#
# Environment: PYTHON (default: the interpreter on PATH), WORK (default: a fresh mktemp dir).
# Exit status is non-zero on any sanitizer report, valgrind error or test failure.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${WORK:-$(mktemp -d /tmp/fastaccum-sanitize.XXXXXX)}"
RUN_ASAN=1
RUN_VALGRIND=1
FUZZ_SECONDS=0
CORPORA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --asan-only) RUN_VALGRIND=0 ;;
        --valgrind-only) RUN_ASAN=0 ;;
        --fuzz) FUZZ_SECONDS="$2"; shift ;;
        --corpus) CORPORA+=("$2"); shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

# Build the extension from a copy of the sources (cythonize writes the .c next to each source) and
# assemble an importable package with setup.py's own build_py: fastaccum/, fastaccum/_py from
# python/, fastaccum/_cy from src_cython/ with the new .so files.
build() {  # build NAME CFLAGS LDFLAGS
    local name="$1" cflags="$2" ldflags="$3"
    local src="$WORK/$name/src" lib="$WORK/$name/lib"
    rm -rf "$WORK/$name"
    mkdir -p "$src" "$lib"
    cp -r "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/src_cython" "$ROOT/fastaccum" "$ROOT/python" "$src/"
    rm -f "$src"/src_cython/*.c "$src"/src_cython/*.so "$src"/python/*.c "$src"/python/*.so
    (cd "$src" && CFLAGS="$cflags" LDFLAGS="$ldflags" FASTACCUM_REQUIRE_EXTENSIONS=1 \
        "$PYTHON" setup.py -q build_py --build-lib "$lib" build_ext --build-lib "$lib" --build-temp "$WORK/$name/tmp" \
        >"$WORK/$name/build.log" 2>&1) || { cat "$WORK/$name/build.log"; exit 1; }
    echo "built $name: $(ls "$lib"/fastaccum/_cy/*.so | wc -l) modules in $lib/fastaccum/_cy"
}

# The tests import fastaccum from PYTHONPATH (ahead of the editable install); prove it.
check_import() {  # check_import LIB [env...]
    local lib="$1"; shift
    env "$@" PYTHONPATH="$lib" "$PYTHON" -P -c "
import fastaccum._cy, fastaccum._py, sys
assert fastaccum._cy.__file__.startswith('$lib'), fastaccum._cy.__file__
assert fastaccum._py.__file__.startswith('$lib'), fastaccum._py.__file__
print('using', fastaccum._cy.__file__)"
}

status=0
cd "$ROOT"

if [ "$RUN_ASAN" = 1 ]; then
    echo "== AddressSanitizer + UndefinedBehaviorSanitizer =="
    # -fno-wrapv undoes CPython's -fwrapv so UBSan checks signed overflow in our code too.
    build asan "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -fno-wrapv -g" \
        "-fsanitize=address,undefined"
    LIBASAN="$(gcc -print-file-name=libasan.so)"
    ASAN_ENV=(
        LD_PRELOAD="$LIBASAN"
        PYTHONMALLOC=malloc  # every object is a malloc block ASan can see, not a pymalloc arena slot
        # Reports go to files: pytest's output capture would swallow them when the process aborts.
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:log_path=$WORK/asan/report"
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$WORK/asan/report"
    )
    check_import "$WORK/asan/lib" "${ASAN_ENV[@]}"
    log="$WORK/asan/pytest.log"
    # The core's tests, the catalogue and the corpus; the client/emulator/slime/CLI tests exercise
    # the same core through aiohttp and torch, which would only slow this run down.
    set +e
    PYTEST="$(dirname "$(command -v "$PYTHON")")/pytest"
    env "${ASAN_ENV[@]}" PYTHONPATH="$WORK/asan/lib" "$PYTEST" -q -p no:cacheprovider -m "not slow" \
        tests/test_framing.py tests/test_malformed.py tests/test_modes.py tests/test_text.py tests/test_top_p.py \
        tests/test_routed_experts.py tests/test_echo_and_coalesce.py tests/test_differential.py tests/test_api.py \
        tests/test_bad_inputs.py tests/test_fuzz_corpus.py tests/test_streamed_base64.py \
        tests/test_scanner_equivalence.py tests/test_chunked.py -k "not python" >"$log" 2>&1
    rc=$?
    set -e
    tail -3 "$log"
    if compgen -G "$WORK/asan/report.*" >/dev/null; then
        cat "$WORK"/asan/report.* >>"$log"
        head -40 "$WORK"/asan/report.*
    fi
    if [ $rc -ne 0 ] || grep -q -E "ERROR: AddressSanitizer|runtime error:" "$log"; then
        echo "ASan/UBSan run FAILED (rc=$rc, log $log)"; grep -m5 -E "AddressSanitizer|runtime error" "$log" || true
        status=1
    fi
    for corpus in tests/fuzz_corpus "${CORPORA[@]}"; do
        out="$WORK/asan/replay-$(basename "$corpus").log"
        set +e
        env "${ASAN_ENV[@]}" PYTHONPATH="$WORK/asan/lib" "$PYTHON" tests/fuzz/fuzz_core.py --replay "$corpus" >"$out" 2>&1
        set -e
        tail -1 "$out"
        # Known core bugs fail the replay as Python exceptions; only a sanitizer report fails here.
        if grep -q -E "ERROR: AddressSanitizer|runtime error:|FAIL .*: NEW" "$out"; then
            echo "corpus replay under ASan FAILED ($out)"; status=1
        fi
    done
    if [ "$FUZZ_SECONDS" != 0 ]; then
        mkdir -p "$WORK/asan/fuzz-corpus" "$WORK/asan/artifacts"
        set +e
        env "${ASAN_ENV[@]}" PYTHONPATH="$WORK/asan/lib" "$PYTHON" tests/fuzz/fuzz_core.py \
            "$WORK/asan/fuzz-corpus" tests/fuzz_corpus -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=8192 \
            -max_len=65536 -artifact_prefix="$WORK/asan/artifacts/" -print_final_stats=1 >"$WORK/asan/fuzz.log" 2>&1
        rc=$?
        set -e
        grep -E "^stat::number_of_executed_units|^Done" "$WORK/asan/fuzz.log" || true
        if [ $rc -ne 0 ]; then echo "fuzzing under ASan FAILED ($WORK/asan/fuzz.log)"; status=1; fi
    fi
fi

if [ "$RUN_VALGRIND" = 1 ]; then
    echo "== valgrind memcheck =="
    build valgrind "-O1 -g" ""
    check_import "$WORK/valgrind/lib"
    log="$WORK/valgrind/memcheck.log"
    # A subset: valgrind is ~30x slower. Errors are counted only in frames of our extension
    # (CPython, numpy and orjson are not under test); definite leaks in _cy are errors too.
    set +e
    PYTHONMALLOC=malloc PYTHONPATH="$WORK/valgrind/lib" valgrind --tool=memcheck --error-exitcode=0 \
        --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite --num-callers=30 \
        --log-file="$log" "$PYTHON" tests/fuzz/fuzz_core.py --replay tests/fuzz_corpus >"$WORK/valgrind/replay.out" 2>&1
    PYTEST="$(dirname "$(command -v "$PYTHON")")/pytest"
    PYTHONMALLOC=malloc PYTHONPATH="$WORK/valgrind/lib" valgrind --tool=memcheck --error-exitcode=0 \
        --leak-check=no --num-callers=30 --log-file="$log.pytest" \
        "$PYTEST" -q -p no:cacheprovider -m "not slow" tests/test_bad_inputs.py tests/test_malformed.py \
        tests/test_framing.py -k "cython and not 32mib" >"$WORK/valgrind/pytest.out" 2>&1
    rc=$?
    set -e
    tail -1 "$WORK/valgrind/replay.out"
    tail -1 "$WORK/valgrind/pytest.out"
    ours=$("$PYTHON" - "$log" "$log.pytest" <<'EOF'
import re, sys
# One valgrind error record is a block of "==pid==" lines; count the ones that mention _cy.
count = 0
for path in sys.argv[1:]:
    text = open(path).read()
    for block in re.split(r"\n==\d+== \n", text):
        if ("Invalid" in block or "uninitialised" in block or "definitely lost" in block
                or "Mismatched" in block or "overlap" in block) and "_cy" in block:
            count += 1
            print(block[:3000], file=sys.stderr)
print(count)
EOF
)
    total=$(grep -h "ERROR SUMMARY" "$log" "$log.pytest" | tr '\n' ' ')
    echo "valgrind: $ours error records in fastaccum._cy frames (all frames: $total)"
    if [ $rc -ne 0 ] || [ "$ours" != 0 ]; then echo "valgrind FAILED (logs $log*)"; status=1; fi
fi

echo "logs and builds in $WORK"
exit $status
