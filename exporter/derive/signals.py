"""The bottleneck stage: the Signals the verdict reads, gathered from the earlier stages and the
GPUs' health (links, throttling, clocks), then bottleneck.py's rules and hysteresis.

bottleneck.py holds the rules alone (pure functions of Signals, which dashboards/ read too); this
module is what ties them to a target's view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import exporter.derive.bottleneck as bottleneck
from exporter.derive.bottleneck import Hysteresis, Signals
from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, NotYet, Stage, StageState, TargetKey
from exporter.derive.view import GpuView, SnapshotView
from exporter.snapshot import Sample
from exporter.sources.engines.registry import SPECS
from exporter.specs.gpus import GpuSpec, pcie_bytes_per_s

UTIL = "llm_gpu_utilization_ratio"
TENSOR = "llm_gpu_tensor_active_ratio"
LINK_GEN, LINK_WIDTH = "llm_gpu_pcie_link_generation", "llm_gpu_pcie_link_width"
PCIE_TX, PCIE_RX = "llm_gpu_pcie_tx_bytes_per_second", "llm_gpu_pcie_rx_bytes_per_second"
NVLINK_TX, NVLINK_RX = "llm_gpu_nvlink_tx_bytes_per_second", "llm_gpu_nvlink_rx_bytes_per_second"
SM_CLOCK, SM_CLOCK_MAX = "llm_gpu_sm_clock_hertz", "llm_gpu_sm_clock_max_hertz"
TEMPERATURE = "llm_gpu_temperature_celsius"
POWER_LIMIT, POWER_DEFAULT = "llm_gpu_power_limit_watts", "llm_gpu_power_default_limit_watts"
LOWERED_LIMIT = 0.98  # an enforced limit below this share of the default was lowered by someone
CLOCK_EVENT = "llm_gpu_clock_event_active"  # read as the GPU's active reasons (GpuView.reasons_active)
BUSIEST_THREAD = "llm_engine_process_busiest_thread_cpu_ratio"
NUMA_MISMATCH = "llm_engine_numa_mismatch"
HOST_CPU = "llm_host_cpu_busy_ratio"  # its cpu="all" series
BUSY_UTILIZATION = 0.05  # a GPU below this, with gpu_idle active, is idle: its links and clocks say nothing


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def gpu_health(gpus: Sequence[GpuView], spec_for: Callable[[str], GpuSpec | None]) -> dict[str, Any]:
    """Link state, link load, throttle reasons, clocks and temperature of the target's GPUs."""
    degraded: list[str] = []
    throttles: list[str] = []
    capped: list[str] = []
    envelope: list[str] = []
    clock_ratios, temps = [], []
    link_util, link_what = None, ""
    severe, power_cap = bottleneck.SEVERE_REASONS, bottleneck.POWER_CAP
    for g in gpus:
        get = g.values.get  # g.get() without a Python call per name
        busy = (get(UTIL) or 0.0) >= BUSY_UTILIZATION or "gpu_idle" not in g.reasons_active
        gen = g.link.get((LINK_GEN, "current"))
        gen_max = g.link.get((LINK_GEN, "max"))
        width = g.link.get((LINK_WIDTH, "current"))
        width_max = g.link.get((LINK_WIDTH, "max"))
        if busy and gen is not None and width is not None and gen_max is not None and width_max is not None \
                and (gen < gen_max or width < width_max):
            degraded.append(f"GPU{g.gpu} gen{gen:.0f} x{width:.0f} (max gen{gen_max:.0f} x{width_max:.0f})")
        if gen is not None and width is not None and 1 <= gen <= 6 and width > 0:
            capacity = pcie_bytes_per_s(int(gen), int(width))
            traffic = max(get(PCIE_TX) or 0.0, get(PCIE_RX) or 0.0)
            if traffic > 0 and (link_util is None or traffic / capacity > link_util):
                link_util, link_what = traffic / capacity, f"GPU{g.gpu} PCIe traffic"
        spec = spec_for(g.name)
        nvlink_cap = spec.nvlink_unidirectional_bytes_per_s if spec is not None else None
        nvl = max(get(NVLINK_TX) or 0.0, get(NVLINK_RX) or 0.0)
        if nvlink_cap and nvl > 0 and (link_util is None or nvl / nvlink_cap > link_util):
            link_util, link_what = nvl / nvlink_cap, f"GPU{g.gpu} NVLink traffic"
        for reason in g.reasons_active:
            if reason in severe and busy:
                throttles.append(f"GPU{g.gpu} {reason}")
            elif reason == power_cap and busy:
                _power_cap(g, spec, capped, envelope)
        clock, clock_max = get(SM_CLOCK), get(SM_CLOCK_MAX)
        if busy and clock and clock_max:
            clock_ratios.append(clock / clock_max)
        temp = get(TEMPERATURE)
        if temp is not None:
            temps.append(temp)
    return {"degraded_links": tuple(degraded), "throttles": tuple(throttles), "power_capped": tuple(capped),
            "power_envelope": tuple(envelope),
            "clock_ratio": min(clock_ratios) if clock_ratios else None,
            "temperature": max(temps) if temps else None,
            "link_util": link_util, "link_util_what": link_what}


