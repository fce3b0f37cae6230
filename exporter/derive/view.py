"""A Snapshot turned into the small per-target and per-GPU views the derivations read.

Snapshot.values() scans every sample per call; with 4 targets x 8 GPUs and dozens of look-ups a
cycle that would cost milliseconds, so the derivations read this index instead. Only the names
the stages declare they read are kept (ViewNeeds, the union of their needs). What each sample
of a source means (which sum, which bucket, which GPU) is worked out once per source and kept
in a ViewCache while the source's series stay the same; a cycle then only gathers values by
position (see "layouts" below).

Engine values are summed over data-parallel ranks, and also kept per series (rank) so that the
windows can tell one rank's counter reset from the others' (exporter.counters.ResetSafe).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import add, itemgetter
from types import MappingProxyType
from typing import Any, NamedTuple

from exporter.catalog import FAMILIES, family_of
from exporter.catalog.base import Family
from exporter.snapshot import Labels, Sample, Snapshot, SourceKind
from exporter.specs.gpu_faults import SOURCE_LOST_REASONS

KV_USAGE = "llm_kv_cache_usage_ratio"  # per rank, weighted by the rank's capacity
KV_CAPACITY = "llm_kv_cache_capacity_tokens"
PREFIX_HIT_RATIO = "llm_prefix_cache_hit_ratio"  # per rank, averaged
GPU_UP = "llm_gpu_up"
# Read whatever the stages need: a lost GPU (up 0) and a GPU's identity (its info series) are
# the view's own business.
VIEW_GPU = (GPU_UP, "llm_gpu_info")
# How a GPU family is read, by its catalogue labels: one value per GPU, one per value of its one
# other label (`state` current/max, an ECC `type`, an `xid` code), or the `reason`s active.
GAUGE, BY_STATE, REASONS = 0, 1, 2
GPU_LABELS = ("gpu", "uuid", "name")
HOST_ALL = ("cpu", "all")  # a host family labelled by CPU is read at its all-CPU series
LINK_LABEL = "device"  # a host family labelled by network link is read per link (LinkView)
NET_INFO = "llm_host_network_info"  # a link's kind and whether it is the engine's


class ViewNeeds(NamedTuple):
    """What the view keeps of a snapshot: the union of the stages' needs (stage.view_needs)."""

    sums: frozenset[str]  # engine samples summed over ranks (EngineView.sums)
    kv_usage: bool  # KV_USAGE, for EngineView.kv_used_tokens and kv_usage_ratio
    hit_ratio: bool  # PREFIX_HIT_RATIO, for EngineView.prefix_hit_ratio
    buckets: frozenset[str]  # `<histogram>_bucket` of the engine histograms (EngineView.histograms)
    gpu: Mapping[str, int]  # GPU family -> GAUGE, BY_STATE or REASONS
    host: frozenset[str]  # host families, one value each (HostView keys)
    host_all: frozenset[str]  # of those, the ones read at the HOST_ALL label
    host_links: frozenset[str] = frozenset()  # host families read per network link (LinkView)

    @classmethod
    def of(cls, engine: Collection[str], histograms: Collection[str], gpu: Collection[str],
           host: Collection[str]) -> ViewNeeds:
        """Every name must be in the catalogue (a KeyError otherwise: a typo is loud, not None)."""
        specials = {KV_USAGE, PREFIX_HIT_RATIO}
        for name in (*engine, *gpu, *host):
            family_named(name)
        for name in histograms:
            if FAMILIES[name].type != "histogram":
                raise ValueError(f"{name} is not a histogram family")
        kinds = {}
        for name in (*VIEW_GPU, *gpu):
            labels = FAMILIES[name].labels
            kinds[name] = REASONS if "reason" in labels else BY_STATE if _by_label(name) else GAUGE
        links = frozenset(h for h in host if LINK_LABEL in FAMILIES[h].labels)
        return cls(frozenset(engine) - specials, KV_USAGE in engine, PREFIX_HIT_RATIO in engine,
                   frozenset(h + "_bucket" for h in histograms), MappingProxyType(kinds),
                   frozenset(host) - links, frozenset(h for h in host if HOST_ALL[0] in FAMILIES[h].labels),
                   links | {NET_INFO} if links else links)


