"""What a rollout's generate calls did, counted for its log line and the framework's rollout
metrics: how each call ended (finished, drained, cut, a drain that fell back to a cut and why,
ended by the server), retries, replay-complete results, and the timing's first-token times and
gaps."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import numpy as np

from fastaccum.result import StreamResult

__all__ = ("CallStats", "RolloutStats", "METRIC_PREFIX")

# The framework's metrics take these under one prefix, beside its own "rollout/" and "perf/".
METRIC_PREFIX = "fastaccum/"


class CallStats:
    """The counts of one rollout (or what ran since the last was taken)."""

    def __init__(self) -> None:
        self.calls = 0  # generate calls committed
        self.finished = 0  # ended by their own finish (stop, length)
        self.drained = 0  # aborted by fastaccum or the framework, the terminal abort event read
        self.cut = 0  # aborted, the prefix only (no terminal event)
        self.server_aborted = 0  # ended by the server's abort (server-wide abort, a pause)
        self.fallbacks: Counter[str] = Counter()  # drains that fell back to a cut, by reason
        self.fallback_examples: dict[str, str] = {}  # the first message of each reason
        self.retries = 0
        self.replay_complete = 0
        self.first_token_s: list[float] = []
        self.gap_p50_s: list[float] = []
        self.gap_p99_s: list[float] = []
        self.gap_max_s = 0.0

    def record(self, result: StreamResult, *, abort_error: BaseException | None, retries: int) -> None:
        self.calls += 1
        kind = (result.finish_reason or {}).get("type")
        if result.aborted:
            if result.finished:
                self.drained += 1
            else:
                self.cut += 1
        elif kind == "abort":
            self.server_aborted += 1
        elif result.finished:
            self.finished += 1
        if abort_error is not None:
            reason = type(abort_error).__name__
            self.fallbacks[reason] += 1
            self.fallback_examples.setdefault(reason, str(abort_error))
        timing = result.timing
        self.retries += retries if timing is None else max(retries, timing.retries)
        self.replay_complete += result.replay_complete
        if timing is not None:
            if timing.first_token_s is not None:
                self.first_token_s.append(timing.first_token_s)
            if timing.gap_p50_s is not None and timing.gap_p99_s is not None:
                self.gap_p50_s.append(timing.gap_p50_s)
                self.gap_p99_s.append(timing.gap_p99_s)
            if timing.gap_max_s is not None:
                self.gap_max_s = max(self.gap_max_s, timing.gap_max_s)

    @property
    def quiet(self) -> bool:
        """Nothing went wrong: no drain fell back and nothing was retried."""
        return not self.fallbacks and not self.retries

    def summary(self) -> str:
        """One line for the log."""
        aborted = self.drained + self.cut
        line = (
            f"{self.calls} calls: {self.finished} finished, {aborted} aborted ({self.drained} drained, "
            f"{self.cut} cut), {self.server_aborted} ended by the server, {self.replay_complete} "
            f"replay-complete, {self.retries} retries"
        )
        if self.fallbacks:
            reasons = "; ".join(
                f"{count} {reason} (first: {self.fallback_examples[reason]})"
                for reason, count in self.fallbacks.items()
            )
            line += f"; drains that fell back to a cut: {reasons}"
        if self.first_token_s:
            p50, p99 = np.percentile(self.first_token_s, [50, 99])
            line += f"; first token p50 {p50:.3f} s, p99 {p99:.3f} s"
        return line

    def metrics(self) -> dict[str, Any]:
        """The framework's rollout metrics: counts, the replay-complete share, first-token time
        percentiles over the calls, and gaps: the median of the calls' median gaps, the 99th
        percentile of their 99th-percentile gaps (a straggler's), the longest gap."""
        out: dict[str, Any] = {
            "calls": self.calls,
            "finished": self.finished,
            "aborted_drained": self.drained,
            "aborted_cut": self.cut,
            "server_aborted": self.server_aborted,
            "drain_fallbacks": sum(self.fallbacks.values()),
            "retries": self.retries,
            "replay_complete": self.replay_complete,
            "replay_complete_ratio": self.replay_complete / self.calls if self.calls else 1.0,
        }
        for reason, count in self.fallbacks.items():
            out[f"drain_fallbacks/{reason}"] = count
        if self.first_token_s:
            p50, p99 = np.percentile(self.first_token_s, [50, 99])
            out["ttft_p50_s"], out["ttft_p99_s"] = float(p50), float(p99)
        if self.gap_p50_s:
            out["gap_p50_s"] = float(np.median(self.gap_p50_s))
            out["gap_p99_s"] = float(np.percentile(self.gap_p99_s, 99))
            out["gap_max_s"] = self.gap_max_s
        return {METRIC_PREFIX + key: value for key, value in out.items()}


class RolloutStats:
    """One adapter's counts, for every loop of the process: calls record into the running counts;
    a rollout that fastaccum's rollout function ran is closed under its id, for the rollout
    log function to take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # calls of several loops (fully-async) record at once
        self._running = CallStats()
        self._closed: dict[int, CallStats] = {}

    def record(self, result: StreamResult, *, abort_error: BaseException | None, retries: int) -> None:
        with self._lock:
            self._running.record(result, abort_error=abort_error, retries=retries)

    def close(self, rollout_id: int | None = None) -> CallStats:
        """The counts since the last close, kept under ``rollout_id`` (None: handed out only)."""
        with self._lock:
            closed, self._running = self._running, CallStats()
            if rollout_id is not None:
                self._closed = {rollout_id: closed}  # only the newest is ever asked for
            return closed

    def take(self, rollout_id: int) -> CallStats:
        """The counts of rollout ``rollout_id`` when fastaccum's rollout function closed it, else
        everything recorded since the last close."""
        with self._lock:
            closed = self._closed.pop(rollout_id, None)
        return closed if closed is not None else self.close()