def _power_cap(g: GpuView, spec: GpuSpec | None, capped: list[str], envelope: list[str]) -> None:
    """sw_power_cap at the board's default limit is the card at its own power envelope: dense math on
    an H100/H200 reaches it at the default 700 W (seen on a real H200: tensor cores 93% active, SM clock
    79% of max). Only a limit someone lowered is a constraint with a fix."""
    limit, default = g.values.get(POWER_LIMIT), g.values.get(POWER_DEFAULT)
    what = "default"
    if default is None and spec is not None:
        default, what = spec.tdp_watts, "rated"
    if limit is None or default is None:
        capped.append(f"GPU{g.gpu} (power limit or its default unknown)")
    elif limit < LOWERED_LIMIT * default:
        capped.append(f"GPU{g.gpu} at {limit:.0f} W, below its {what} {default:.0f} W")
    else:
        envelope.append(f"GPU{g.gpu} at its {what} {limit:.0f} W limit")


def gather(ctx: Ctx) -> Signals:
    """What the verdict reads for one target, from the earlier stages' results and the view."""
    thr, kvc, roof, gpus = ctx.get("throughput"), ctx.get("kv"), ctx.get("roofline"), ctx.gpus
    moved = ctx.get("transfer")
    tails = ctx.get("quantiles") or {}
    host = ctx.view.host
    values: dict[str, Any] = gpu_health(gpus, ctx.spec_for)
    values["tp"] = ctx.tp
    values["gpus_known"] = bool(gpus)
    if thr is not None:
        values["running"], values["waiting"], values["mean_batch"] = thr.running, thr.waiting, thr.mean_batch
        values["prefill_tps"], values["decode_tps"] = thr.prefill_tps, thr.decode_tps
        values["prefill_share"], values["time_source"] = thr.prefill_share, thr.time_source
        values["preemptions_per_s"] = thr.preemptions_per_s
        values["prefix_hit_share"] = thr.prefix_hit_share
        values["mean_waiting"], values["peak_running"] = thr.mean_waiting, thr.peak_running
        values["running_cap"] = thr.running_cap
        values["probe_tps"], values["probe_running"] = thr.probe_tps, thr.probe_running
        values["probe_mean_running"] = thr.probe_mean_running
    if kvc is not None:
        values["kv_usage"], values["kv_headroom"] = kvc.usage_ratio, kvc.headroom_sequences
    if roof is not None:
        values["hbm_gpm"] = _mean([g.gpm_ratio for g in roof.gpus])
        values["hbm_model"] = _mean([g.model_ratio for g in roof.gpus])
        values["hbm_engine"] = _mean([g.engine_ratio for g in roof.gpus])
        values["mfu"] = roof.mfu
    values["tensor_active"] = _mean([g.values.get(TENSOR) for g in gpus])
    values["gpu_util"] = _mean([g.values.get(UTIL) for g in gpus])
    values["busiest_thread"] = host.get(BUSIEST_THREAD)
    values["cpu_all"] = host.get(HOST_CPU)
    if NUMA_MISMATCH in host:
        values["numa_mismatch"] = host[NUMA_MISMATCH] >= 0.5
    if moved is not None:
        spec = SPECS.get(ctx.engine.engine)
        values.update(role=moved.role, kv_waiting=moved.waiting,
                      waiting_has_kv=bool(spec is not None and spec.waiting_includes_kv_transfer),
                      kv_transfer_share=moved.share,
                      kv_transfer_p50=moved.transfer_p50, kv_failures_per_s=moved.failures_per_s,
                      spans=moved.spans, spans_parallel=moved.parallel, net_util=moved.link_util,
                      net_util_what=moved.link_what,
                      net_down=moved.links_down, net_errors=moved.link_errors)
    routed = ctx.get("routing")
    if routed:
        # The router that gives this replica the largest share speaks for the others.
        top = max(routed, key=lambda r: r.backend.share or 0.0)
        rotation = top.router.rotation
        values.update(routing_router=top.router.words(), routing_share=top.backend.share,
                      routing_fair=1.0 / len(rotation) if rotation else None, routing_skew=top.router.skew,
                      routing_busiest=top.busiest, routing_idle=top.idle, routing_queues=top.queues())
    for kind, p99, attainment, bound in (("ttft", "ttft_p99", "ttft_attainment", "ttft_bound"),
                                         ("tbt", "tbt_p99", "tbt_attainment", "tbt_bound")):
        tail = tails.get(kind)
        if tail is not None:
            values[p99] = tail.quantile(0.99)
            values[attainment], values[bound] = tail.slo_attainment, tail.slo_bound
    return Signals(**values)


