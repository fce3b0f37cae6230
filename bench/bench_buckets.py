"""The error coarse buckets add, and the error of an SLO threshold read at the engine's edge below it.

For each engine format's TTFT and TBT layouts (the twin's: exporter/simulator/recorders.py) and
lognormal latency families spanning them, DRAWS latencies are bucketed into the engine's layout and
into the layout /metrics writes under `--histogram-buckets coarse` with N = 4, 8, 12 (exporter/buckets.py
plan_for, the exporter's own code). The p50/p95/p99 are computed as histogram_quantile() does
(exporter/derive/quantiles.py); the error reported is coarse against engine, relative to the engine's
(what a user loses by coarsening, on top of what the engine's buckets already cost, reported beside it
as engine against the true quantile). The SLO attainment of the threshold bucket (the count at the
engine's edge at or below the threshold) is compared with the true share of draws within the threshold.
Deterministic (seeded): the numbers change only when the layouts, families or the edge choice do.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from exporter.buckets import plan_for
from exporter.derive.quantiles import histogram_quantile
from exporter.simulator.recorders import SGLANG_ITL, SGLANG_TTFT, TGI_DURATION, VLLM_ITL, VLLM_TTFT
from exporter.slo import TBT, TTFT

DRAWS = 20_000
NEAR_SLO = 0.95  # families this close to a 99% objective are the ones whose verdict the error can flip
NS = (4, 8, 12)
QS = (0.5, 0.95, 0.99)
LAYOUTS: dict[str, dict[str, Sequence[float]]] = {
    "vllm": {"ttft": VLLM_TTFT, "tbt": VLLM_ITL},
    "sglang": {"ttft": SGLANG_TTFT, "tbt": SGLANG_ITL},
    "tgi": {"ttft": TGI_DURATION, "tbt": TGI_DURATION},  # TGI's duration histograms: 0.0001 x 1.5^k
}
THRESHOLDS = {"ttft": TTFT.threshold_seconds, "tbt": TBT.threshold_seconds}
# (median seconds, sigma of log): from a lightly loaded server to one near its SLO.
FAMILIES = {"ttft": tuple((m, s) for m in (0.1, 0.3, 1.0, 2.0) for s in (0.5, 1.0)),
            "tbt": tuple((m, s) for m in (0.01, 0.03, 0.06) for s in (0.3, 0.7))}


@dataclass(frozen=True, slots=True)
class Row:
    engine: str
    kind: str
    n: int
    edges: int  # finite edges written (the threshold bucket included)
    coarse_median: float  # median over families and quantiles of |coarse - engine| / engine
    coarse_max: float
    engine_median: float  # the engine layout's own error against the true quantile
    engine_max: float


@dataclass(frozen=True, slots=True)
class SloRow:
    engine: str
    kind: str
    threshold: float
    bound: float | None  # the engine's edge at or below the threshold
    mean_error: float  # true share within the threshold minus the bucket's share (never negative)
    max_error: float
    near_max_error: float | None  # the max over the families whose true share is at least NEAR_SLO


def _cumulative(draws: Sequence[float], bounds: Sequence[float]) -> list[float]:
    counts = [0.0] * len(bounds)
    for x in draws:
        counts[bisect.bisect_left(bounds, x)] += 1  # le: x <= bound
    total, out = 0.0, []
    for c in counts:
        total += c
        out.append(total)
    return out


def _written(edges: Sequence[float], kind: str, n: int | None) -> list[float]:
    """The finite bounds /metrics writes for this layout (exporter/buckets.py's plan), +Inf last."""
    les = [floatToGoString(e) for e in edges] + ["+Inf"]
    plan = plan_for(les, slo=kind, threshold=THRESHOLDS[kind], limit=n)
    kept = les if plan.order is None else [les[i] for i in plan.order]
    return sorted({float(le) for le in kept} | ({float(plan.extra_le)} if plan.extra_le else set()))


def _quantiles(bounds: Sequence[float], cumulative: Sequence[float]) -> list[float]:
    return [histogram_quantile(q, bounds, cumulative) or 0.0 for q in QS]


def _true(draws: Sequence[float]) -> list[float]:
    ordered = sorted(draws)
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in QS]