def _by_label(family: str) -> str:
    """The label that tells a GPU family's series of one GPU apart ("" for one series per GPU)."""
    extra = [label for label in FAMILIES[family].labels if label not in GPU_LABELS]
    return extra[0] if len(extra) == 1 else ""


def family_named(sample_name: str) -> Family:
    """The catalogue family of a sample name; KeyError when there is none."""
    found = family_of(sample_name)
    if found is None:
        raise KeyError(f"{sample_name} is not in the catalogue (exporter/catalog)")
    return found


# The records built every cycle (here and in the other derive modules) are NamedTuples: immutable
# like frozen dataclasses, but a frozen dataclass sets every field through object.__setattr__,
# which costs several times more per record.


class Histogram(NamedTuple):
    """Cumulative bucket counts summed over ranks; `bounds` ascending, +Inf last.

    `series`: the same counts per series (series id, counts aligned with `bounds`, 0.0 where the
    series lacks a bound) that `counts` sums, so that a reset of one data-parallel rank can be
    told from the others; None when not known (one series)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    series: tuple[tuple[str, tuple[float, ...]], ...] | None = None


class EngineView(NamedTuple):
    target: str
    source: str
    engine: str
    model: str
    sums: Mapping[str, float]  # counters and gauges summed over ranks
    histograms: Mapping[str, Histogram]
    kv_used_tokens: float | None  # sum over ranks of usage x capacity
    kv_usage_ratio: float | None  # used over capacity (or the mean reported ratio without capacity)
    # The values `sums` adds up, per (name, series id): a series id names the labels that tell a
    # name's series apart (the data-parallel `rank`, a model), "" for a lone unlabelled series.
    # Counter resets are handled per series, before the sum. None: one series per name.
    series: Mapping[tuple[str, str], float] | None = None
    ranks: int = 1  # data-parallel ranks (distinct `rank` labels; 1 without the label)
    prefix_hit_ratio: float | None = None  # mean over ranks of llm_prefix_cache_hit_ratio
    unaccounted: tuple[str, ...] = ()  # native families the engine table neither maps nor ignores
    role: str = ""  # prefill, decode or both (llm_engine_info's role); "" when the source does not say
    origin: str = ""  # host:port of the target's URL: how a router's backend is joined to it (routing.py)

    def get(self, name: str) -> float | None:
        return self.sums.get(name)


class RouterView(NamedTuple):
    """One router target's normalized samples (a few per backend: routing.py reads them as they are)."""

    target: str
    router: str
    policy: str
    samples: tuple[Sample, ...]


class GpuView(NamedTuple):
    gpu: str
    uuid: str
    name: str
    values: Mapping[str, float]
    link: Mapping[tuple[str, str], float]  # (family, its other label's value: a state, type, xid) -> value
    reasons_active: tuple[str, ...]

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    @property
    def key(self) -> str:
        return self.uuid or self.gpu


@dataclass(frozen=True, slots=True)
class EngineDown:
    target: str
    source: str
    reason: str
    message: str = ""  # what the failure said (redacted by the source; bounded): the engine's hint


class ProbeView(NamedTuple):
    """What a target's client probe (--probe) has counted so far: cumulative, like its series."""

    target: str
    up: float  # 1: its last request succeeded
    requests: float
    errors: Mapping[str, float]  # reason -> failed requests
    ttft_sum: float  # client-side TTFT of its successful requests: seconds and count
    ttft_count: float
    tokens: float = 0.0  # prompt + completion tokens of its successful requests
    in_flight: float = 0.0  # 1 while a request is on its way


