"""One pass over a Snapshot into the small per-target and per-GPU views the derivations read.

Snapshot.values() scans every sample per call; with 4 targets x 8 GPUs and dozens of look-ups a
cycle that would cost milliseconds, so the derivations read this index instead. Only the names
listed here are kept: everything else is skipped with one set look-up per sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.snapshot import Sample, Snapshot

ENGINE_SUMS = frozenset({
    "llm_prompt_tokens_total", "llm_generation_tokens_total", "llm_prefill_seconds_total",
    "llm_decode_seconds_total", "llm_preemptions_total", "llm_requests_running", "llm_requests_waiting",
    "llm_kv_cache_capacity_tokens", "llm_requests_total",
    "llm_request_prefill_time_seconds_sum", "llm_request_decode_time_seconds_sum",
    "llm_request_prompt_tokens_sum", "llm_request_prompt_tokens_count",
    "llm_request_generation_tokens_sum", "llm_request_generation_tokens_count",
    "llm_e2e_request_latency_seconds_count", "llm_batch_prefill_time_seconds_sum",
    "llm_batch_decode_time_seconds_sum",
})
HISTOGRAMS = ("llm_time_to_first_token_seconds", "llm_inter_token_latency_seconds",
              "llm_e2e_request_latency_seconds")
_BUCKETS = frozenset(h + "_bucket" for h in HISTOGRAMS)
_HIST_SUMS = frozenset(h + "_sum" for h in HISTOGRAMS)
KV_USAGE = "llm_kv_cache_usage_ratio"
KV_CAPACITY = "llm_kv_cache_capacity_tokens"

GPU_GAUGES = frozenset({
    "llm_gpu_utilization_ratio", "llm_gpu_dram_bandwidth_utilization_ratio", "llm_gpu_sm_active_ratio",
    "llm_gpu_tensor_active_ratio", "llm_gpu_power_watts", "llm_gpu_power_limit_watts",
    "llm_gpu_energy_joules_total", "llm_gpu_temperature_celsius", "llm_gpu_sm_clock_hertz",
    "llm_gpu_sm_clock_max_hertz", "llm_gpu_pcie_tx_bytes_per_second", "llm_gpu_pcie_rx_bytes_per_second",
    "llm_gpu_nvlink_tx_bytes_per_second", "llm_gpu_nvlink_rx_bytes_per_second", "llm_gpu_memory_used_bytes",
    "llm_gpu_memory_total_bytes", "llm_gpu_up", "llm_gpu_info",
})
GPU_STATEFUL = frozenset({"llm_gpu_pcie_link_generation", "llm_gpu_pcie_link_width"})
CLOCK_EVENT = "llm_gpu_clock_event_active"
_GPU_KINDS: Mapping[str, int] = MappingProxyType(
    {**{n: 0 for n in GPU_GAUGES}, **{n: 1 for n in GPU_STATEFUL}, CLOCK_EVENT: 2})
HOST_GAUGES = frozenset({"llm_engine_process_busiest_thread_cpu_ratio", "llm_engine_numa_mismatch",
                         "llm_engine_process_found"})
HOST_CPU = "llm_host_cpu_busy_ratio"


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts summed over ranks; `bounds` ascending, +Inf last."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float | None = None


@dataclass(frozen=True, slots=True)
class EngineView:
    target: str
    source: str
    engine: str
    model: str
    sums: Mapping[str, float]  # counters and gauges summed over ranks
    histograms: Mapping[str, Histogram]
    kv_used_tokens: float | None  # sum over ranks of usage x capacity
    kv_usage_ratio: float | None  # used over capacity (or the mean reported ratio without capacity)

    def get(self, name: str) -> float | None:
        return self.sums.get(name)


@dataclass(frozen=True, slots=True)
class GpuView:
    gpu: str
    uuid: str
    name: str
    values: Mapping[str, float]
    link: Mapping[tuple[str, str], float]  # (family, state) -> value
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


@dataclass(frozen=True, slots=True)
class SnapshotView:
    taken_at: float
    engines: tuple[EngineView, ...]
    engines_down: tuple[EngineDown, ...]
    gpus: tuple[GpuView, ...]
    gpu_source: str  # "" when there is none, else "ok" or the failure reason
    host: Mapping[str, float] = field(default_factory=dict)
    host_source: str = ""


def _sort_gpu(gpu: str) -> tuple[int, str]:
    return (int(gpu), gpu) if gpu.isdigit() else (1 << 30, gpu)


def _le(text: str, cache: dict[str, float]) -> float:
    value = cache.get(text)
    if value is None:
        value = float("inf") if text == "+Inf" else float(text)
        if len(cache) < 4096:  # bucket bounds are few; the bound keeps odd input from growing it
            cache[text] = value
    return value


def _engine_view(source: str, attrs: Mapping[str, str], samples: tuple[Sample, ...],
                 le_cache: dict[str, float]) -> EngineView:
    sums: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    hist_sums: dict[str, float] = {}
    usage: dict[str, float] = {}
    capacity: dict[str, float] = {}
    model = attrs.get("model", "")
    for s in samples:
        name = s.name
        if name in ENGINE_SUMS:
            sums[name] = sums.get(name, 0.0) + s.value
            if name == KV_CAPACITY:
                capacity[s.label("rank")] = s.value
        elif name in _BUCKETS:
            bound = _le(s.label("le"), le_cache)
            per = buckets.setdefault(name[:-7], {})
            per[bound] = per.get(bound, 0.0) + s.value
        elif name == KV_USAGE:
            usage[s.label("rank")] = s.value
        elif name in _HIST_SUMS:
            hist_sums[name[:-4]] = hist_sums.get(name[:-4], 0.0) + s.value
        else:
            continue
        if not model:
            model = s.label("model")
    histograms = {}
    for hist, per in buckets.items():
        if float("inf") not in per:
            continue  # a histogram without +Inf is malformed: no total to rank against
        bounds = tuple(sorted(per))
        histograms[hist] = Histogram(bounds, tuple(per[b] for b in bounds), hist_sums.get(hist))
    kv_used: float | None = None
    kv_ratio: float | None = None
    if usage and capacity and set(usage) <= set(capacity):
        kv_used = sum(usage[r] * capacity[r] for r in usage)
        total = sum(capacity[r] for r in usage)
        kv_ratio = kv_used / total if total > 0 else None
    elif usage:
        kv_ratio = sum(usage.values()) / len(usage)
    return EngineView(
        target=attrs.get("target", source.removeprefix("engine:")),
        source=source,
        engine=attrs.get("engine", "unknown"),
        model=model,
        sums=MappingProxyType(sums),
        histograms=MappingProxyType(histograms),
        kv_used_tokens=kv_used,
        kv_usage_ratio=kv_ratio,
    )


def _gpu_views(samples: tuple[Sample, ...]) -> tuple[GpuView, ...]:
    values: dict[str, dict[str, float]] = {}
    links: dict[str, dict[tuple[str, str], float]] = {}
    reasons: dict[str, list[str]] = {}
    ident: dict[str, tuple[str, str]] = {}
    # Sources reuse one label tuple per device, so each distinct tuple is read once; keyed by
    # id() because tuple hashes are not cached and every sample here stays alive for the call.
    parsed: dict[int, dict[str, str]] = {}
    kinds = _GPU_KINDS
    for s in samples:
        kind = kinds.get(s.name)
        if kind is None or (kind == 2 and s.value < 0.5):
            continue  # inactive clock-event reasons (most of them) carry nothing to derive from
        labels = parsed.get(id(s.labels))
        if labels is None:
            labels = parsed[id(s.labels)] = dict(s.labels)
        gpu = labels.get("gpu", "")
        if kind == 0:
            values.setdefault(gpu, {})[s.name] = s.value
        elif kind == 1:
            links.setdefault(gpu, {})[(s.name, labels.get("state", ""))] = s.value
        else:
            reasons.setdefault(gpu, []).append(labels.get("reason", ""))
        if gpu not in ident:
            ident[gpu] = (labels.get("uuid", ""), labels.get("name", ""))
    views = []
    for gpu in sorted(ident, key=_sort_gpu):
        if values.get(gpu, {}).get("llm_gpu_up") == 0.0:
            continue  # a lost GPU: its other series are absent, nothing to derive from
        uuid, name = ident[gpu]
        views.append(GpuView(gpu, uuid, name, MappingProxyType(values.get(gpu, {})),
                             MappingProxyType(links.get(gpu, {})), tuple(sorted(reasons.get(gpu, ())))))
    return tuple(views)


def _host(samples: tuple[Sample, ...]) -> dict[str, float]:
    host: dict[str, float] = {}
    for s in samples:
        if s.name in HOST_GAUGES:
            host[s.name] = s.value
        elif s.name == HOST_CPU and s.label("cpu") == "all":
            host["cpu_all"] = s.value
    return host


def build_view(snapshot: Snapshot, le_cache: dict[str, float] | None = None) -> SnapshotView:
    le_cache = {} if le_cache is None else le_cache
    engines: list[EngineView] = []
    down: list[EngineDown] = []
    gpus: tuple[GpuView, ...] = ()
    gpu_source = ""
    host: dict[str, float] = {}
    host_source = ""
    for name, result in snapshot.results.items():
        kind = result.attrs.get("kind", "")
        if kind == "engine" or name.startswith("engine:"):
            if result.ok:
                engines.append(_engine_view(name, result.attrs, result.samples, le_cache))
            else:
                down.append(EngineDown(result.attrs.get("target", name.removeprefix("engine:")), name,
                                       result.error_reason or "failed"))
        elif name == "gpu" or kind == "gpu":
            gpu_source = "ok" if result.ok else (result.error_reason or "failed")
            if result.ok:
                gpus = _gpu_views(result.samples)
        elif name == "host" or kind == "host":
            host_source = "ok" if result.ok else (result.error_reason or "failed")
            if result.ok:
                host = _host(result.samples)
    engines.sort(key=lambda e: e.target)
    down.sort(key=lambda d: d.target)
    return SnapshotView(snapshot.taken_at, tuple(engines), tuple(down), gpus, gpu_source,
                        MappingProxyType(host), host_source)
