#!/usr/bin/env bash
# The whole test run, on a clean checkout: a fresh venv, the package built with its compiled core
# required, mypy, the tests of both twins, the slow tier, the Ray shard tier, the live tiers against
# real vLLM and SGLang servers on the CPU, the benchmarks once (so they cannot rot), a minute of
# fuzzing, the suite of the core under AddressSanitizer + UBSan, and then what users install: the
# sdist and its wheels for CPython 3.11 and 3.12, each tested in a fresh venv with the sdist's fast
# tests (tools/build_wheels.sh). `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
export FASTACCUM_REQUIRE_EXTENSIONS=1  # the build fails, and the import refuses to fall back
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet ${FASTACCUM_TORCH_WHEELS:+--find-links "$FASTACCUM_TORCH_WHEELS"} \
    -c .ci/constraints.txt '.[test]' torch  # the pinned CPU build, a local wheel (.ci/constraints.txt)
.venv/bin/python -P -c 'import fastaccum; assert fastaccum.IMPLEMENTATION == "cython"; print("fastaccum", fastaccum.__version__, fastaccum.IMPLEMENTATION)'
.venv/bin/fastaccum demo  # the README's first command, as a newcomer runs it
.venv/bin/mypy -p fastaccum  # strict (pyproject.toml); fastaccum/_py links the pure twin
.venv/bin/ruff check . && .venv/bin/ruff format --check .
.venv/bin/pytest
# The slow tier: 512 streams x 10 rounds of load and faults per twin and transport, and a 1 GiB
# routed-experts line (about 2 minutes).
.venv/bin/pytest -p no:cacheprovider -m slow tests/test_load_faults.py tests/test_bad_inputs.py
# The Ray shard tier (fastaccum.ray, and the slime adapter's scenarios on shards): a local Ray on 2 CPUs.
.venv/bin/pytest -p no:cacheprovider tests/shards --ray
# The live tiers: real vLLM 0.32 and SGLang 0.5.23 on the CPU, one engine at a time, each server on
# one core; their venvs are installed on first use and cached outside the checkout (docs/live.md).
.venv/bin/pytest -p no:cacheprovider tests/live --live vllm
.venv/bin/pytest -p no:cacheprovider tests/live --live sglang
.venv/bin/pytest benchmarks --benchmark-disable
PYTHON="$PWD/.venv/bin/python" tests/fuzz/run_fuzz.sh 60
PYTHON="$PWD/.venv/bin/python" tools/sanitize.sh --asan-only
tools/build_wheels.sh --python 3.11,3.12