# The probe families the view reads (exporter/catalog/probe.py); any other probe sample is skipped.
_PROBE_FIELDS = {"llm_probe_up": "up", "llm_probe_requests_total": "requests",
                 "llm_probe_time_to_first_token_seconds_sum": "ttft_sum",
                 "llm_probe_time_to_first_token_seconds_count": "ttft_count"}
_PROBE_TOKENS = frozenset(("llm_probe_prompt_tokens_total", "llm_probe_completion_tokens_total"))


def _probe_view(target: str, samples: tuple[Sample, ...]) -> ProbeView | None:
    """None before the probe's first request ended (it exports nothing until then)."""
    values: dict[str, float] = {}
    errors: dict[str, float] = {}
    tokens = in_flight = 0.0
    for s in samples:
        if s.name == "llm_probe_errors_total":
            errors[s.label("reason")] = s.value
        elif s.name in _PROBE_TOKENS:
            tokens += s.value
        elif s.name == "llm_probe_in_flight":
            in_flight = s.value
        elif (field_name := _PROBE_FIELDS.get(s.name)) is not None:
            values[field_name] = s.value
    if len(values) < len(_PROBE_FIELDS):
        return None
    return ProbeView(target, errors=MappingProxyType(errors), tokens=tokens, in_flight=in_flight, **values)


class LinkView(NamedTuple):
    """One network link of the host (NIC or RDMA port), from the host source's per-link families."""

    device: str
    kind: str  # ethernet | infiniband | roce; "" when its info series is missing
    engine: bool  # the host source counts it as the engine's (NUMA node, PCIe neighbours or configured)
    values: Mapping[str, float]  # family -> value; a family with a direction: the higher of the two

    def get(self, name: str) -> float | None:
        return self.values.get(name)


@dataclass(frozen=True, slots=True)
class SnapshotView:
    taken_at: float  # the wall clock: what the diagnosis shows
    engines: tuple[EngineView, ...]
    engines_down: tuple[EngineDown, ...]
    gpus: tuple[GpuView, ...]
    gpu_source: str  # "" when there is none, else "ok" or the failure reason
    host: Mapping[str, float] = field(default_factory=dict)
    host_source: str = ""
    probes: Mapping[str, ProbeView] = field(default_factory=dict)  # by engine target
    links: tuple[LinkView, ...] = ()  # network links, by device
    # GPUs the source reports lost (llm_gpu_up 0): left out of `gpus` (nothing to derive from) but
    # still a fault for the diagnosis' GPU health. Their values hold what the source still says.
    lost_gpus: tuple[GpuView, ...] = ()
    # The steady clock every window and rate is keyed by (Snapshot.now): never steps with the wall.
    now: float = 0.0
    routers: tuple[RouterView, ...] = ()  # router targets that answered this cycle, by target

    def wall(self, steady: float) -> float:
        """The wall-clock time of `steady` (a time on the `now` clock), as of this cycle."""
        return self.taken_at - (self.now - steady)


def _sort_gpu(gpu: str) -> tuple[int, str]:
    return (int(gpu), gpu) if gpu.isdigit() else (1 << 30, gpu)


# --- layouts: what each sample position of a source means, worked out once per layout ---------
#
# A source emits the same series in the same order every cycle; only the values change. Parsing
# labels (`le`, `rank`, `gpu`) and grouping samples is therefore done once per source and layout;
# each cycle only checks that the names and label tuples are unchanged (C-level tuple
# comparisons, that mostly stop at identity) and gathers the values it needs by position. Every
# sum keeps the order of the samples (0.0 + v1 + v2 ...): the results are bit-for-bit those of a
# loop over the samples.

_NAME, _LABELS, _VALUE = itemgetter(0), itemgetter(1), itemgetter(2)
_PAD = -1  # where ViewCache.read puts a 0.0 after the picked values: pads a ragged group

_Getter = Callable[[tuple], tuple]


