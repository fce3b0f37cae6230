"""The engine histograms' buckets as /metrics writes them: coarse layouts and SLO threshold buckets.

Two rewrites of the page, after the profile filter, so derive, the window quantiles and the verdict
still read the engine's full layout (collect.py runs `apply` on the samples it publishes only):

- coarse (`--histogram-buckets coarse`, auto under `--profile minimal`): each engine histogram in
  seconds, tokens or bytes keeps at most `histogram_buckets_max` finite edges, a subset of the
  engine's own: the count at a kept edge is the engine's, nothing is invented or interpolated. The SLO
  threshold is always among them; the rest spread evenly in log space over the edges within SLO_SPAN
  of the threshold (over all of them for a histogram without one). +Inf, _sum and _count stay.
- SLO threshold buckets (every mode): where an SLO threshold (`--slo-ttft`, `--slo-tbt`) is not an
  edge of the engine's histogram (SGLang's TTFT edges are 2 and 4, the shipped target 2.5 s), one more
  bucket is written at the threshold holding the cumulative count at the largest engine edge below it:
  requests between that edge and the threshold count as slow, so the SLO may understate attainment
  and never flatters it (the rule llm_ttft_slo_attainment_ratio's `bound` follows). The shipped
  burn-rate alerts then work for every engine and LLMSLOThresholdNotABucketBound stays quiet.
  llm_exporter_slo_threshold_edge says which holds per target and SLO; the log says so once per change
  and names the engine's edges around the threshold, the exact targets the user could pick instead.

A steady page costs a dict lookup per histogram series (the plan for its family and edges is cached,
bounded) and a set lookup per bucket sample. A series this module cannot read (an `le` that is not a
number, duplicated, no +Inf) is written as it came: validating pages is the normalizer's job.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.utils import floatToGoString

from exporter import catalog
from exporter.logstate import StateLog
from exporter.slo import TBT, TTFT
from exporter.snapshot import Labels, Sample, labels_of

if TYPE_CHECKING:
    from exporter.config import Config

log = logging.getLogger("llm_exporter.buckets")

COARSE_UNITS = frozenset({"seconds", "tokens", "bytes"})
"""Units of the histograms coarse rewrites: those whose edges span decades (log spacing fits them)."""
STATES = ("engine", "lower_edge", "none")
"""llm_exporter_slo_threshold_edge's `state`, best first: a target with several series of one family
(one per model) reports the worst."""
MAX_PLANS = 512
"""Cached plans, by (family, edges): a sidecar has a few families x a few layouts; past this (a target
whose edges change every page) the oldest go, and a page costs a plan per series again, never memory."""
MAX_SPLIT = 65536
"""Bucket label sets remembered without their `le` (a steady page then costs a dict lookup per bucket):
a sidecar's pages hold a few thousand."""
MAX_CACHED_CHARS = 4 << 20
"""The plan and split caches are also cleared past this many characters of `le` and label text they
hold: the engine chooses how many buckets a series has and how long its labels are, so a count bound
alone would let a page of huge layouts keep megabytes per entry."""
MAX_TRACKED = 4096
"""(target, SLO) states kept: targets are configured, so this is a bound against a bug, not a limit."""
LOG_REASON = "slo_threshold_edge"
DOCS = "docs/alerts.md, Histogram buckets and SLO thresholds"
_REL = 1e-9  # float tolerance for "the threshold is this edge" (exporter/derive/quantiles.py slo_bound)
_INF_TEXT = "+Inf"


def same_edge(edge: float, threshold: float) -> bool:
    return abs(edge - threshold) <= _REL * max(abs(threshold), 1e-300)


SLO_SPAN = 100.0
"""coarse: the edges of a histogram with an SLO threshold are chosen within this factor of it."""


