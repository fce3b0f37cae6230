"""The client probe (`--probe`) beside the engine's own numbers, for the diagnosis.

Over the quantile window: how many of the probe's requests to the engine's API failed (and why),
and its mean time to first token against the engine's own mean. The thresholds are those of
LLMProbeFailing and LLMProbeLatencyGap (exporter.slo), so `doctor` degrades a target on what those
alerts fire on, judged over this one window (the alerts add their own windows and `for`). No
series: the probe's families and the gap recording rule already say it in Prometheus.

Both sides are counters, kept as the coarse checkpoints of a HistogramWindow (a 5-minute window
costs ~30 per target): reset-safe per series, so an engine restart (or the exporter's, for the
probe) neither spikes nor hides the window's requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from exporter.catalog.probe import ERROR_REASONS
from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, ScopedWindows, Stage, TargetKey, rounded
from exporter.derive.view import EngineView, ProbeView
from exporter.derive.window import HistogramWindow
from exporter.slo import PROBE_FAILING_RATIO, PROBE_GAP, human_duration, latency_text
from exporter.snapshot import Sample

ENGINE_TTFT = ("llm_time_to_first_token_seconds_sum", "llm_time_to_first_token_seconds_count")
# The probe's counters in the order the window keeps them: requests, TTFT sum and count, errors.
_PROBE_KEYS: tuple[str, ...] = ("requests", "ttft_sum", "ttft_count", *ERROR_REASONS)


class ProbeCheck(NamedTuple):
    """One target's probe over the window (counts are the window's increases)."""

    window_s: float
    up: bool
    requests: float
    failed: float
    reasons: tuple[tuple[str, float], ...]  # (reason, failed requests), most first
    client_ttft_s: float | None  # mean over the window's successful probe requests
    engine_ttft_s: float | None  # the engine's mean over its requests finished in the window

    @property
    def gap_s(self) -> float | None:
        if self.client_ttft_s is None or self.engine_ttft_s is None:
            return None
        return self.client_ttft_s - self.engine_ttft_s

    @property
    def failing(self) -> bool:
        return self.requests > 0 and self.failed / self.requests > PROBE_FAILING_RATIO

    @property
    def gap_too_large(self) -> bool:
        gap = self.gap_s
        return gap is not None and gap > PROBE_GAP.gap_seconds and \
            self.client_ttft_s > PROBE_GAP.factor * self.engine_ttft_s  # type: ignore[operator]

    @property
    def over(self) -> str:
        return f"over the last {human_duration(round(self.window_s))}"

    def words(self) -> str:
        """One line for the report, whatever the state."""
        if self.requests <= 0:
            return f"probe: no request finished {self.over}"
        ok = self.requests - self.failed
        line = f"probe: {ok:.0f} of {self.requests:.0f} requests to the API succeeded {self.over}"
        if self.client_ttft_s is not None:
            line += f"; client TTFT mean {_ttft(self.client_ttft_s)}"
            if self.engine_ttft_s is not None:
                line += f", the engine's own {_ttft(self.engine_ttft_s)}"
                if self.client_ttft_s < self.engine_ttft_s:
                    # Not a contradiction: the probe's request is tiny, while the engine's mean is over
                    # every request, long prompts and queueing included.
                    line += (" (the probe's short prompt skips the queue and prefill the engine's mean "
                             "over all requests includes)")
        return line

    def degraded(self) -> list[str]:
        out = []
        if self.failing:
            why = ", ".join(f"{reason} {n:.0f}" for reason, n in self.reasons)
            out.append(f"the probe's requests to the engine's API fail: {self.failed:.0f} of {self.requests:.0f} "
                       f"{self.over} ({why}); its clients are likely failing too")
        client, engine = self.client_ttft_s, self.engine_ttft_s
        if self.gap_too_large and client is not None and engine is not None:  # (a gap implies both)
            out.append(f"clients wait {_ttft(client - engine)} longer for a first token than the engine measures "
                       f"(probe mean {_ttft(client)}, engine {_ttft(engine)} {self.over}): the time "
                       "goes in front of the engine (network, a proxy or gateway queueing, TLS, the API server)")
        return out


def _ttft(seconds: float) -> str:
    """A TTFT the way the evidence, the page and the boards give it: in seconds."""
    return latency_text(seconds, "ttft")


def _mean(total: float, count: float) -> float | None:
    return total / count if count > 0 else None


def _windows(settings: DeriveSettings) -> ScopedWindows:
    """Per target, one window of the probe's counters and one of the engine's TTFT sum and count."""
    return ScopedWindows(settings, lambda: HistogramWindow(settings.quantile_window_s))


def _probe_counts(probe: ProbeView) -> tuple[float, ...]:
    return (probe.requests, probe.ttft_sum, probe.ttft_count, *(probe.errors.get(r, 0.0) for r in ERROR_REASONS))


def _engine_series(engine: EngineView) -> tuple[tuple[str, tuple[float, ...]], ...] | None:
    """The engine's TTFT sum and count per series (data-parallel rank), or None without them."""
    if engine.series is None:
        values = tuple(engine.get(name) for name in ENGINE_TTFT)
        return None if None in values else (("", values),)  # type: ignore[return-value]
    ids = sorted({sid for name, sid in engine.series if name in ENGINE_TTFT})
    rows = tuple((sid, tuple(engine.series.get((name, sid), 0.0) for name in ENGINE_TTFT)) for sid in ids)
    return rows or None


