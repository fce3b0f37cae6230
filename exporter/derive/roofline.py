"""Roofline position: achieved HBM bandwidth per GPU (modelled and GPM-measured) and prefill MFU.

Modelled, per GPU:  decode steps/s x (weight bytes read per step + KV bytes read per step) / TP.
Every decode step streams the weights once whatever the batch (batching shares that read) plus
the KV cache of every running sequence; tensor parallelism splits both over the TP GPUs.
Measured: GPM DRAM_BW_UTIL x the card's peak. The gap between the two is what the model does not
explain (prefill traffic, activations, a wrong shape, another process on the GPU).
Prefill MFU = 2 x active params x prefill tokens/s / (GPUs x peak dense FLOPS).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from exporter.derive.kv import KvCache
from exporter.derive.throughput import Throughput
from exporter.derive.view import GpuView
from exporter.snapshot import Sample, labels_of
from exporter.specs.gpus import GpuSpec
from exporter.specs.models import (
    ModelShape,
    active_params,
    flops_per_token,
    kv_bytes_per_token,
    weight_bytes,
    weight_bytes_read_per_step,
)


def decode_bytes_per_step(shape: ModelShape, batch: float, kv_tokens: float) -> float:
    """Bytes one decode step reads from HBM over all GPUs: weights once (MoE: the experts the
    batch routes to) plus the KV cache of the running sequences."""
    tokens = max(1, round(batch))
    return weight_bytes_read_per_step(shape, tokens) + kv_tokens * kv_bytes_per_token(shape)


def modelled_bandwidth_per_gpu(steps_per_s: float, bytes_per_step: float, tp: int) -> float:
    return steps_per_s * bytes_per_step / max(tp, 1)


def single_sequence_ceiling(shape: ModelShape, bandwidth_bytes_per_s: float, tp: int = 1) -> float:
    """Upper bound on one sequence's decode tokens/s: every token reads all weights once
    (the seeds' 70B FP16 on 2 TB/s -> ~14.6 tokens/s)."""
    return bandwidth_bytes_per_s * max(tp, 1) / weight_bytes(shape)


def peak_flops(spec: GpuSpec, shape: ModelShape) -> float:
    """FP8 tensor peak for 8-bit (or smaller) weights where the card has FP8, else BF16 dense."""
    if shape.dtype_bytes <= 1.0 and spec.fp8_dense_flops:
        return spec.fp8_dense_flops
    return spec.bf16_dense_flops


def prefill_mfu(shape: ModelShape, prefill_tps: float, total_peak_flops: float) -> float:
    return 2.0 * active_params(shape) * prefill_tps / total_peak_flops


class GpuRoof(NamedTuple):
    gpu: str
    name: str
    peak_bandwidth: float | None
    peak_flops: float | None
    model_bandwidth: float | None = None
    gpm_bandwidth: float | None = None
    gpm_ratio: float | None = None
    intensity: float | None = None  # decode FLOPs per HBM byte
    achieved_flops: float | None = None  # decode FLOP/s on this GPU (modelled)

    @property
    def model_ratio(self) -> float | None:
        if self.model_bandwidth is None or not self.peak_bandwidth:
            return None
        return self.model_bandwidth / self.peak_bandwidth

    @property
    def ridge(self) -> float | None:
        """Arithmetic intensity where the bandwidth roof meets the compute roof."""
        if not self.peak_bandwidth or not self.peak_flops:
            return None
        return self.peak_flops / self.peak_bandwidth


class Roofline(NamedTuple):
    gpus: tuple[GpuRoof, ...]
    mfu: float | None = None
    decode_bytes_per_step: float | None = None
    kv_read_known: bool = True


def compute(gpus: Sequence[GpuView], specs: Sequence[GpuSpec | None], shape: ModelShape | None, tp: int,
            thr: Throughput | None, kv: KvCache | None) -> Roofline:
    steps = thr.steps_per_s if thr is not None else None
    batch = thr.mean_batch if thr is not None else None
    kv_tokens = kv.used_tokens if kv is not None else None
    per_step = None
    if shape is not None and steps is not None and batch is not None:
        per_step = decode_bytes_per_step(shape, batch, kv_tokens or 0.0)
    flops_step = None
    if shape is not None and batch is not None and batch > 0:
        context = (kv.mean_context if kv is not None else None) or 0.0
        flops_step = max(1.0, batch) * flops_per_token(shape, context)
    roofs = []
    for gpu, spec in zip(gpus, specs, strict=True):
        peak_bw = spec.mem_bandwidth_bytes_per_s if spec is not None else None
        peak_fl = peak_flops(spec, shape) if spec is not None and shape is not None else (
            spec.bf16_dense_flops if spec is not None else None)
        gpm = gpu.get("llm_gpu_dram_bandwidth_utilization_ratio")
        model_bw = modelled_bandwidth_per_gpu(steps, per_step, tp) if per_step is not None and steps is not None \
            else None
        intensity = flops_step / per_step if flops_step is not None and per_step else None
        achieved = steps * flops_step / max(tp, 1) if steps is not None and flops_step is not None else None
        roofs.append(GpuRoof(
            gpu=gpu.gpu, name=gpu.name, peak_bandwidth=peak_bw, peak_flops=peak_fl,
            model_bandwidth=model_bw if peak_bw else None,
            gpm_bandwidth=gpm * peak_bw if gpm is not None and peak_bw else None,
            gpm_ratio=gpm, intensity=intensity, achieved_flops=achieved,
        ))
    mfu = None
    known = [s for s in specs if s is not None]
    if shape is not None and thr is not None and thr.prefill_tps is not None and known and len(known) == len(specs):
        total = sum(peak_flops(s, shape) for s in known)
        mfu = prefill_mfu(shape, thr.prefill_tps, total) if total > 0 else None
    return Roofline(tuple(roofs), mfu, per_step, kv_tokens is not None)


def samples(roof: Roofline, target: str, model: str) -> list[Sample]:
    out: list[Sample] = []
    for g in roof.gpus:
        for source, bw, ratio in (("model", g.model_bandwidth, g.model_ratio), ("gpm", g.gpm_bandwidth, g.gpm_ratio)):
            labels = (("gpu", g.gpu), ("source", source), ("target", target))  # sorted by name
            if bw is not None:
                out.append(Sample("llm_hbm_bandwidth_bytes_per_second", labels, bw))
            if ratio is not None and (source == "gpm" or bw is not None):
                out.append(Sample("llm_hbm_bandwidth_efficiency_ratio", labels, ratio))
    if roof.mfu is not None:
        out.append(Sample("llm_prefill_mfu_ratio", labels_of(target=target, model=model), roof.mfu))
    return out