def _getter(indices: Sequence[int]) -> _Getter:
    """The items at `indices`, as a tuple, in one C-level call."""
    if not indices:
        return lambda items: ()
    if len(indices) == 1:  # itemgetter of one index returns the bare item
        only = indices[0]
        return lambda items: (items[only],)
    return itemgetter(*indices)


@dataclass(frozen=True, slots=True)
class _Groups:
    """Keys in first-seen order, each the sum of the values at its indices, in sample order.

    Stored as layers (layer j gets each key's j-th value) so a cycle adds whole layers with map(),
    not one sample at a time. Keys with fewer values are padded with _PAD, a 0.0 added last: a
    running total that starts at 0.0 is never -0.0, so adding 0.0 leaves it unchanged."""

    keys: tuple
    layers: tuple[_Getter, ...]

    @classmethod
    def of(cls, indices: dict[Any, list[int]]) -> _Groups:
        depth = max(map(len, indices.values()), default=0)
        layers = tuple(_getter([idx[j] if j < len(idx) else _PAD for idx in indices.values()])
                       for j in range(depth))
        return cls(tuple(indices), layers)

    def totals(self, values: tuple[float, ...]) -> tuple[float, ...]:
        totals = (0.0,) * len(self.keys)
        for layer in self.layers:
            totals = tuple(map(add, totals, layer(values)))
        return totals


@dataclass(frozen=True, slots=True)
class _Latest:
    """Keys in first-seen order, each the value at its last index (a gauge per rank)."""

    keys: tuple
    values: _Getter

    @classmethod
    def of(cls, latest: dict[Any, int]) -> _Latest:
        return cls(tuple(latest), _getter(tuple(latest.values())))

    def mapping(self, values: tuple[float, ...]) -> dict:
        return dict(zip(self.keys, self.values(values), strict=True))


class _Picker:
    """Positions of the samples a layout uses; indices in the layout count only those."""

    def __init__(self) -> None:
        self.positions: list[int] = []

    def take(self, position: int) -> int:
        self.positions.append(position)
        return len(self.positions) - 1


class _HistogramLayout(NamedTuple):
    name: str
    bounds: tuple[float, ...]
    start: int  # its bucket counts are totals[start:stop]
    stop: int
    parts: tuple[tuple[str, int, int], ...] | None  # (series id, start, stop) in `series`; None: one series
    only: str  # the series id of a histogram of one series


class _EngineLayout(NamedTuple):
    pick: _Getter  # the samples used, out of the source's samples
    totals: _Groups  # every sum of the view at once: sums, then bucket counts
    sum_names: tuple[str, ...]  # totals[:len(sum_names)]
    histograms: tuple[_HistogramLayout, ...]
    series_keys: tuple[tuple[str, str], ...]  # (name, series id) of every sum's series
    # Per-series sums first (only when some name has several series: else they are the sums
    # themselves, in the same order), then the bucket counts of histograms with several series.
    series: _Groups | None
    capacity: _Latest  # per rank
    usage: _Latest  # per rank
    hit_ratio: _Latest  # per rank
    ranks: int
    model: str  # the first non-empty `model` label of a sample used, for engines without the attr


_SERIES_SKIP = frozenset({"le", "target", "engine"})  # the same on every series of a source (or a bucket's)


def _series_id(labels: Labels) -> str:
    return ",".join(f"{k}={v}" for k, v in labels if k not in _SERIES_SKIP)


