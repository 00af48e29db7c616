"""Regression tracking: compare a fresh benchmark run's RATIOS with the baseline.

    python benchmarks/regress.py                    # run the suite timed, compare, exit 1 on a regression
    python benchmarks/regress.py --from run.json    # compare an existing `pytest --benchmark-json` file
    python benchmarks/regress.py --stress s.json    # also compare stress.py's target ratios
    python benchmarks/regress.py --refresh [--stress s.json]   # re-measure and rewrite the baseline

Only ratios are stored and compared, never times: each pytest case (bench_suite.py and
bench_core.py) reports ``impl_over_floor`` (twin time / orjson floor; lower is better) and
``naive_over_impl`` (naive consumer / twin; higher is better), all three timed in the same run, so
the ratios carry across machines far better than times. A ratio *regresses* when the twin got
relatively slower by more than ``--threshold`` (15%): ``fresh > 1.15 x baseline`` for a
lower-is-better ratio, ``fresh < baseline / 1.15`` for a higher-is-better one.

Noise: the baseline is the median of ``--runs`` (3) full runs; a case that regresses in a fresh run
is re-measured up to ``--retries`` (4) times and its best ratio kept, so a regression has to show
up in every attempt. ``--noise-aware`` also tolerates, per ratio, the spread the baseline's own
runs showed (for noisy shared machines; the default is the plain threshold). See benchmarks/README.md,
"Regression tracking".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BASELINE = os.path.join(HERE, "results", "baseline.json")
SUITE = ["benchmarks/bench_suite.py", "benchmarks/bench_core.py"]
# ratio name -> "lower" | "higher": which direction is better
RATIOS = {"impl_over_floor": "lower", "naive_over_impl": "higher"}

Ratios = dict[str, dict[str, float]]  # case (pytest node id) -> ratio name -> value


def run_pytest(node_ids: Sequence[str], extra: Sequence[str] = ()) -> Ratios:
    """One timed pytest-benchmark run of ``node_ids``; the ratios of every case."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [
            sys.executable,
            "-P",  # run from the repository root: the source tree must not shadow the installed package
            "-m",
            "pytest",
            *node_ids,
            f"--benchmark-json={out}",
            "-q",
            "-p",
            "no:cacheprovider",
            *extra,
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit(f"benchmark run failed (exit {proc.returncode}): {' '.join(cmd)}")
        return read_pytest_json(out)


def read_pytest_json(path: str) -> Ratios:
    with open(path, "rb") as f:
        data = orjson.loads(f.read())
    ratios: Ratios = {}
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        values = {name: float(info[name]) for name in RATIOS if name in info}
        if values:
            ratios[bench["fullname"]] = values
    return ratios


def stress_ratios(path: str) -> dict[str, dict[str, Any]]:
    """The targeted ratios of a stress.py report (rows whose target applies to fastaccum)."""
    with open(path, "rb") as f:
        rows = orjson.loads(f.read()).get("targets", [])
    return {
        row["ratio"]: {"value": row["value"], "better": "higher" if row["target"].startswith(">=") else "lower"}
        for row in rows
        if row["met"] is not None and row["value"] is not None
    }


def slowdown(fresh: float, base: float, better: str) -> float:
    """How much relatively slower fastaccum got: > 1 is worse (1.2 = 20% worse)."""
    return fresh / base if better == "lower" else base / fresh


def merge_best(into: Ratios, more: Ratios) -> None:
    for case, values in more.items():
        have = into.setdefault(case, {})
        for name, value in values.items():
            pick = min if RATIOS[name] == "lower" else max
            have[name] = pick(have[name], value) if name in have else value


def compare(
    base: Ratios, fresh: Ratios, threshold: float, spread: dict[str, dict[str, float]] | None = None
) -> tuple[list[tuple[str, str, float, float, float]], list[str]]:
    """(regressions as (case, ratio, baseline, fresh, slowdown), cases missing from the fresh run).

    With ``spread`` (--noise-aware), a ratio's tolerance is the larger of the threshold and the
    run-to-run spread its baseline runs showed."""
    bad, missing = [], []
    for case, values in base.items():
        if case not in fresh:
            missing.append(case)
            continue
        for name, b in values.items():
            f = fresh[case].get(name)
            limit = max(1 + threshold, (spread or {}).get(case, {}).get(name, 0.0))
            if f is not None and slowdown(f, b, RATIOS[name]) > limit:
                bad.append((case, name, b, f, slowdown(f, b, RATIOS[name])))
    return bad, missing


def machine() -> dict[str, Any]:
    sys.path.insert(0, HERE)
    import bench_core

    return bench_core.machine_info()