class Decision(NamedTuple):
    """The bottleneck stage's result for one target."""

    signals: Signals
    scores: Mapping[str, float]  # per resource (the evidence is worded for the diagnosis only)
    verdict: str
    rule: str
    state: Hysteresis  # the standing verdict after this cycle (its `since` goes into the diagnosis)


class Verdicts(StageState):
    """The standing verdict per target (hysteresis), dropped when the target is gone."""

    def __init__(self, settings: DeriveSettings) -> None:
        self.hold_cycles = settings.verdict_hold_cycles
        self.by_target: dict[str, Hysteresis] = {}

    def end(self, view: SnapshotView) -> None:
        live = {e.target for e in view.engines} | {d.target for d in view.engines_down}
        for target in [t for t in self.by_target if t not in live]:
            del self.by_target[target]


def decide(ctx: Ctx, state: Verdicts) -> Decision:
    signals = gather(ctx)
    scores = bottleneck.scores(signals)
    target = ctx.engine.target
    standing = state.by_target.get(target) or Hysteresis()
    raw, rule = bottleneck.raw_verdict(signals, scores, standing.verdict)
    if not raw:
        raise NotYet(rule)
    standing = bottleneck.settle(standing, raw, ctx.now, state.hold_cycles)
    state.by_target[target] = standing
    assert standing.verdict is not None
    if standing.verdict != raw:
        rule = f"held: {raw} wins; {standing.verdict} stays until it lost {state.hold_cycles} cycles in a row"
    return Decision(signals, scores, standing.verdict, rule, standing)


def samples(decision: Decision, key: TargetKey) -> list[Sample]:
    return bottleneck.samples(key.target, decision.verdict, decision.scores, key.engine)


STAGE = Stage(
    name="bottleneck", compute=decide, samples=samples, state=Verdicts,
    after=("routing", "throughput", "kv", "roofline", "quantiles", "transfer"),
    emits=("llm_bottleneck", "llm_bottleneck_score"),
    gpu=(UTIL, TENSOR, LINK_GEN, LINK_WIDTH, PCIE_TX, PCIE_RX, NVLINK_TX, NVLINK_RX, SM_CLOCK, SM_CLOCK_MAX,
         TEMPERATURE, CLOCK_EVENT, POWER_LIMIT, POWER_DEFAULT),
    host=(BUSIEST_THREAD, NUMA_MISMATCH, HOST_CPU),
)