def _engine_layout(samples: tuple[Sample, ...], needs: ViewNeeds) -> _EngineLayout:
    picker = _Picker()
    engine_sums, buckets_of = needs.sums, needs.buckets
    kv_usage = KV_USAGE if needs.kv_usage else None
    hit_ratio_name = PREFIX_HIT_RATIO if needs.hit_ratio else None
    sums: dict[str, list[int]] = {}
    series_sums: dict[tuple[str, str], list[int]] = {}
    capacity: dict[str, int] = {}
    usage: dict[str, int] = {}
    hit_ratio: dict[str, int] = {}
    buckets: dict[str, dict[float, list[int]]] = {}
    bucket_series: dict[str, dict[str, dict[float, list[int]]]] = {}
    bounds_of: dict[str, float] = {}  # one float per `le` text, as a cycle would see it
    ids: dict[int, str] = {}  # series id by label tuple identity (sources reuse their tuples)
    ranks: set[str] = set()
    model = ""
    for position, s in enumerate(samples):
        name = s.name
        if name in engine_sums:
            i = picker.take(position)
            sums.setdefault(name, []).append(i)
            if name == KV_CAPACITY:
                capacity[s.label("rank")] = i
        elif name in buckets_of:
            text = s.label("le")
            try:
                bound = bounds_of[text]
            except KeyError:  # a first `le` text
                bound = bounds_of[text] = float("inf") if text == "+Inf" else float(text)
            i = picker.take(position)
            buckets.setdefault(name[:-7], {}).setdefault(bound, []).append(i)
        elif name == kv_usage:
            usage[s.label("rank")] = picker.take(position)
        elif name == hit_ratio_name:
            hit_ratio[s.label("rank")] = picker.take(position)
        else:
            continue
        sid = ids.get(id(s.labels))
        if sid is None:
            sid = ids[id(s.labels)] = _series_id(s.labels)
        if name in engine_sums:
            series_sums.setdefault((name, sid), []).append(i)
        elif name in buckets_of:
            bucket_series.setdefault(name[:-7], {}).setdefault(sid, {}).setdefault(bound, []).append(i)
        ranks.add(s.label("rank"))
        if not model:
            model = s.label("model")
    groups: dict[Any, list[int]] = {("sum", name): idx for name, idx in sums.items()}
    per_series: dict[Any, list[int]] = {} if len(series_sums) == len(sums) else dict(series_sums)
    histograms = []
    for hist, per in buckets.items():
        if float("inf") not in per:
            continue  # a histogram without +Inf is malformed: no total to rank against
        bounds = tuple(sorted(per))
        start = len(groups)
        groups.update({("bucket", hist, b): per[b] for b in bounds})
        by_series = bucket_series[hist]
        parts: list[tuple[str, int, int]] = []
        if len(by_series) > 1:  # each series' counts at every bound (none: padded with 0.0)
            for sid, own in by_series.items():
                first = len(per_series)
                per_series.update({("series_bucket", hist, sid, b): own.get(b, []) for b in bounds})
                parts.append((sid, first, len(per_series)))
        histograms.append(_HistogramLayout(hist, bounds, start, len(groups), tuple(parts) if parts else None,
                                           next(iter(by_series))))
    return _EngineLayout(_getter(picker.positions), _Groups.of(groups), tuple(sums), tuple(histograms),
                         tuple(series_sums), _Groups.of(per_series) if per_series else None,
                         _Latest.of(capacity), _Latest.of(usage), _Latest.of(hit_ratio),
                         len(ranks - {""}) or 1, model)