def refresh(args: argparse.Namespace) -> int:
    old: dict[str, Any] = {}
    if os.path.exists(args.baseline):
        with open(args.baseline, "rb") as f:
            old = orjson.loads(f.read())
    runs = []
    for k in range(args.runs):
        print(f"run {k + 1}/{args.runs} ...", flush=True)
        runs.append(run_pytest(SUITE))
    if not runs:  # --runs 0: keep the pytest ratios, update only the stress section
        if not old or not args.stress:
            raise SystemExit("--runs 0 needs an existing baseline and --stress")
        old["stress"] = stress_ratios(args.stress)
        with open(args.baseline, "wb") as f:
            f.write(orjson.dumps(old, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
        print(f"updated the stress ratios in {args.baseline}")
        return 0
    cases = sorted(set().union(*runs))
    median = {
        case: {
            name: statistics.median(r[case][name] for r in runs if case in r and name in r[case])
            for name in RATIOS
            if any(case in r and name in r[case] for r in runs)
        }
        for case in cases
    }
    # max/min of each ratio over the runs: how noisy that case was while the baseline was taken
    spreads = {
        c: {n: max(r[c][n] for r in runs) / min(r[c][n] for r in runs) for n in median[c]}
        for c in cases
        if all(c in r for r in runs)
    }
    spread = max((v for s in spreads.values() for v in s.values()), default=1.0)
    baseline = {
        "about": "Ratios only (see benchmarks/README.md, Regression tracking). Refresh: "
        "python benchmarks/regress.py --refresh [--stress benchmarks/results/stress.json]",
        "machine": machine(),
        "runs": args.runs,
        "threshold": args.threshold,
        "largest_run_to_run_spread": spread,
        "ratios": median,
        "run_to_run_spread": spreads,
        "stress": stress_ratios(args.stress) if args.stress else old.get("stress", {}),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.baseline)), exist_ok=True)
    with open(args.baseline, "wb") as f:
        f.write(orjson.dumps(baseline, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    noisy = sorted(((v, c, n) for c, s in spreads.items() for n, v in s.items()), reverse=True)[:3]
    print(f"wrote {args.baseline}: {len(median)} cases, median of {args.runs} runs; largest run-to-run spreads:")
    for v, c, n in noisy:
        print(f"  {v:.2f}x  {c} {n}")
    return 0


def check(args: argparse.Namespace) -> int:
    with open(args.baseline, "rb") as f:
        baseline = orjson.loads(f.read())
    base: Ratios = baseline["ratios"]
    fresh = read_pytest_json(args.from_json) if args.from_json else run_pytest(SUITE)
    spread = baseline.get("run_to_run_spread") if args.noise_aware else None
    bad, missing = compare(base, fresh, args.threshold, spread)
    for attempt in range(args.retries if not args.from_json else 0):
        if not bad:
            break
        cases = sorted({case for case, *_ in bad})
        print(f"retry {attempt + 1}/{args.retries}: re-measuring {len(cases)} case(s) that regressed", flush=True)
        merge_best(fresh, run_pytest(cases))
        bad, missing = compare(base, fresh, args.threshold, spread)
    worst = sorted(
        (
            (slowdown(f[n], base[c][n], RATIOS[n]), c, n)
            for c, f in fresh.items()
            if c in base
            for n in f
            if n in base[c]
        ),
        reverse=True,
    )
    print(
        f"{len(fresh)} cases compared with {os.path.relpath(args.baseline, REPO)} "
        f"(baseline from {baseline.get('machine', {}).get('date', '?')}); threshold {args.threshold:.0%}"
    )
    if worst:
        print(
            f"  median slowdown {statistics.median(w[0] for w in worst):.3f}, worst {worst[0][0]:.3f} "
            f"({worst[0][1]} {worst[0][2]}), best {worst[-1][0]:.3f}"
        )
    failed = bool(bad)
    for case, name, was, now, worse in bad:
        print(f"  REGRESSED {case} {name}: {was:.4g} -> {now:.4g} ({worse - 1:+.0%})")
    for case in missing:
        print(f"  missing from the fresh run: {case}")
    new = sorted(set(fresh) - set(base))
    if new:
        print(f"  {len(new)} case(s) not in the baseline (refresh to track them)")
    if args.stress:
        fresh_s, base_s = stress_ratios(args.stress), baseline.get("stress", {})
        for name, then in base_s.items():
            current = fresh_s.get(name)
            if current is None:
                print(f"  stress ratio missing from {args.stress}: {name}")
                continue
            worse = slowdown(current["value"], then["value"], then["better"])
            flag = "REGRESSED" if worse > 1 + args.threshold else "ok"
            failed |= flag == "REGRESSED"
            print(f"  {flag:<9} stress {name}: {then['value']:.4g} -> {current['value']:.4g} ({worse - 1:+.0%})")
    print("FAIL" if failed else "OK")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--from", dest="from_json", metavar="JSON", help="a pytest --benchmark-json file; no run")
    parser.add_argument("--stress", metavar="JSON", help="a stress.py report: compare (or store) its target ratios")
    parser.add_argument("--threshold", type=float, default=0.15)
    parser.add_argument(
        "--retries", type=int, default=4, help="re-measure regressed cases up to N times, keep the best"
    )
    parser.add_argument(
        "--noise-aware",
        action="store_true",
        help="tolerate, per ratio, the run-to-run spread recorded in the baseline if above the threshold",
    )
    parser.add_argument("--refresh", action="store_true", help="measure and rewrite the baseline")
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="--refresh: full runs, the median is stored (0: only store --stress's ratios)",
    )
    args = parser.parse_args(argv)
    return refresh(args) if args.refresh else check(args)


if __name__ == "__main__":
    sys.exit(main())
