"""The latency SLOs and the thresholds shared by the exporter, alerts/ and dashboards/, declared once.

The exporter's defaults (`--slo-ttft`, `--slo-tbt`), the alert rules (alerts/generate.py splices these
into its CONFIG) and the dashboards' threshold lines all read this module, so the derived
llm_*_slo_attainment_ratio, the burn-rate alerts and the panels agree on one threshold. A leaf module:
it imports nothing from the rest of the package, so any layer may import it.

Durations are Prometheus durations ("5m"); ratios are 0..1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DURATION_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:\d+[wdhms])+")


def duration_seconds(duration: str) -> int:
    """A Prometheus duration in seconds: one unit ("5m", "30d") or several, largest first ("1h26m24s")."""
    if not _DURATION.fullmatch(duration):
        raise ValueError(f"unsupported duration {duration!r}")
    return sum(int(n) * _DURATION_UNITS[u] for n, u in re.findall(r"(\d+)([wdhms])", duration))


def prometheus_duration(seconds: float) -> str:
    """Whole seconds (at least 1) as the shortest Prometheus duration: 6s, 1m12s, 1h26m24s, 14h24m."""
    left, out = max(1, round(seconds)), ""
    for unit, size in _DURATION_UNITS.items():
        if unit == "w":  # "1w2d" reads worse than "9d"
            continue
        count, left = divmod(left, size)
        out += f"{count}{unit}" if count else ""
    return out


def _plural(count: float, unit: str) -> str:
    return f"{count:g} {unit}" + ("" if count == 1 else "s")


MS_KINDS = frozenset({"tbt"})
"""Latencies shown in milliseconds: the per-token gaps. TTFT and e2e read in seconds, whatever the value,
so one quantity has one unit on every page, report and evidence line (the boards' unit is `s`)."""


def latency_text(seconds: float, kind: str) -> str:
    """A latency as every page and report writes it: `kind` ttft, tbt or e2e (MS_KINDS in ms)."""
    return f"{seconds * 1000:.3g} ms" if kind in MS_KINDS else f"{seconds:.3g} s"


def human_duration(seconds: float) -> str:
    """A span for prose, in its largest sensible unit: "5 days", "50 hours", "1 hour", "12 minutes"."""
    hours = seconds / 3600
    if hours >= 72:
        return _plural(round(hours / 24, 1), "day")
    if hours >= 1:
        return _plural(round(hours, 1), "hour")
    if seconds >= 60:
        return _plural(round(seconds / 60, 1), "minute")
    return _plural(round(seconds, 1), "second")


@dataclass(frozen=True, slots=True)
class LatencySLO:
    """"`objective` of requests (or inter-token gaps) take at most `threshold_seconds`".

    threshold_seconds MUST be a bucket bound of the engine's histogram (vLLM V1 TTFT bounds: ... 0.5,
    0.75, 1.0, 2.5, 5.0 ...; ITL bounds: ... 0.075, 0.1, 0.15, 0.2, 0.3 ...): otherwise the good-event
    ratio has no series, the SLO alerts are silent and LLMSLOThresholdNotABucketBound fires."""

    key: str  # the `slo` label of its alerts
    metric: str  # the histogram family
    title: str  # "time to first token", inside sentences
    summary: str  # "Time-to-first-token", at the start of an alert summary
    alert: str
    objective: float
    threshold_seconds: float


@dataclass(frozen=True, slots=True)
class BurnRate:
    """One SRE-workbook multi-window pair: fires when both windows burn faster than `factor` times
    the sustainable rate of the SLO period's budget."""

    severity: str
    long: str
    short: str
    factor: float
    for_: str


def budget_lasts(period: str, factor: float) -> str:
    """How long a `period` error budget lasts when burnt at `factor` times the sustainable rate:
    "50 hours", "5 days"."""
    return human_duration(duration_seconds(period) / factor)


TTFT = LatencySLO("ttft", "llm_time_to_first_token_seconds", "time to first token", "Time-to-first-token",
                  "LLMTimeToFirstTokenErrorBudgetBurn", objective=0.99, threshold_seconds=2.5)
TBT = LatencySLO("tbt", "llm_inter_token_latency_seconds", "time between tokens", "Time-between-tokens",
                 "LLMTimeBetweenTokensErrorBudgetBurn", objective=0.99, threshold_seconds=0.1)
SLOS: tuple[LatencySLO, ...] = (TTFT, TBT)

# A 30-day budget; the pairs page for a budget gone in 50 hours (1h/5m) or 5 days (6h/30m), and
# open a ticket for one gone in 10 days (1d/2h, the SRE workbook's medium tier: 10% of the budget in
# a day) or within the period (3d/6h). Order: the paging pairs first, then the tickets, each
# shortest long window first (tests and the live story read the first two as the fast and slow pages).
SLO_PERIOD = "30d"
BURN_RATES: tuple[BurnRate, ...] = (
    BurnRate("critical", long="1h", short="5m", factor=14.4, for_="2m"),
    BurnRate("critical", long="6h", short="30m", factor=6, for_="15m"),
    BurnRate("warning", long="1d", short="2h", factor=3, for_="1h"),
    BurnRate("warning", long="3d", short="6h", factor=1, for_="3h"),
)



@dataclass(frozen=True, slots=True)
class AvailabilitySLO:
    """"`objective` of the requests a model's fleet finishes are not the server's fault", per
    (cluster, namespace, model): one SLO for all replicas of a model, so one breach is one page.

    Read from llm_requests_finished_total{reason} (exporter/catalog/engine.py FINISH_REASONS). Bad:
    `error` (the engine or its backend failed the request) and `rejected` (refused without being
    run: a full or timed-out queue, overload); both are the service failing a request it was sent.
    Not bad: `abort` (the client left or cancelled: its choice, and counting it would page on
    impatient clients), `stop`, `length` (normal ends) and `other`. tests/test_alerts.py checks that
    these are FINISH_REASONS (a leaf module cannot import the catalogue)."""

    key: str  # the `slo` label of its alerts
    alert: str
    objective: float
    bad_reasons: tuple[str, ...]  # the server's fault: counted against the SLO
    abort_reasons: tuple[str, ...]  # the client's choice: the abort ratio, never the SLO


AVAILABILITY = AvailabilitySLO("availability", "LLMAvailabilityErrorBudgetBurn", objective=0.999,
                               bad_reasons=("error", "rejected"), abort_reasons=("abort",))

# The labels the fleet recording rules and alerts keep (`sum by`): a Prometheus per cluster sets
# `cluster` in its external_labels, Kubernetes scrapes set `namespace`; absent ones are simply empty.
CLUSTER_LABEL = "cluster"
FLEET_LABELS: tuple[str, ...] = (CLUSTER_LABEL, "namespace")

# Window and quantiles of the quantile and throughput recording rules the dashboards read.
RATE_WINDOW = "5m"
QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
# Traffic floor, in requests/s (rate of the TTFT histogram's _count): latency and SLO alerts stay
# quiet below it, so one slow request at 3 a.m. pages nobody.
MIN_REQUEST_RATE = 0.05

# Selects the exporter's series (every llm_* family comes from the exporter's scrape job), and the
# labels that identify one exporter (one sidecar, one host).
EXPORTER_SELECTOR = 'job="llm-exporter"'
EXPORTER_LABELS: tuple[str, ...] = ("job", "instance")


@dataclass(frozen=True, slots=True)
class Saturation:
    """The saturation thresholds an alert fires on and a dashboard draws as its red line."""

    kv_cache_usage_ratio: float = 0.95
    queue_min_waiting: int = 5  # waiting requests before a growing queue matters
    headroom_min_sequences: int = 1  # KV cache room, in sequences of the current mean length


SATURATION = Saturation()


@dataclass(frozen=True, slots=True)
class ProbeGap:
    """LLMProbeLatencyGap: the client-side TTFT of the probe (--probe) against the engine's own, as
    means over RATE_WINDOW; the alert fires on both, the overview dashboard draws the first."""

    gap_seconds: float = 0.5  # client mean minus server mean
    factor: float = 2.0  # client mean over server mean


PROBE_GAP = ProbeGap()
# LLMProbeFailing: more than this share of the probe's requests failed.
PROBE_FAILING_RATIO = 0.5
