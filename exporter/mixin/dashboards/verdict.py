"""Where the bottleneck verdict's scores cross its thresholds, read from exporter/derive/bottleneck.py.

The dashboards draw these values as threshold lines, so a line sits exactly where the verdict code
changes its mind: the roofs' ramps come from the module's constants (a roof needs ROOF_MIN, a
constraint CONSTRAINT_MIN), and the host_cpu ramp, which has no named constants, is found by
asking bottleneck.scores() itself (bisection over the busiest-thread share).
"""

from __future__ import annotations

from exporter.derive import bottleneck

ROOF_MIN = bottleneck.ROOF_MIN
CONSTRAINT_MIN = bottleneck.CONSTRAINT_MIN
HBM_LOW, HBM_HIGH = bottleneck.HBM_LOW, bottleneck.HBM_HIGH
MFU_LOW, MFU_HIGH = bottleneck.MFU_LOW, bottleneck.MFU_HIGH


def ramp_input(score: float, low: float, high: float) -> float:
    """The input at which bottleneck.ramp(x, low, high) reaches `score`."""
    return round(low + score * (high - low), 4)


def crossing(resource: str, signal: str, score: float, **fixed: object) -> float:
    """The smallest value of Signals.<signal> (0..1, the other signals as in `fixed`) at which
    bottleneck.scores() gives `resource` at least `score`."""

    def at(x: float) -> float:
        return bottleneck.scores(bottleneck.Signals(**{signal: x}, **fixed))[resource]  # type: ignore[arg-type]

    lo, hi = 0.0, 1.0
    if at(hi) < score:
        raise ValueError(f"{resource} never reaches {score} through {signal}")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if at(mid) >= score else (mid, hi)
    return round(hi, 3)


# HBM share of peak (the verdict reads GPM's DRAM_BW_UTIL when the GPU has it, else the model).
HBM_ROOF = ramp_input(ROOF_MIN, HBM_LOW, HBM_HIGH)
# Prefill MFU.
MFU_ROOF = ramp_input(ROOF_MIN, MFU_LOW, MFU_HIGH)
# The engine's busiest thread (share of one core), with no roof at 0.8 and no NUMA mismatch.
HOST_THREAD_START = crossing("host_cpu", "busiest_thread", 1e-4)
HOST_THREAD_VERDICT = crossing("host_cpu", "busiest_thread", CONSTRAINT_MIN)
HOST_THREAD_FULL = crossing("host_cpu", "busiest_thread", 1.0)


# The network between servers (bottleneck._network): an engine link's utilization, KV transfer's share of
# TTFT and the requests waiting for a KV transfer, where interconnect reaches a constraint verdict.
NET_UTIL_VERDICT = ramp_input(CONSTRAINT_MIN, bottleneck.NET_UTIL_LOW, bottleneck.NET_UTIL_HIGH)
KV_SHARE_VERDICT = ramp_input(CONSTRAINT_MIN, bottleneck.KV_SHARE_LOW, bottleneck.KV_SHARE_HIGH)
KV_QUEUE_VERDICT = bottleneck.KV_QUEUE_LOW


def pct(ratio: float) -> str:
    """0.305 -> '30.5%', 0.44 -> '44%'."""
    return f"{round(ratio * 100, 2):g}%"
