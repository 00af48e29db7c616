#!/usr/bin/env bash
# The fast test set, against the fastaccum that PYTHON has installed: tests/ on both twins, without
# the slow tier (fuzzing and the sanitizer build are separate scripts). About 2.5 minutes on 2
# cores; `nox -s fast` passes `-n auto` (pytest-xdist) and takes 1.5.
#
#   tools/fast_tests.sh [--root DIR] [pytest args...]
#
# DIR holds tests/ and conftest.py: a checkout or an unpacked sdist (default: the tree this script
# is in). PYTHON (default python3) is the interpreter whose installed fastaccum is tested. The wheel
# recipe (tools/build_wheels.sh), tools/test.sh and cibuildwheel all run this selection.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ "${1:-}" = "--root" ]; then
    ROOT="$(cd "$2" && pwd)"
    shift 2
fi
PYTHON="${PYTHON:-python3}"
cd "$ROOT"
# -P keeps DIR off sys.path, so the tests import the installed package and never DIR/fastaccum/,
# which holds no compiled core.
exec "$PYTHON" -P -m pytest -m "not slow" -p no:cacheprovider -q tests "$@"