def choose_edges(edges: Sequence[float], must: Iterable[float], limit: int) -> tuple[float, ...]:
    """At most `limit` of the finite `edges` (sorted, unique), ascending: every one of `must` that is an
    edge, the rest the edges nearest to points spread evenly in log space from the lowest positive edge
    to the highest (both kept when two slots are left). Non-positive edges (a queue's le="0") sit below
    the lowest positive one, kept only when the layout fits whole."""
    if len(edges) <= limit:
        return tuple(edges)
    must = [m for m in must if m > 0]
    kept = {e for e in edges for m in must if same_edge(e, m)}
    slots = limit - len(kept)
    if slots <= 0:
        return tuple(sorted(kept)[:limit])
    if must:
        # Around an SLO threshold the edges that matter lie within SLO_SPAN of it either way: vLLM's
        # TTFT layout runs from 1 ms to 2560 s, and spreading 8 edges over all of it left the fleet
        # p99 50% off (bench_buckets); past the kept range a quantile reads the nearest kept edge.
        low_end, high_end = min(must) / SLO_SPAN, max(must) * SLO_SPAN
        inside = [e for e in edges if low_end <= e <= high_end]
        if len(inside) >= slots + len(kept):
            edges = inside
    positive = [e for e in edges if e > 0]
    if len(positive) >= 2:
        low, high = math.log(positive[0]), math.log(positive[-1])
        floor = low - (high - low) - 1.0  # below every positive edge's position
        positions = [math.log(e) if e > 0 else floor for e in edges]
    else:  # at most one positive edge: spread by rank
        low, high = 0.0, float(len(edges) - 1)
        positions = [float(i) for i in range(len(edges))]
    targets = [high] if slots == 1 else [low + (high - low) * i / (slots - 1) for i in range(slots)]
    for target in targets:
        right = bisect.bisect_left(positions, target)
        left = right - 1
        while left >= 0 or right < len(edges):  # the nearest edge not kept yet, ties to the lower one
            take_left = right >= len(edges) or (
                left >= 0 and target - positions[left] <= positions[right] - target)
            index = left if take_left else right
            if edges[index] not in kept:
                kept.add(edges[index])
                break
            if take_left:
                left -= 1
            else:
                right += 1
    return tuple(sorted(kept))


@dataclass(frozen=True, slots=True)
class Plan:
    """What /metrics writes of one histogram series whose buckets come with given `le` texts, in the
    order they came: indices into those buckets, so a cached plan costs no parsing on the next page."""

    order: tuple[int, ...] | None = None  # the buckets written, ascending by `le`; None: all, as they came
    extra_le: str = ""  # the SLO threshold bucket's `le`; "" when none is added
    source: int = -1  # the engine bucket whose count the threshold bucket takes
    extra_at: int = -1  # where the threshold bucket goes among those written
    slo: str = ""  # the SLO judged on this family; "" when none
    state: str = ""  # STATES, for an SLO family with a readable layout
    below: float | None = None  # the engine's edges around the threshold (for the log line)
    above: float | None = None
    source_le: str = ""

    @property
    def rewrites(self) -> bool:
        return self.order is not None or bool(self.extra_le)


PASS = Plan()


def plan_for(les: Sequence[str], *, slo: str = "", threshold: float | None = None,
             limit: int | None = None) -> Plan:
    """The plan for one series whose buckets have the `le` texts `les` (in page order). `limit`:
    coarse's edge budget (None: the engine's layout). PASS when the layout cannot be read."""
    if not les:
        return PASS
    index: dict[float, int] = {}
    for i, text in enumerate(les):
        try:
            bound = float(text)
        except ValueError:
            return PASS
        if math.isnan(bound) or bound in index or bound == -math.inf:
            return PASS
        index[bound] = i
    if math.inf not in index:
        return PASS
    edges = sorted(b for b in index if b != math.inf)
    below = above = None
    if threshold is not None and slo:
        cut = bisect.bisect_right(edges, threshold * (1 + _REL))
        below = edges[cut - 1] if cut > 0 else None
        above = edges[cut] if cut < len(edges) else None
    kept = edges
    if limit is not None and len(edges) > limit:
        # The threshold, or the edge below it whose count its bucket repeats (a reader checks one against
        # the other on the same page), always among the edges kept.
        kept = list(choose_edges(edges, () if below is None else (below,), limit))
    order: tuple[int, ...] | None = (*(index[e] for e in kept), index[math.inf])
    if order == tuple(range(len(les))):
        order = None  # every bucket, already in order: written as it came
    if threshold is None or not slo:
        return Plan(order)
    if below is not None and same_edge(below, threshold):
        lower = edges.index(below)
        return Plan(order, slo=slo, state="engine", below=edges[lower - 1] if lower else None, above=above)
    if below is None:
        return Plan(order, slo=slo, state="none", above=above)
    extra_at = bisect.bisect_right(kept, threshold)
    return Plan(order, floatToGoString(threshold), index[below], extra_at, slo, "lower_edge", below, above,
                les[index[below]])


