"""Charts of a stress.py report (benchmarks/README.md, "Stress runs"): PNGs under benchmarks/results/.

    pip install matplotlib
    python benchmarks/plot.py [benchmarks/results/stress.json] [--outdir benchmarks/results]

- ``scaling.png``: time against tokens, log-log, one line per consumer, cumulative and incremental;
  below, the same data as microseconds per token (flat = linear time).
- ``experts_memory.png``: routed experts 48 x top-8 at 16k/64k/256k context: peak RSS growth
  (solid) and tracemalloc peak (dashed) against the decoded payload, with the 1.2x and 3.0x target
  lines, and each consumer's time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
STYLE = {  # consumer -> (label, color, marker)
    "compiled": ("fastaccum compiled", "#1f77b4", "o"),
    "pure": ("fastaccum pure twin", "#17becf", "s"),
    "floor": ("orjson floor (parse only)", "#7f7f7f", "^"),
    "naive": ("naive (json.loads, lists)", "#d62728", "v"),
    "rebuild": ("naive + per-event rebuild (slime example)", "#ff7f0e", "D"),
}


def _plain_ticks(ax: Any) -> None:
    """Log axes labelled 2,000 / 0.5 instead of 2x10^3 / 5x10^-1."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _subtitle(report: dict[str, Any]) -> str:
    m = report["machine"]
    commit = (m.get("git_commit") or "?")[:7] + ("+dirty" if m.get("git_dirty") else "")
    return f"{m['date'][:10]}, {m['cpu']} x{m['cpu_count']}, {m['python']}, fastaccum {commit}"


def plot_scaling(report: dict[str, Any], path: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9), sharex="col")
    for col, mode in enumerate(("cumulative", "incremental")):
        data = report["scaling"][mode]
        sizes = data["sizes"]
        top, bottom = axes[0][col], axes[1][col]
        for name, (label, color, marker) in STYLE.items():
            entry = data["consumers"].get(name)
            if not entry:
                continue
            pts = [(n, t) for n, t in zip(sizes, entry["seconds"]) if t]
            if not pts:
                continue
            xs, ts = zip(*pts)
            top.plot(xs, ts, marker=marker, color=color, label=label)
            bottom.plot(xs, [t / n * 1e6 for n, t in pts], marker=marker, color=color, label=label)
        # guides: a line with slope 1 (linear) and 2 (quadratic) through the compiled twin's first point
        first = data["consumers"]["compiled"]["seconds"][0]
        for slope, style in ((1, ":"), (2, "--")):
            top.plot(
                [sizes[0], sizes[-1]],
                [first, first * (sizes[-1] / sizes[0]) ** slope],
                style,
                color="#bbbbbb",
                linewidth=1,
                label=f"slope {slope} ({'linear' if slope == 1 else 'quadratic'})",
            )
        shape = "W2 shape: logprobs + text" if mode == "cumulative" else "W1 shape: logprobs, no text"
        top.set_title(f"{mode}, interval {data['interval']} ({shape})")
        top.set_ylabel("time per stream (s)")
        bottom.set_ylabel("time per token (µs)")
        bottom.set_xlabel("tokens in the stream")
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            _plain_ticks(ax)
        top.legend(fontsize=8, loc="upper left")
    if "cumulative" in report["scaling"]:
        c = report["scaling"]["cumulative"]
        axes[1][0].annotate(
            f"stream bytes grow as N²: {c['stream_bytes'][0] / 1e6:.1f} MB at {c['sizes'][0]:,} "
            f"tokens, {c['stream_bytes'][-1] / 1e6:,.0f} MB at {c['sizes'][-1]:,}",
            xy=(0.02, 0.02),
            xycoords="axes fraction",
            fontsize=8,
        )
    fig.suptitle(f"Scaling: time against tokens (best of runs)\n{_subtitle(report)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_experts(report: dict[str, Any], path: str) -> None:
    import matplotlib.pyplot as plt

    rows = report["experts"]["contexts"]
    payload = [r["routed_bytes"] / 1e6 for r in rows]
    fig, (mem, tim) = plt.subplots(1, 2, figsize=(12, 7))
    for name, (label, color, marker) in STYLE.items():
        pts = [
            (p, r["consumers"][name])
            for p, r in zip(payload, rows)
            if name in r["consumers"] and "error" not in r["consumers"][name]
        ]
        if not pts:
            continue
        xs = [p for p, _ in pts]
        mem.plot(
            xs,
            [m["rss_growth_bytes"] / 1e6 for _, m in pts],
            marker=marker,
            color=color,
            label=f"{label}: peak RSS growth",
        )
        mem.plot(
            xs,
            [m["tracemalloc_peak_bytes"] / 1e6 for _, m in pts],
            marker=marker,
            color=color,
            linestyle="--",
            alpha=0.6,
            label=f"{label}: tracemalloc peak",
        )
        tim.plot(xs, [m["seconds"] for _, m in pts], marker=marker, color=color, label=label)
    for factor, style in ((1.0, "-"), (1.2, ":"), (3.0, "--")):
        mem.plot(
            [payload[0], payload[-1]],
            [payload[0] * factor, payload[-1] * factor],
            style,
            color="#999999",
            linewidth=1,
            label=f"{factor:g}x decoded payload"
            + (" (target)" if factor == 3.0 else " (fast-path target)" if factor == 1.2 else ""),
        )
    for r, p in zip(rows, payload):
        mem.annotate(
            f"{r['context'] // 1000}k ctx",
            xy=(p, p),
            xytext=(0, -14),
            textcoords="offset points",
            fontsize=8,
            ha="center",
            color="#555555",
        )
    mem.set_title("peak memory beyond the input pieces (fresh process per consumer)")
    mem.set_ylabel("MB")
    tim.set_title("time of the same run (first touch of fresh memory included)")
    tim.set_ylabel("seconds")
    for ax in (mem, tim):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("decoded routed experts (MB)")
        ax.grid(True, which="both", alpha=0.3)
        _plain_ticks(ax)
    mem.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    tim.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Routed experts 48 x top-8 (incremental, interval 20, text, top-p)\n{_subtitle(report)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default=os.path.join(HERE, "results", "stress.json"))
    parser.add_argument("--outdir", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    with open(args.report, "rb") as f:
        report = orjson.loads(f.read())
    os.makedirs(args.outdir, exist_ok=True)
    if "scaling" in report:
        plot_scaling(report, os.path.join(args.outdir, "scaling.png"))
        print(f"wrote {os.path.join(args.outdir, 'scaling.png')}")
    if "experts" in report:
        plot_experts(report, os.path.join(args.outdir, "experts_memory.png"))
        print(f"wrote {os.path.join(args.outdir, 'experts_memory.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
