#!/usr/bin/env bash
# Run a command beside a CPU hog: one busy process per core but one (on 2 cores: one), as a shared CI
# machine or another job would load it. The suite must pass this way (docs/reliability.md); timed
# asserts would not, which is why the tests have none.
#
#   tools/busy.sh COMMAND [ARGS...]        e.g. tools/busy.sh tools/fast_tests.sh
#
# FASTACCUM_HOGS overrides the number of busy processes. Every hog is stopped when the command ends.
set -euo pipefail
cores=$(nproc)
hogs="${FASTACCUM_HOGS:-$(( cores > 1 ? cores - 1 : 1 ))}"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq "$hogs"); do
    python3 -c 'while True: pass' &
    pids+=($!)
done
echo "busy.sh: $hogs CPU-bound process(es) beside: $*" >&2
"$@"