class Rebucketer:
    """Built once from the Config; `apply(samples)` is the page /metrics writes, `health()` the
    llm_exporter_slo_threshold_edge samples of the latest page."""

    def __init__(self, *, coarse: bool, max_edges: int, thresholds: Mapping[str, tuple[str, float]],
                 state_log: StateLog | None = None, slo_only: bool = False) -> None:
        """`thresholds`: histogram family -> (SLO key, threshold in its unit). `slo_only`: coarse for the
        SLO histograms only (the others are not written at all: exporter/app.py written_families)."""
        self.coarse = coarse
        self.max_edges = max_edges
        self.thresholds = dict(thresholds)
        families = {f.name for f in catalog.FAMILIES.values() if f.type == "histogram" and f.source == "engine"
                    and f.unit in COARSE_UNITS} if coarse and not slo_only else set()
        families |= set(self.thresholds)
        self._by_bucket = {name + "_bucket": name for name in families}
        self._plans: dict[tuple[str, tuple[str, ...]], Plan] = {}
        self._split: dict[Labels, tuple[Labels, str]] = {}  # a bucket's labels -> (the rest, its `le`)
        self._cached_chars = 0  # of both caches (MAX_CACHED_CHARS)
        self._states: dict[tuple[str, str], Plan] = {}
        self._log = state_log or StateLog(reasons=(LOG_REASON,))

    @classmethod
    def from_config(cls, config: Config) -> Rebucketer:
        mode = config.histogram_buckets
        if mode == "auto":  # coarse where the user asked for the fewest series
            mode = "coarse" if config.profile == "minimal" and not config.families_file else "engine"
        thresholds = {TTFT.metric: (TTFT.key, config.slo_ttft_s), TBT.metric: (TBT.key, config.slo_tbt_s)}
        if mode == "slo":  # the threshold's bucket alone: what the burn-rate rules read
            return cls(coarse=True, max_edges=1, thresholds=thresholds, slo_only=True)
        return cls(coarse=mode == "coarse", max_edges=config.histogram_buckets_max, thresholds=thresholds)

    @property
    def suppressed(self) -> Mapping[str, int]:
        return self._log.suppressed

    def plan(self, family: str, les: tuple[str, ...]) -> Plan:
        key = (family, les)
        found = self._plans.get(key)
        if found is None:
            slo, threshold = self.thresholds.get(family, ("", None))
            found = plan_for(les, slo=slo, threshold=threshold, limit=self.max_edges if self.coarse else None)
            if len(self._plans) >= MAX_PLANS:
                del self._plans[next(iter(self._plans))]
            self._charge(sum(map(len, les)) + len(les))
            self._plans[key] = found
        return found

    def _charge(self, chars: int) -> None:
        """Count the text the caches keep; past MAX_CACHED_CHARS both start over (a steady page fills
        them again in one cycle)."""
        self._cached_chars += chars
        if self._cached_chars > MAX_CACHED_CHARS:
            self._plans = {}
            self._split = {}
            self._cached_chars = chars

    def apply(self, samples: Sequence[Sample]) -> tuple[Sample, ...]:
        by_bucket = self._by_bucket
        series: dict[tuple[str, Labels], list[Sample]] = {}
        first: dict[int, tuple[str, Labels]] = {}
        touched: list[int] = []  # indices of the bucket samples this module owns
        les: dict[tuple[str, Labels], list[str]] = {}
        split = self._split
        for index, sample in enumerate(samples):
            if sample.name not in by_bucket:
                continue
            touched.append(index)
            parts = split.get(sample.labels)
            if parts is None:
                parts = (tuple(pair for pair in sample.labels if pair[0] != "le"), sample.label("le"))
                if len(split) >= MAX_SPLIT:
                    split.clear()  # a page of ever-new label sets: start over, never grow
                self._charge(sum(len(k) + len(v) for k, v in sample.labels))
                split = self._split  # _charge may have started it over
                split[sample.labels] = parts
            series_key = (sample.name, parts[0])
            members = series.get(series_key)
            if members is None:
                members = series[series_key] = []
                les[series_key] = []
                first[index] = series_key
            members.append(sample)
            les[series_key].append(parts[1])
        states: dict[tuple[str, str], Plan] = {}
        written: dict[tuple[str, Labels], list[Sample]] = {}
        for key, members in series.items():
            plan = self.plan(by_bucket[key[0]], tuple(les[key]))
            if plan.state:
                state_key = (dict(key[1]).get("target", ""), plan.slo)
                held = states.get(state_key)
                if held is None or STATES.index(plan.state) > STATES.index(held.state):
                    states[state_key] = plan
            if plan.rewrites:
                written[key] = _rewrite(members, plan)
        self._update(states)
        if not written:  # the layouts as they came: the page as it came
            return tuple(samples)
        # Every series' buckets where its first bucket was; what lies between the buckets copied in slices.
        out: list[Sample] = []
        previous = 0
        for index in touched:
            out.extend(samples[previous:index])
            previous = index + 1
            starts = first.get(index)
            if starts is not None:
                out.extend(written.get(starts) or series[starts])
        out.extend(samples[previous:])
        return tuple(out)

    def _update(self, states: dict[tuple[str, str], Plan]) -> None:
        """Keep this page's states (a target gone from the page drops out) and log each change."""
        if len(states) > MAX_TRACKED:
            states = dict(list(states.items())[:MAX_TRACKED])
        for (target, slo), plan in states.items():
            self._log.update(f"{target}\0{slo}", plan.state, LOG_REASON,
                             functools.partial(self._write, target, slo, plan), initial="engine")
        self._states = states

    def _write(self, target: str, slo: str, plan: Plan, suffix: str) -> None:
        family = next(f for f, (key, _) in self.thresholds.items() if key == slo)
        threshold = self.thresholds[family][1]
        flag = f"--slo-{slo}"
        picks = " or ".join(f"{flag} {e:g}s" for e in (plan.below, plan.above) if e is not None)
        if plan.state == "engine":
            log.info("target %s: the %s SLO threshold %gs is a bucket edge of its engine's %s again%s",
                     target, slo, threshold, family, suffix)
        elif plan.state == "lower_edge":
            log.warning("target %s: the %s SLO threshold %gs is not a bucket edge of its engine's %s (nearest edges "
                        "%gs below, %s above): /metrics adds a bucket le=\"%s\" holding the count at le=\"%s\", so "
                        "requests between %gs and %gs count as slow (the SLO never flatters). For an exact SLO pick "
                        "%s (and the same threshold in the mixin), or give the engine an edge at %gs "
                        "(%s)%s", target, slo, threshold, family, plan.below,
                        "none" if plan.above is None else f"{plan.above:g}s", plan.extra_le, plan.source_le,
                        plan.below, threshold, picks, threshold, DOCS, suffix)
        else:
            log.warning("target %s: the %s SLO threshold %gs is below every bucket edge of its engine's %s (the "
                        "lowest is %s): no bucket can count good events, so the %s SLO alerts cannot fire. Pick %s "
                        "or give the engine an edge at %gs (%s)%s", target, slo,
                        threshold, family, "none" if plan.above is None else f"{plan.above:g}s", slo,
                        picks or "a larger threshold", threshold, DOCS, suffix)

    def health(self) -> list[Sample]:
        out = []
        for (target, slo), plan in sorted(self._states.items()):
            for state in STATES:
                out.append(Sample("llm_exporter_slo_threshold_edge", labels_of(target=target, slo=slo, state=state),
                                  1.0 if state == plan.state else 0.0))
        return out


def _rewrite(members: list[Sample], plan: Plan) -> list[Sample]:
    """One series' buckets as the plan writes them, ascending by `le` (+Inf last)."""
    out = members if plan.order is None else [members[i] for i in plan.order]
    if plan.extra_le:
        source = members[plan.source]
        labels = tuple(sorted((*(p for p in source.labels if p[0] != "le"), ("le", plan.extra_le))))
        out = [*out[:plan.extra_at], Sample(source.name, labels, source.value), *out[plan.extra_at:]]
    return out
