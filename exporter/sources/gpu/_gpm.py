"""GPM (GPU Performance Monitoring, Hopper and newer): metrics from two samples of one GPU.

NVML computes every GPM metric from the counter deltas between two samples, which must be more
than 100 ms apart. Instead of sleeping between two samples inside a cycle, each cycle takes one
sample and pairs it with the one kept from an earlier cycle. Two sample buffers per GPU are
allocated once and rotated; both are freed when the GPU's NVML generation ends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

MIB = 1024.0 * 1024.0


@dataclass(frozen=True, slots=True)
class GpmMetric:
    constant: str  # pynvml constant name
    fallback_id: int  # its value, for bindings too old to name it
    family: str
    percent: bool  # NVML gives 0..100 (divided to a 0..1 ratio); else MiB/s (multiplied to bytes/s)


RATIO_METRICS = (
    GpmMetric("NVML_GPM_METRIC_DRAM_BW_UTIL", 10, "llm_gpu_dram_bandwidth_utilization_ratio", True),
    GpmMetric("NVML_GPM_METRIC_SM_UTIL", 2, "llm_gpu_sm_active_ratio", True),
    GpmMetric("NVML_GPM_METRIC_SM_OCCUPANCY", 3, "llm_gpu_sm_occupancy_ratio", True),
    GpmMetric("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, "llm_gpu_tensor_active_ratio", True),
)
PCIE_METRICS = (  # MiB/s in NVML
    GpmMetric("NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, "llm_gpu_pcie_tx_bytes_per_second", False),
    GpmMetric("NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, "llm_gpu_pcie_rx_bytes_per_second", False),
)
NVLINK_METRICS = (
    GpmMetric("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61, "llm_gpu_nvlink_tx_bytes_per_second", False),
    GpmMetric("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60, "llm_gpu_nvlink_rx_bytes_per_second", False),
)


@dataclass(frozen=True, slots=True)
class GpmResult:
    values: dict[str, float]  # family -> value in base units
    failed: dict[str, int]  # family -> nvmlReturn of a metric NVML could not compute


class GpmSampler:
    """One GPU's GPM state across cycles. Not thread-safe: the source serialises cycles."""

    def __init__(self, nvml: Any, handle: Any, metrics: tuple[GpmMetric, ...], min_interval_s: float = 0.1):
        self._nvml = nvml
        self._handle = handle
        self._metrics = metrics
        self._ids = tuple(getattr(nvml, m.constant, m.fallback_id) for m in metrics)
        self._min_interval_s = min_interval_s
        self._prev: Any = None
        self._prev_t = 0.0
        self._spare: Any = None
        self._request: Any = None

    def sample(self, now: float) -> GpmResult | None:
        """Take a sample at `now`; return metrics when the kept sample is old enough, else None.

        NVML errors propagate to the caller, which decides whether the GPU is lost."""
        nvml = self._nvml
        if self._spare is None:
            self._spare = nvml.nvmlGpmSampleAlloc()
        current = self._spare
        nvml.nvmlGpmSampleGet(self._handle, current)
        if self._prev is None:
            self._prev, self._prev_t, self._spare = current, now, None
            return None
        if now - self._prev_t < self._min_interval_s:
            # Too close to the kept sample (a fast cycle): keep the older one so the next pair is
            # far enough apart; `current` is overwritten next time.
            return None
        try:
            return self._compute(self._prev, current)
        finally:
            self._spare, self._prev, self._prev_t = self._prev, current, now

    def _compute(self, older: Any, newer: Any) -> GpmResult:
        nvml = self._nvml
        request = self._request
        if request is None:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self._ids)
            for i, metric_id in enumerate(self._ids):
                request.metrics[i].metricId = metric_id
            self._request = request
        request.sample1 = older
        request.sample2 = newer
        nvml.nvmlGpmMetricsGet(request)
        values: dict[str, float] = {}
        failed: dict[str, int] = {}
        for i, metric in enumerate(self._metrics):
            entry = request.metrics[i]
            if entry.nvmlReturn == 0:
                value = float(entry.value)
                values[metric.family] = value / 100.0 if metric.percent else value * MIB
            else:
                failed[metric.family] = int(entry.nvmlReturn)
        return GpmResult(values, failed)

    def close(self) -> None:
        """Free both buffers. Errors are ignored: the library may already be gone."""
        for sample in (self._prev, self._spare):
            if sample is None:
                continue
            with contextlib.suppress(Exception):  # teardown: the library may already be gone
                self._nvml.nvmlGpmSampleFree(sample)
        self._prev = self._spare = self._request = None