def measure() -> tuple[list[Row], list[SloRow]]:
    rows: list[Row] = []
    slo_rows: list[SloRow] = []
    for engine, layouts in LAYOUTS.items():
        for kind, edges in layouts.items():
            edges = sorted(edges)
            rng = random.Random(f"{engine}:{kind}")
            samples = [[rng.lognormvariate(math.log(m), s) for _ in range(DRAWS)] for m, s in FAMILIES[kind]]
            engine_bounds = [*edges, float("inf")]
            engine_q = [_quantiles(engine_bounds, _cumulative(d, engine_bounds)) for d in samples]
            true_q = [_true(d) for d in samples]
            engine_err = [abs(e - t) / t for eq, tq in zip(engine_q, true_q, strict=True)
                          for e, t in zip(eq, tq, strict=True)]
            for n in NS:
                written = _written(edges, kind, n)
                bounds = [*written, float("inf")]
                errors = []
                for d, eq in zip(samples, engine_q, strict=True):
                    cq = _quantiles(bounds, _cumulative(d, bounds))
                    errors += [abs(c - e) / e for c, e in zip(cq, eq, strict=True) if e > 0]
                rows.append(Row(engine, kind, n, len(written), statistics.median(errors), max(errors),
                                statistics.median(engine_err), max(engine_err)))
            threshold = THRESHOLDS[kind]
            at = bisect.bisect_right(edges, threshold * (1 + 1e-9)) - 1
            bound = edges[at] if at >= 0 else None
            gaps, near = [], []
            for d in samples:
                true_share = sum(x <= threshold for x in d) / len(d)
                bucket_share = 0.0 if bound is None else sum(x <= bound for x in d) / len(d)
                gaps.append(true_share - bucket_share)
                if true_share >= NEAR_SLO:
                    near.append(true_share - bucket_share)
            slo_rows.append(SloRow(engine, kind, threshold, bound, statistics.mean(gaps), max(gaps),
                                   max(near) if near else None))
    return rows, slo_rows


def page_cost_us(coarse: bool, rounds: int = 300) -> tuple[int, float]:
    """Samples on a synthetic sidecar page (the engine's histograms of two models with the twin's vLLM
    and SGLang layouts, and 400 other samples) and what Rebucketer.apply costs per page, steady (plans
    cached), in microseconds: the exporter's added work per collection cycle."""
    from exporter.buckets import Rebucketer
    from exporter.slo import TBT as TBT_SLO
    from exporter.slo import TTFT as TTFT_SLO
    from exporter.snapshot import Sample, labels_of

    layouts = {"llm_time_to_first_token_seconds": SGLANG_TTFT, "llm_inter_token_latency_seconds": VLLM_ITL,
               "llm_e2e_request_latency_seconds": VLLM_TTFT, "llm_request_queue_time_seconds": VLLM_TTFT,
               "llm_request_prefill_time_seconds": VLLM_TTFT, "llm_request_decode_time_seconds": VLLM_TTFT,
               "llm_time_per_output_token_seconds": VLLM_ITL}
    samples = [Sample("llm_other", labels_of(i=str(i), target="t"), 1.0) for i in range(400)]
    for model in ("a", "b"):
        for family, edges in layouts.items():
            les = [floatToGoString(e) for e in edges] + ["+Inf"]
            samples += [Sample(family + "_bucket", labels_of(le=le, model=model, target="t"), float(i))
                        for i, le in enumerate(les)]
            samples += [Sample(family + "_sum", labels_of(model=model, target="t"), 1.0),
                        Sample(family + "_count", labels_of(model=model, target="t"), float(len(les) - 1))]
    buckets = Rebucketer(coarse=coarse, max_edges=8, thresholds={TTFT_SLO.metric: ("ttft", 2.5),
                                                                   TBT_SLO.metric: ("tbt", 0.1)})
    buckets.apply(samples)
    import time

    started = time.perf_counter()
    for _ in range(rounds):
        buckets.apply(samples)
    return len(samples), (time.perf_counter() - started) / rounds * 1e6