def _engine_view(source: str, attrs: Mapping[str, str], layout: _EngineLayout, values: tuple[float, ...]
                 ) -> EngineView:
    totals = layout.totals.totals(values)
    split = len(layout.sum_names)
    sums = dict(zip(layout.sum_names, totals[:split], strict=True))
    per_series = layout.series.totals(values) if layout.series is not None else ()
    keys = layout.series_keys
    series = dict(zip(keys, per_series[:len(keys)] if len(keys) != split else totals[:split], strict=True))
    histograms = {}
    for hist, bounds, start, stop, parts, only in layout.histograms:
        counts = totals[start:stop]
        own = ((only, counts),) if parts is None else tuple((sid, per_series[a:b]) for sid, a, b in parts)
        histograms[hist] = Histogram(bounds, counts, own)
    usage = layout.usage.mapping(values)
    capacity = layout.capacity.mapping(values)
    kv_used: float | None = None
    kv_ratio: float | None = None
    if usage and capacity and set(usage) <= set(capacity):
        kv_used = sum(usage[r] * capacity[r] for r in usage)
        total = sum(capacity[r] for r in usage)
        kv_ratio = kv_used / total if total > 0 else None
    elif usage:
        kv_ratio = sum(usage.values()) / len(usage)
    hits = layout.hit_ratio.values(values) if layout.hit_ratio.keys else ()
    return EngineView(
        target=attrs.get("target", source),
        source=source,
        engine=attrs.get("engine", "unknown"),
        model=attrs.get("model", "") or layout.model,
        sums=MappingProxyType(sums),
        histograms=MappingProxyType(histograms),
        kv_used_tokens=kv_used,
        kv_usage_ratio=kv_ratio,
        series=MappingProxyType(series),
        ranks=layout.ranks,
        prefix_hit_ratio=sum(hits) / len(hits) if hits else None,
        unaccounted=tuple(attrs.get("unaccounted_families", "").split()),
        role=attrs.get("role", ""),
        origin=_origin(attrs.get("url", "")),
    )


def _origin(url: str) -> str:
    from exporter.sources.routers.normalize import backend_name

    return backend_name(url) if url else ""


@dataclass(frozen=True, slots=True)
class _GpuLayout:
    gpu: str
    gauges: _Latest  # family -> value
    link: _Latest  # (family, its other label's value) -> value
    reasons: tuple[str, ...]  # of its clock-event samples, sorted; a reason is active when >= 0.5
    reason_values: _Getter
    # Identity comes from the GPU's first sample that counts this cycle: an inactive clock event
    # does not, so the clock events before its first other sample are tried first.
    clock_idents: tuple[tuple[int, str, str], ...]  # (index, uuid, name)
    ident: tuple[str, str] | None  # (uuid, name) of its first other sample

    def identity(self, values: tuple[float, ...]) -> tuple[str, str] | None:
        for i, uuid, name in self.clock_idents:
            if not values[i] < 0.5:
                return uuid, name
        return self.ident

    def active_reasons(self, values: tuple[float, ...]) -> tuple[str, ...]:
        # Sorted already: filtering keeps the order.
        return tuple([r for r, v in zip(self.reasons, self.reason_values(values), strict=True) if not v < 0.5])


@dataclass(frozen=True, slots=True)
class _GpuSourceLayout:
    pick: _Getter  # the samples used, out of the source's samples
    gpus: tuple[_GpuLayout, ...]  # in GPU index order


def _gpu_layout(samples: tuple[Sample, ...], needs: ViewNeeds) -> _GpuSourceLayout:
    picker = _Picker()
    kinds = needs.gpu
    gauges: dict[str, dict[str, int]] = {}
    links: dict[str, dict[tuple[str, str], int]] = {}
    reasons: dict[str, list[tuple[str, int]]] = {}
    clock_idents: dict[str, list[tuple[int, str, str]]] = {}
    idents: dict[str, tuple[str, str]] = {}
    # Sources reuse one label tuple per device, so each distinct tuple is read once; keyed by
    # id() because tuple hashes are not cached and every sample here stays alive for the call.
    parsed: dict[int, dict[str, str]] = {}
    for position, s in enumerate(samples):
        kind = kinds.get(s.name)
        if kind is None:
            continue
        i = picker.take(position)
        labels = parsed.get(id(s.labels))
        if labels is None:
            labels = parsed[id(s.labels)] = dict(s.labels)
        gpu = labels.get("gpu", "")
        if kind == GAUGE:
            gauges.setdefault(gpu, {})[s.name] = i
        elif kind == BY_STATE:
            links.setdefault(gpu, {})[(s.name, labels.get(_by_label(s.name), ""))] = i
        else:
            reasons.setdefault(gpu, []).append((labels.get("reason", ""), i))
        if gpu in idents:
            continue
        if kind == REASONS:
            clock_idents.setdefault(gpu, []).append((i, labels.get("uuid", ""), labels.get("name", "")))
        else:
            idents[gpu] = (labels.get("uuid", ""), labels.get("name", ""))
    layouts = []
    for gpu in sorted(idents.keys() | clock_idents.keys(), key=_sort_gpu):
        by_reason = sorted(reasons.get(gpu, ()), key=itemgetter(0))
        layouts.append(_GpuLayout(gpu, _Latest.of(gauges.get(gpu, {})), _Latest.of(links.get(gpu, {})),
                                  tuple(r for r, _ in by_reason), _getter([i for _, i in by_reason]),
                                  tuple(clock_idents.get(gpu, ())), idents.get(gpu)))
    return _GpuSourceLayout(_getter(picker.positions), tuple(layouts))


