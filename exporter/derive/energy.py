"""Energy per generated token and cost per million generated tokens.

J/token = GPU power of the target's GPUs (rate of llm_gpu_energy_joules_total, else the power
gauge) / decode tokens/s. Cost per 1M tokens = price per GPU-hour x GPUs / 3600 / decode
tokens/s x 1e6. Both are omitted while nothing is generated (no made-up infinity).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, ScopedWindows, Stage, TargetKey, rounded
from exporter.derive.view import GpuView, SnapshotView
from exporter.derive.window import RateWindow
from exporter.snapshot import Sample

ENERGY = "llm_gpu_energy_joules_total"
POWER = "llm_gpu_power_watts"


class Energy(NamedTuple):
    power_watts: float | None = None
    power_source: str = ""
    joules_per_token: float | None = None
    cost_per_million: float | None = None


def joules_per_token(power_watts: float, decode_tps: float) -> float | None:
    return power_watts / decode_tps if decode_tps > 0 else None


def cost_per_million_tokens(price_per_gpu_hour: float, gpus: int, decode_tps: float) -> float | None:
    if decode_tps <= 0 or gpus <= 0:
        return None
    return price_per_gpu_hour * gpus / 3600.0 / decode_tps * 1e6


def target_power(gpus: Sequence[GpuView], energy_rate: Callable[[GpuView], float | None]) -> tuple[float | None, str]:
    """Sum of the GPUs' power; energy-counter rates when every GPU has one (they average over the
    whole window, the gauge is one instant), else the power gauges."""
    rates = [energy_rate(g) for g in gpus]
    if gpus and all(r is not None for r in rates):
        return sum(r for r in rates if r is not None), "energy counter"
    gauges = [g.get(POWER) for g in gpus]
    if gpus and all(p is not None for p in gauges):
        return sum(p for p in gauges if p is not None), "power gauge"
    return None, ""


def compute(gpus: Sequence[GpuView], energy_rate: Callable[[GpuView], float | None], decode_tps: float | None,
            price_per_gpu_hour: float | None, gpu_count: int) -> Energy:
    power, source = target_power(gpus, energy_rate)
    jpt = joules_per_token(power, decode_tps) if power is not None and decode_tps is not None else None
    cost = None
    if price_per_gpu_hour is not None and decode_tps is not None:
        cost = cost_per_million_tokens(price_per_gpu_hour, gpu_count, decode_tps)
    return Energy(power, source, jpt, cost)


def samples(energy: Energy, key: TargetKey) -> list[Sample]:
    labels = key.labels
    out = []
    if energy.joules_per_token is not None:
        out.append(Sample("llm_energy_joules_per_token", labels, energy.joules_per_token))
    if energy.cost_per_million is not None:
        out.append(Sample("llm_cost_per_million_tokens", labels, energy.cost_per_million))
    return out


def numbers(energy: Energy) -> dict[str, Any]:
    return dict(power_watts=rounded(energy.power_watts, 1), joules_per_token=rounded(energy.joules_per_token),
                cost_per_million_tokens=rounded(energy.cost_per_million))


class GpuRates(ScopedWindows):
    """The energy counter's rate per GPU, observed once a cycle for every GPU (whichever targets
    share it), forgotten a while after the GPU went."""

    def __init__(self, settings: DeriveSettings) -> None:
        super().__init__(settings, lambda: RateWindow(settings.rate_window_s))

    def begin(self, view: SnapshotView) -> None:
        for gpu in view.gpus:
            joules = gpu.values.get(ENERGY)
            if joules is not None:
                self.windows.get(gpu.key).observe(view.now, {ENERGY: joules}, {})

    def rate(self, gpu: GpuView) -> float | None:
        return self.windows.get(gpu.key).rate(ENERGY)


def _compute(ctx: Ctx, state: GpuRates) -> Energy:
    thr = ctx.get("throughput")
    decode = thr.decode_tps if thr is not None else None
    gpu_count = len(ctx.gpus) or ctx.tp * ctx.dp
    return compute(ctx.gpus, state.rate, decode, ctx.settings.gpu_price_per_hour, gpu_count)


STAGE = Stage(
    name="energy", compute=_compute, samples=samples, numbers=numbers, state=GpuRates, after=("throughput",),
    emits=("llm_energy_joules_per_token", "llm_cost_per_million_tokens"),
    gpu=(ENERGY, POWER),
)