_last: tuple[list[Row], list[SloRow]] | None = None
_cost: dict[str, tuple[int, float]] = {}


def run() -> list[tuple[str, str]]:
    global _last
    _last = measure()
    rows, slo_rows = _last
    _cost.update({mode: page_cost_us(mode == "coarse") for mode in ("engine", "coarse")})
    out = [(f"buckets: {r.engine} {r.kind} N={r.n}: p50/95/99 error coarse vs engine, median / max",
            f"{r.coarse_median:.1%} / {r.coarse_max:.1%}") for r in rows]
    out += [(f"buckets: {s.engine} {s.kind} SLO {s.threshold:g}s at edge {s.bound}: attainment error mean / max",
             f"{s.mean_error * 100:.2f} / {s.max_error * 100:.2f} points") for s in slo_rows]
    out += [(f"buckets: apply() per page, {mode} ({n} samples)", f"{us:.0f} us") for mode, (n, us) in _cost.items()]
    return out


def section() -> str:
    assert _last is not None, "run() first"
    rows, slo_rows = _last
    ttft_families = ", ".join(f"{m:g} s/{s:g}" for m, s in FAMILIES["ttft"])
    tbt_families = ", ".join(f"{m * 1000:g} ms/{s:g}" for m, s in FAMILIES["tbt"])
    lines = ["## Histogram buckets: coarse layouts and SLO thresholds", "",
             "Written by `python -m bench buckets` (bench/bench_buckets.py). For each engine's TTFT and TBT "
             f"layout (the twin's), {DRAWS:,} lognormal draws per family (median/sigma of log: TTFT "
             f"{ttft_families}; TBT {tbt_families}) are bucketed into the engine's layout and into what "
             "`--histogram-buckets coarse --histogram-buckets-max N` writes (the exporter's own edge choice). "
             "p50, p95 and p99 as histogram_quantile() computes them; the error is |coarse - engine| / engine, "
             "median and maximum over the families and the three quantiles. The engine's own error against the "
             "true quantile is beside it: coarse adds to that. TGI exports no TTFT or inter-token histogram: its rows "
             "use the layout of its duration histograms (queue, inference, time per output token: 0.0001 x 1.5^k), "
             "which coarse cuts the same way; SGLang's inter-token layout is its own histogram, which the exporter "
             "does not map to llm_inter_token_latency_seconds (docs/engines.md).", "",
             "| engine | histogram | N | edges written | coarse vs engine, median | max | "
             "engine vs true, median | max |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.engine} | {r.kind} | {r.n} | {r.edges} | {r.coarse_median:.1%} | {r.coarse_max:.1%} | "
                     f"{r.engine_median:.1%} | {r.engine_max:.1%} |")
    lines += ["", "SLO attainment at the shipped thresholds: the share of draws within the threshold minus the "
              "share the threshold bucket reports (the count at the engine's edge at or below it, in every "
              "mode: coarse always keeps that edge). Never negative: the SLO never flatters; 0 where the "
              "threshold is an engine edge. Only the rows of a histogram the exporter judges an SLO on apply "
              "(vLLM TTFT and TBT, SGLang TTFT); the others show what the same rule would cost on that layout.", "",
              f"| engine | SLO | threshold | engine edge used | error, mean (points) | max (points) | max where "
              f"the true attainment is at least {NEAR_SLO:.0%} (points) |",
              "|---|---|---|---|---|---|---|"]
    for s in slo_rows:
        bound = "none" if s.bound is None else f"{s.bound:.6g}"
        near = "no such family" if s.near_max_error is None else f"{s.near_max_error * 100:.2f}"
        lines.append(f"| {s.engine} | {s.kind} | {s.threshold:g} s | {bound} | {s.mean_error * 100:.2f} | "
                     f"{s.max_error * 100:.2f} | {near} |")
    lines += ["", "What the rewrite costs the exporter per collection cycle (Rebucketer.apply on a steady page, the "
              "plans cached): " + "; ".join(f"{mode}: {us:.0f} us for {n} samples" for mode, (n, us) in _cost.items())
              + ". Engine mode touches only the TTFT and TBT histograms, coarse every engine histogram."]
    return "\n".join(lines) + "\n"
