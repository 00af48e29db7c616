#!/usr/bin/env bash
# Bounded fuzzing run for CI or a release check: tests/fuzz/run_fuzz.sh [SECONDS] [extra libFuzzer flags]
#
# New inputs go to a scratch directory (the committed seed corpus is read, never written); a crash
# leaves its input in $FUZZ_WORK/artifacts and fails the run. Needs `pip install atheris`.
#   tests/fuzz/run_fuzz.sh 60                    # CI: one minute
#   tests/fuzz/run_fuzz.sh 3600 -jobs=2 -workers=2   # before a release
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SECONDS_TO_RUN="${1:-60}"
shift || true
PYTHON="${PYTHON:-python3}"
FUZZ_WORK="${FUZZ_WORK:-$(mktemp -d /tmp/fastaccum-fuzz.XXXXXX)}"
mkdir -p "$FUZZ_WORK/corpus" "$FUZZ_WORK/artifacts"
cd "$ROOT"
set +e
"$PYTHON" tests/fuzz/fuzz_core.py "$FUZZ_WORK/corpus" tests/fuzz_corpus \
    -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=4096 -max_len=65536 -timeout=30 \
    -artifact_prefix="$FUZZ_WORK/artifacts/" -print_final_stats=1 "$@" >"$FUZZ_WORK/fuzz.log" 2>&1
rc=$?
set -e
grep -E "^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added)" "$FUZZ_WORK/fuzz.log" || true
grep -E "^#known" "$FUZZ_WORK/fuzz.log" | sed -E 's/^#known x[0-9]+ ([^:]+):.*/\1/' | sort | uniq -c || true
if [ $rc -ne 0 ]; then
    echo "fuzzing FAILED (rc=$rc): see $FUZZ_WORK/fuzz.log and $FUZZ_WORK/artifacts/"
    tail -40 "$FUZZ_WORK/fuzz.log"
    exit 1
fi
echo "fuzzing clean; grown corpus in $FUZZ_WORK/corpus"