def _gpu_views(layout: _GpuSourceLayout, values: tuple[float, ...]
               ) -> tuple[tuple[GpuView, ...], tuple[GpuView, ...]]:
    """(the GPUs up, the GPUs lost)."""
    views: list[GpuView] = []
    lost: list[GpuView] = []
    for gpu in layout.gpus:
        ident = gpu.identity(values)
        if ident is None:
            continue  # only inactive clock events this cycle: nothing to derive from
        gauges = gpu.gauges.mapping(values)
        # Inactive clock-event reasons (most of them) carry nothing to derive from.
        view = GpuView(gpu.gpu, *ident, MappingProxyType(gauges), MappingProxyType(gpu.link.mapping(values)),
                       gpu.active_reasons(values))
        # A lost GPU: its other series are absent, nothing to derive from but the fault itself.
        (lost if gauges.get(GPU_UP) == 0.0 else views).append(view)
    return tuple(views), tuple(lost)


class _Layout(NamedTuple):
    """A ViewCache record: the layout and what it was built from."""

    build: Callable[[tuple[Sample, ...]], Any]
    names: tuple[str, ...]  # of all the source's samples
    labels: tuple[Labels, ...]  # of the samples the layout uses
    layout: Any


class ViewCache:
    """The layouts build_view worked out, by source, kept between cycles (one Deriver's state).

    Which samples a layout uses depends on their names only, and what it makes of them on their
    labels: a layout is reused while the names of all the source's samples, and the label tuples
    of the samples it uses, are equal to those it was built from. Only sources of the last
    snapshot are kept, and at most `max_sources` (raised to the snapshot's source count, so
    that a large configuration never evicts the layout the same cycle needs next).
    `needs`: what the views keep (the stages' needs); a cache serves one set of needs."""

    def __init__(self, needs: ViewNeeds, max_sources: int = 64) -> None:
        self.needs = needs
        self.max_sources = max_sources
        self._layouts: dict[str, _Layout] = {}
        # Built once: read() tells a source's kind by the identity of its build function.
        self.engine_layout = partial(_engine_layout, needs=needs)
        self.gpu_layout = partial(_gpu_layout, needs=needs)
        # The GPUs the GPU source read last (up or lost): lost, all of them, while the source fails
        # for a reason that means NVML cannot open them (gpu_faults.SOURCE_LOST_REASONS).
        self.gpus_seen: tuple[GpuView, ...] = ()

    def __len__(self) -> int:
        return len(self._layouts)

    def read(self, source: str, samples: tuple[Sample, ...], build: Callable[[tuple[Sample, ...]], Any]
             ) -> tuple[Any, tuple[float, ...]]:
        """The source's layout (built again when needed) and the values of the samples it uses,
        in its order, followed by the 0.0 that _PAD points at."""
        # One column at a time: zip(*samples) would make an iterator per sample, garbage enough
        # to bring the cyclic GC round.
        names = tuple(map(_NAME, samples))
        known = self._layouts.get(source)
        if known is not None and known.build is build and known.names == names:
            layout = known.layout
            used = layout.pick(samples)
            if tuple(map(_LABELS, used)) == known.labels:
                return layout, (*map(_VALUE, used), 0.0)
        layout = build(samples)
        used = layout.pick(samples)
        self._layouts.pop(source, None)
        while len(self._layouts) >= self.max_sources:
            del self._layouts[next(iter(self._layouts))]  # the longest-standing layout goes first
        self._layouts[source] = _Layout(build, names, tuple(map(_LABELS, used)), layout)
        return layout, (*map(_VALUE, used), 0.0)

    def keep_only(self, sources: Collection[str]) -> None:
        for source in [s for s in self._layouts if s not in sources]:
            del self._layouts[source]


