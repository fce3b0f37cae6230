"""The load test's statistics: what one step's requests add up to.

Per-request measures (TPOT, the goodput test against the SLOs), the percentiles a step reports
(linear interpolation, as vllm bench serve), the bounded reservoirs they are taken from, the
in-flight count with its time-weighted mean, and StepStats, which a step (loadtest.py) feeds with
every request's Outcome. Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

# Percentiles come from a uniform reservoir of this many requests (and token gaps) per step; above it
# they are estimates with a relative rank error of about 1/sqrt(size). Counts, tokens and goodput
# are exact counters whatever the step's size.
MAX_RECORDED_REQUESTS = 20_000
MAX_RECORDED_GAPS = 200_000


class Outcome(Protocol):
    """What one request returns (exporter/probe/client.py's CompletionTiming has these fields), as
    the statistics read it.
    Read-only properties: the outcomes are frozen (a NamedTuple, a frozen dataclass)."""

    @property
    def ok(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def status(self) -> int | None: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def itl_s(self) -> Sequence[float]: ...
    @property
    def e2e_s(self) -> float | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) with linear interpolation between closest ranks (numpy's default,
    what vllm bench serve reports); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class Percentiles(NamedTuple):
    count: int  # type: ignore[assignment]  # hides tuple.count, which is never called
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": rounded(self.mean), "p50": rounded(self.p50), "p95": rounded(self.p95),
                "p99": rounded(self.p99)}


def summarize(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles(0, None, None, None, None)
    ordered = sorted(values)
    return Percentiles(len(ordered), sum(ordered) / len(ordered), percentile(ordered, 0.5),
                       percentile(ordered, 0.95), percentile(ordered, 0.99))


def tpot(ttft_s: float | None, e2e_s: float | None, completion_tokens: int | None) -> float | None:
    """Time per output token after the first: (e2e - ttft) / (tokens - 1); None with under 2 tokens."""
    if ttft_s is None or e2e_s is None or completion_tokens is None or completion_tokens < 2:
        return None
    return max(0.0, e2e_s - ttft_s) / (completion_tokens - 1)


def meets_slo(ttft_s: float | None, tpot_s: float | None, ttft_slo_s: float, tbt_slo_s: float) -> bool:
    """Goodput's test for one request, as vllm bench serve's --goodput: TTFT within its SLO and the
    mean gap after the first token (TPOT) within the TBT SLO. A one-token answer has no TPOT and is
    judged on TTFT alone."""
    if ttft_s is None or ttft_s > ttft_slo_s:
        return False
    return tpot_s is None or tpot_s <= tbt_slo_s


class Reservoir:
    """A uniform sample of at most `size` values (Vitter's algorithm R), seeded for repeatable runs."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size = size
        self.seen = 0
        self.values: list[float] = []
        self._rng = rng

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.size:
            self.values[slot] = value


# --- one step's client-side accounting -----------------------------------------------------------

class InFlight:
    """Requests in flight, with the max and the time-weighted mean inside the measured window."""

    def __init__(self, window_start: float, window_end: float) -> None:
        self.now = 0
        self.max = 0
        self.window = (window_start, window_end)
        self._area = 0.0
        self._since = window_start

    def _accumulate(self, t: float) -> None:
        start, end = self.window
        lo, hi = max(self._since, start), min(t, end)
        if hi > lo:
            self._area += self.now * (hi - lo)
        self._since = max(self._since, t)

    def change(self, t: float, delta: int) -> None:
        self._accumulate(t)
        self.now += delta
        if self.window[0] <= t <= self.window[1]:
            self.max = max(self.max, self.now)

    def mean(self) -> float:
        self._accumulate(self.window[1])
        span = self.window[1] - self.window[0]
        return self._area / span if span > 0 else 0.0


@dataclass(slots=True)
class StepStats:
    """Counters (exact) and reservoirs (bounded) of the requests started in one step's window."""

    ttft_slo_s: float
    tbt_slo_s: float
    rng: random.Random
    ok: int = 0
    good: int = 0
    dropped: int = 0
    failed: collections.Counter = field(default_factory=collections.Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    last_end: float = 0.0
    # Throughput is counted inside the measured window only, from every request's token times
    # (warm-up and drain requests included): the steady state, not diluted by a drain.
    window_output: float = 0.0
    window_input: float = 0.0
    window_done: int = 0
    window_good: int = 0
    requests_cap: int = MAX_RECORDED_REQUESTS
    gaps_cap: int = MAX_RECORDED_GAPS
    ttft: Reservoir = field(init=False)
    tpot: Reservoir = field(init=False)
    e2e: Reservoir = field(init=False)
    itl: Reservoir = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = Reservoir(self.requests_cap, self.rng)
        self.tpot = Reservoir(self.requests_cap, self.rng)
        self.e2e = Reservoir(self.requests_cap, self.rng)
        self.itl = Reservoir(self.gaps_cap, self.rng)

    def record_window(self, outcome: Outcome, sent: float, ended: float, start: float, end: float) -> None:
        """The part of any request's work that fell inside [start, end): its tokens by arrival time
        (prompt tokens when its first token came, the prefill being done), its completion."""
        if not outcome.ok or outcome.ttft_s is None:
            return
        arrival = sent + outcome.ttft_s
        chunks = 1 + len(outcome.itl_s)
        # A chunk may carry several tokens (usage says how many): each chunk weighs tokens/chunks.
        weight = (outcome.completion_tokens or chunks) / chunks
        inside = start <= arrival < end
        if inside:
            self.window_input += outcome.prompt_tokens or 0
        count = int(inside)
        for gap in outcome.itl_s:
            arrival += gap
            count += start <= arrival < end
        self.window_output += count * weight
        if start <= ended < end:
            self.window_done += 1
            per_token = tpot(outcome.ttft_s, outcome.e2e_s, outcome.completion_tokens)
            self.window_good += meets_slo(outcome.ttft_s, per_token, self.ttft_slo_s, self.tbt_slo_s)

    def record(self, outcome: Outcome, ended: float) -> None:
        self.last_end = max(self.last_end, ended)
        if not outcome.ok:
            self.failed[outcome.reason or "error"] += 1
            return
        self.ok += 1
        self.input_tokens += outcome.prompt_tokens or 0
        self.output_tokens += outcome.completion_tokens or 0
        per_token = tpot(outcome.ttft_s, outcome.e2e_s, outcome.completion_tokens)
        if outcome.ttft_s is not None:
            self.ttft.add(outcome.ttft_s)
        if per_token is not None:
            self.tpot.add(per_token)
        if outcome.e2e_s is not None:
            self.e2e.add(outcome.e2e_s)
        for gap in outcome.itl_s:
            self.itl.add(gap)
        if meets_slo(outcome.ttft_s, per_token, self.ttft_slo_s, self.tbt_slo_s):
            self.good += 1


def rounded(value: float | None, digits: int = 6) -> float | None:
    """A figure for the report: rounded, None when absent or not finite (JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)