def _increase(window: HistogramWindow, now: float, keys: tuple[str, ...],
              series: tuple[tuple[str, tuple[float, ...]], ...]) -> dict[str, float] | None:
    """The window's increase of each counter (a HistogramWindow's `bounds` only name the columns)."""
    totals = tuple(map(sum, zip(*(values for _, values in series), strict=True)))
    delta = window.observe(now, keys, totals, series)  # type: ignore[arg-type]
    return None if delta is None else dict(zip(keys, delta, strict=True))


def _compute(ctx: Ctx, state: ScopedWindows) -> ProbeCheck | None:
    target = ctx.engine.target
    probe = ctx.view.probes.get(target)
    if probe is None:
        return None
    window = state.windows.get(f"{target}\0probe")
    if not len(window):
        # The probe is this process's own and counts from zero: its first request is in the window
        # (an engine's counters, started before us, take their first value as the baseline instead).
        window.observe(ctx.now - 1e-3, _PROBE_KEYS, (0.0,) * len(_PROBE_KEYS))
    mine = _increase(window, ctx.now, _PROBE_KEYS, (("", _probe_counts(probe)),))
    if mine is None:
        return None
    engine_mean = None
    if (series := _engine_series(ctx.engine)) is not None:
        theirs = _increase(state.windows.get(f"{target}\0engine"), ctx.now, ENGINE_TTFT, series)
        if theirs is not None:
            engine_mean = _mean(*theirs.values())
    reasons = tuple(sorted(((r, mine[r]) for r in ERROR_REASONS if mine[r] > 0), key=lambda kv: -kv[1]))
    return ProbeCheck(window.window_s, probe.up >= 1.0, mine["requests"],
                      sum(n for _, n in reasons), reasons, _mean(mine["ttft_sum"], mine["ttft_count"]), engine_mean)


def _samples(check: ProbeCheck, key: TargetKey) -> Sequence[Sample]:
    return ()


def numbers(check: ProbeCheck) -> Mapping[str, Any]:
    return {"probe": {"window_seconds": check.window_s, "up": check.up, "requests": check.requests,
                      "failed": check.failed, "failed_by_reason": dict(check.reasons),
                      "client_ttft_mean_seconds": rounded(check.client_ttft_s, 6),
                      "engine_ttft_mean_seconds": rounded(check.engine_ttft_s, 6),
                      "gap_seconds": rounded(check.gap_s, 6)}}


STAGE = Stage(name="probe", compute=_compute, samples=_samples, emits=(), engine=ENGINE_TTFT, numbers=numbers,
              state=_windows)
