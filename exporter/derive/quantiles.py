"""TTFT, TBT and E2E quantiles over a sliding window, and SLO attainment, from bucket deltas.

The window's histogram is the current cumulative bucket counts minus those of a checkpoint about
`window` seconds old (window.HistogramWindow keeps ~30 coarse checkpoints). Quantiles interpolate
linearly inside the bucket, exactly like PromQL's histogram_quantile(), so the numbers match a
Grafana panel built on the same buckets. Attainment counts the bucket whose bound is the closest
at or below the threshold: a lower bound can only understate attainment, never flatter it.

The engine's histograms are validated before they get here (normalize.py drops one whose counts
fall as `le` rises), but a window's counts are differences of two such pages, and those need not
be monotonic: a bucket's own count can fall between pages while every cumulative count rises. Like
PromQL's histogram_quantile(), tail() first raises each count to the largest below it, so
quantiles stay within the bounds and attainment within [0, 1].

One window for everything a user reads: the quantiles and the SLO attainment both cover the whole
window, across an engine restart, as histogram_quantile() over increase() and the burn-rate rules
do in Prometheus (a reset adds the counts since it to those before it). So after a restart the
requests served before it count until they leave the window, in the exporter, on the boards and in
the alerts alike; the diagnosis says how many of the window's requests came after the restart
(window.HistogramWindow.fresh). With no observation in the window the attainment is absent, never
0 and never the last value, and the diagnosis says "no recent traffic".
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

from exporter.catalog.derived import SLO_BOUND, WINDOW_QUANTILE
from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, ScopedWindows, Stage, TargetKey, rounded
from exporter.derive.view import Histogram
from exporter.derive.window import HistogramWindow
from exporter.snapshot import Labels, Sample, format_value

QUANTILES = (0.5, 0.95, 0.99)
_INF = float("inf")
SERIES = (
    ("llm_time_to_first_token_seconds", "llm_ttft_window_seconds", "llm_ttft_slo_attainment_ratio", "ttft"),
    ("llm_inter_token_latency_seconds", "llm_tbt_window_seconds", "llm_tbt_slo_attainment_ratio", "tbt"),
    ("llm_e2e_request_latency_seconds", "llm_e2e_window_seconds", "", "e2e"),
)


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """PromQL histogram_quantile over cumulative counts (last bound +Inf). None when empty."""
    if not bounds or not cumulative:
        return None
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = q * total
    i = bisect.bisect_left(cumulative, rank)
    i = min(i, len(bounds) - 1)
    if bounds[i] == float("inf"):
        # In the +Inf bucket: the best we can say is the highest finite bound.
        return bounds[-2] if len(bounds) > 1 else None
    lower = bounds[i - 1] if i > 0 else 0.0
    below = cumulative[i - 1] if i > 0 else 0.0
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    in_bucket = cumulative[i] - below
    if in_bucket <= 0:
        return bounds[i]
    return lower + (bounds[i] - lower) * (rank - below) / in_bucket


def slo_bound(bounds: Sequence[float], threshold: float) -> float | None:
    """The largest finite bucket bound at or below the threshold (with float tolerance)."""
    limit = threshold * (1 + 1e-9)
    for b in reversed(bounds):  # the last match in bucket order, found without scanning them all
        if b != _INF and b <= limit:
            return b
    return None


def attainment(bounds: Sequence[float], cumulative: Sequence[float], bound: float) -> float | None:
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return None
    return cumulative[bounds.index(bound)] / total


class Tail(NamedTuple):
    kind: str  # ttft | tbt | e2e
    count: float  # type: ignore[assignment]  # observations in the window; hides tuple.count, never called
    quantiles: tuple[tuple[float, float], ...]  # (q, seconds)
    slo_threshold: float | None = None
    slo_bound: float | None = None
    slo_attainment: float | None = None  # None without an SLO, a bound, or observations (slo_count 0)
    note: str = ""
    slo_count: float = 0.0  # observations the attainment reads: the window's (== count)
    window_s: float | None = None  # the window's length (for the diagnosis' words)
    restarted_s_ago: float | None = None  # the latest restart inside the window, seconds before now
    since_restart: float | None = None  # of the window's observations, those after that restart
    not_applicable: str = ""  # why this kind is not judged for the target (a prefill instance's TBT)

    def quantile(self, q: float) -> float | None:
        return dict(self.quantiles).get(q)

    @property
    def no_recent_traffic(self) -> bool:
        """An SLO with a bucket bound but nothing to judge it on: no observations in the window."""
        return self.slo_bound is not None and self.slo_count <= 0


def compute(kind: str, delta: Histogram, threshold: float | None) -> Tail:
    return tail(kind, delta.bounds, delta.counts, threshold)


def tail(kind: str, bounds: Sequence[float], counts: Sequence[float], threshold: float | None,
         fresh: Sequence[float] | None = None, *, window_s: float | None = None,
         restarted_s_ago: float | None = None) -> Tail:
    """compute() on the bucket bounds and window counts as they are (no Histogram to build).
    `fresh`: the window counts since the latest restart inside it, for the words only (the quantiles
    and the attainment read the whole window)."""
    counts = tuple(accumulate(counts, max))  # monotonic, as histogram_quantile() makes them
    since_restart = None if fresh is None or restarted_s_ago is None or not fresh else max(fresh)
    qs = tuple((q, v) for q in QUANTILES if (v := histogram_quantile(q, bounds, counts)) is not None)
    bound = att = None
    note = ""
    if threshold is not None:
        bound = slo_bound(bounds, threshold)
        if bound is None:
            note = f"no {kind} bucket bound at or below the SLO {threshold:g}s: attainment omitted"
        else:
            att = attainment(bounds, counts, bound)
    total = counts[-1] if counts else 0.0
    return Tail(kind, total, qs, threshold, bound, att, note, total, window_s, restarted_s_ago, since_restart)


def tail_samples(tail: Tail, window_name: str, slo_name: str, labels: Labels) -> list[Sample]:
    out = [Sample(window_name, tuple(sorted(labels + ((WINDOW_QUANTILE, format_q(q)),))), v) for q, v in tail.quantiles]
    if slo_name and tail.slo_attainment is not None and tail.slo_bound is not None:
        out.append(Sample(slo_name, tuple(sorted(labels + ((SLO_BOUND, format_value(tail.slo_bound)),))),
                          tail.slo_attainment))
    return out


def format_q(q: float) -> str:
    return f"{q:g}"


def samples(tails: Mapping[str, Tail], key: TargetKey) -> list[Sample]:
    out = []
    for _, window_name, slo_name, kind in SERIES:
        if kind in tails:
            out.extend(tail_samples(tails[kind], window_name, slo_name, key.labels))
    return out


def numbers(tails: Mapping[str, Tail]) -> dict[str, Any]:
    return {kind: {"window_count": tail.count,
                   "quantiles": {format_q(q): rounded(v, 6) for q, v in tail.quantiles},
                   "slo_seconds": tail.slo_threshold, "slo_bound_used": tail.slo_bound,
                   "slo_attainment": rounded(tail.slo_attainment), "slo_window_count": tail.slo_count,
                   "slo_no_recent_traffic": tail.no_recent_traffic,
                   "restarted_seconds_ago": rounded(tail.restarted_s_ago, 1),
                   "window_count_since_restart": tail.since_restart,
                   "not_applicable": tail.not_applicable or None} for kind, tail in tails.items()}


def notes(tails: Mapping[str, Tail]) -> list[str]:
    return [tail.note for tail in tails.values() if tail.note]


class Windows(ScopedWindows):
    """One histogram window per target and series kind; the SLO thresholds by kind."""

    def __init__(self, settings: DeriveSettings) -> None:
        super().__init__(settings, lambda: HistogramWindow(settings.quantile_window_s))
        self.thresholds = {"ttft": settings.slo_ttft_s, "tbt": settings.slo_tbt_s, "e2e": None}


NOT_APPLICABLE = {("prefill", "tbt"): "prefill role: the instance hands each request to its decode partner after "
                                      "the first token, so the token gaps users see are the decode instance's"}
"""(role, kind) -> why the kind has no quantiles or SLO judgement for an instance of that role."""


def _compute(ctx: Ctx, state: Windows) -> dict[str, Tail]:
    tails = {}
    for hist_name, _, _, kind in SERIES:
        hist = ctx.engine.histograms.get(hist_name)
        if hist is None:
            continue
        why = NOT_APPLICABLE.get((ctx.engine.role, kind))
        if why is not None:
            tails[kind] = Tail(kind, 0.0, (), state.thresholds[kind], not_applicable=why)
            continue
        window: HistogramWindow = state.windows.get(f"{ctx.engine.target}\0{kind}")
        delta = window.observe(ctx.now, hist.bounds, hist.counts, hist.series)
        if delta is None:
            continue
        since = None if window.restarted_at is None else max(0.0, ctx.now - window.restarted_at)
        tails[kind] = tail(kind, hist.bounds, delta, state.thresholds[kind], window.fresh,
                           window_s=window.window_s, restarted_s_ago=since)
    return tails


STAGE = Stage(
    name="quantiles", compute=_compute, samples=samples, numbers=numbers, notes=notes, state=Windows,
    emits=tuple(name for _, window_name, slo_name, _ in SERIES for name in (window_name, slo_name) if name),
    histograms=tuple(hist for hist, _, _, _ in SERIES),
)