def _host(samples: tuple[Sample, ...], needs: ViewNeeds) -> tuple[dict[str, float], tuple[LinkView, ...]]:
    host: dict[str, float] = {}
    wanted, at_all, per_link = needs.host, needs.host_all, needs.host_links
    links: dict[str, dict[str, float]] = {}
    info: dict[str, Sample] = {}
    for s in samples:
        name = s.name
        if name in wanted:
            if name not in at_all or s.label(HOST_ALL[0]) == HOST_ALL[1]:
                host[name] = s.value
        elif name in per_link:
            device = s.label(LINK_LABEL)
            if name == NET_INFO:
                info[device] = s
                continue
            values = links.setdefault(device, {})
            values[name] = max(values.get(name, s.value), s.value)
    views = tuple(LinkView(device, info[device].label("kind") if device in info else "",
                           device in info and info[device].label("engine") == "true", MappingProxyType(values))
                  for device, values in sorted(links.items()))
    return host, views


def build_view(snapshot: Snapshot, cache: ViewCache) -> SnapshotView:
    cache.max_sources = max(cache.max_sources, len(snapshot.results))
    engines: list[EngineView] = []
    down: list[EngineDown] = []
    gpus: tuple[GpuView, ...] = ()
    lost_gpus: tuple[GpuView, ...] = ()
    gpu_source = ""
    host: dict[str, float] = {}
    host_source = ""
    links: tuple[LinkView, ...] = ()
    probes: dict[str, ProbeView] = {}
    routers: list[RouterView] = []
    for name, result in snapshot.results.items():
        kind = result.kind
        if kind is SourceKind.ENGINE:
            if result.ok:
                engines.append(_engine_view(name, result.attrs,
                                            *cache.read(name, result.samples, cache.engine_layout)))
            else:
                down.append(EngineDown(result.attrs.get("target", name), name,
                                       result.error_reason or "failed", result.error_message))
        elif kind is SourceKind.GPU:
            gpu_source = "ok" if result.ok else (result.error_reason or "failed")
            if result.ok:
                gpus, lost_gpus = _gpu_views(*cache.read(name, result.samples, cache.gpu_layout))
                cache.gpus_seen = (*gpus, *lost_gpus)
            elif gpu_source in SOURCE_LOST_REASONS:
                lost_gpus = cache.gpus_seen
        elif kind is SourceKind.HOST:
            host_source = "ok" if result.ok else (result.error_reason or "failed")
            if result.ok:
                host, links = _host(result.samples, cache.needs)
        elif kind is SourceKind.ROUTER and result.ok:
            routers.append(RouterView(result.attrs.get("target", name), result.attrs.get("router", ""),
                                      result.attrs.get("policy", ""), result.samples))
        elif kind is SourceKind.PROBE and result.ok:
            target = result.attrs.get("target", name)
            if (probe := _probe_view(target, result.samples)) is not None:
                probes[target] = probe
    cache.keep_only(snapshot.results)
    engines.sort(key=lambda e: e.target)
    down.sort(key=lambda d: d.target)
    return SnapshotView(snapshot.taken_at, tuple(engines), tuple(down), gpus, gpu_source,
                        MappingProxyType(host), host_source, MappingProxyType(probes), links, lost_gpus, snapshot.now,
                        tuple(sorted(routers, key=lambda r: r.target)))
