"""Roofline position: achieved HBM bandwidth per GPU (modelled and GPM-measured) and prefill MFU.

Modelled, per GPU:  decode steps/s x (weight bytes read per step + KV bytes read per step) / GPUs.
Every decode step streams the weights once whatever the batch (batching shares that read) plus
the KV cache of every running sequence; tensor parallelism splits both over the TP GPUs. With
data-parallel ranks (each a full copy of the weights on its own TP GPUs, all summed in one
engine view) every rank streams its own copy for its share of the batch, so a step of all ranks
reads DP x the weights and the bytes spread over TP x DP GPUs.
Measured: GPM DRAM_BW_UTIL x the card's peak. The gap between the two is what the model does not
explain (prefill traffic, activations, a wrong shape, another process on the GPU).
Prefill MFU = prefill FLOPs per computed prompt token x computed prompt tokens/s / (GPUs x peak
dense FLOPS of the type the matmuls run in). Computed prompt tokens are the prompt tokens less
the prefix-cache hits (throughput.computed_prefill). FLOPs per computed token come from
specs.models.prefill_flops at the window's mean prompt length (matmuls of the layers, attention
over the earlier tokens including the cached prefix, one output projection per prompt); without
a mean prompt length (no finished requests in the window, or an engine without the prompt-length
histogram) they fall back to 2 x active parameters per token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from exporter.derive.kv import KvCache
from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, ScopedWindows, Stage, TargetKey, rounded
from exporter.derive.throughput import Throughput
from exporter.derive.view import GpuView
from exporter.derive.window import RateWindow
from exporter.snapshot import Sample
from exporter.specs.gpus import GpuSpec
from exporter.specs.models import (
    ModelShape,
    active_params,
    flops_per_token,
    kv_bytes_per_token,
    prefill_flops,
    weight_bytes_read_per_step,
)


def decode_bytes_per_step(shape: ModelShape, batch: float, kv_tokens: float, ranks: int = 1,
                          kv_token_bytes: float | None = None) -> float:
    """Bytes one decode step reads from HBM over all GPUs: weights once per data-parallel rank
    (MoE: the experts that rank's share of the batch routes to) plus the KV cache of the running
    sequences (`batch` and `kv_tokens` summed over the ranks). `kv_token_bytes`: the KV stage's
    bytes per token (the engine's own when it says), else the model shape's."""
    ranks = max(1, ranks)
    tokens = max(1, round(batch / ranks))
    per_token = kv_bytes_per_token(shape) if kv_token_bytes is None else kv_token_bytes
    return ranks * weight_bytes_read_per_step(shape, tokens) + kv_tokens * per_token


def modelled_bandwidth_per_gpu(steps_per_s: float, bytes_per_step: float, gpus: int) -> float:
    """`gpus`: the GPUs the step's bytes spread over (TP x data-parallel ranks)."""
    return steps_per_s * bytes_per_step / max(gpus, 1)


def single_sequence_ceiling(shape: ModelShape, bandwidth_bytes_per_s: float, tp: int = 1) -> float:
    """Upper bound on one sequence's decode tokens/s: every token reads all the weights it uses
    once (the seeds' 70B FP16 on 2 TB/s -> ~14.6 tokens/s). For MoE that is the active
    parameters (the routed experts), not all of them."""
    return bandwidth_bytes_per_s * max(tp, 1) / (active_params(shape) * shape.dtype_bytes)


def peak_flops(spec: GpuSpec, shape: ModelShape) -> float:
    """Dense tensor peak of the type the matmuls run in (ModelShape.matmul_kind).

    FP8 W8A8 (and W4A4 FP4, for which the table has no column: FP8 is the closest roof it has)
    uses the FP8 peak where the card has FP8. INT8 W8A8 runs on the INT8 tensor cores: as fast as
    FP8 on the cards that have FP8 (Ada, Hopper, Blackwell), twice BF16 on Ampere. Weight-only
    schemes (AWQ, GPTQ, bitsandbytes: 4- or 8-bit weights) dequantize to BF16/FP16 and multiply
    there, so they, like unquantized models, get the BF16 dense peak."""
    kind = shape.matmul_kind
    if kind in ("fp8", "fp4") and spec.fp8_dense_flops:
        return spec.fp8_dense_flops
    if kind == "int8":
        return spec.fp8_dense_flops or 2.0 * spec.bf16_dense_flops
    return spec.bf16_dense_flops


def prefill_flops_per_token(shape: ModelShape, mean_prompt: float | None = None, cached_share: float = 0.0
                            ) -> float:
    """FLOPs per computed prompt token for prompts of `mean_prompt` tokens of which `cached_share`
    came from the prefix cache: prefill_flops over the uncached suffix, which attends to the
    cached prefix too. Without a mean prompt length: 2 x active parameters (the old estimate: it
    counts the embedding gather as a matmul and leaves attention out)."""
    if mean_prompt is None or mean_prompt < 1.0:
        return 2.0 * active_params(shape)
    cached = mean_prompt * min(max(cached_share, 0.0), 1.0)
    new = max(1.0, mean_prompt - cached)
    return prefill_flops(shape, new, start=min(cached, mean_prompt - 1.0)) / new


def prefill_mfu(shape: ModelShape, prefill_tps: float, total_peak_flops: float, mean_prompt: float | None = None,
                cached_share: float = 0.0) -> float:
    """`prefill_tps`: prompt tokens/s the GPUs compute (prefix-cache hits excluded)."""
    return prefill_flops_per_token(shape, mean_prompt, cached_share) * prefill_tps / total_peak_flops


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
    engine_bandwidth: float | None = None  # bytes/s the engine itself estimates for each GPU
    engine_flops: float | None = None  # FLOP/s likewise

    @property
    def engine_ratio(self) -> float | None:
        if self.engine_bandwidth is None or not self.peak_bandwidth:
            return None
        return self.engine_bandwidth / self.peak_bandwidth

    @property
    def engine_flops_ratio(self) -> float | None:
        if self.engine_flops is None or not self.peak_flops:
            return None
        return self.engine_flops / self.peak_flops

    @property
    def model_ratio(self) -> float | None:
        if self.model_bandwidth is None or not self.peak_bandwidth:
            return None
        return self.model_bandwidth / self.peak_bandwidth


class Roofline(NamedTuple):
    gpus: tuple[GpuRoof, ...]
    mfu: float | None = None


def compute(gpus: Sequence[GpuView], specs: Sequence[GpuSpec | None], shape: ModelShape | None, tp: int,
            thr: Throughput | None, kv: KvCache | None, ranks: int = 1,
            gpm: Mapping[str, float | None] | None = None) -> Roofline:
    """`tp`: GPUs per data-parallel rank; `ranks`: data-parallel ranks summed in `thr` and `kv`;
    `gpm`: each GPU's (GpuView.key) DRAM bandwidth ratio over the rate window (None: this cycle's)."""
    ranks = max(1, ranks)
    steps = thr.steps_per_s if thr is not None else None
    batch = thr.mean_batch if thr is not None else None
    kv_tokens = kv.used_tokens if kv is not None else None
    per_step = None
    if shape is not None and steps is not None and batch is not None:
        per_step = decode_bytes_per_step(shape, batch, kv_tokens or 0.0, ranks,
                                         kv.bytes_per_token if kv is not None else None)
    spread = max(tp, 1) * ranks
    flops_step = None
    if shape is not None and batch is not None and batch > 0:
        context = (kv.mean_context if kv is not None else None) or 0.0
        flops_step = max(1.0, batch) * flops_per_token(shape, context)
    roofs = []
    for gpu, spec in zip(gpus, specs, strict=True):
        peak_bw = spec.mem_bandwidth_bytes_per_s if spec is not None else None
        peak_fl = peak_flops(spec, shape) if spec is not None and shape is not None else (
            spec.bf16_dense_flops if spec is not None else None)
        gpm_ratio = gpu.get(DRAM_BW) if gpm is None else gpm.get(gpu.key)
        model_bw = modelled_bandwidth_per_gpu(steps, per_step, spread) if per_step is not None and steps is not None \
            else None
        intensity = flops_step / per_step if flops_step is not None and per_step else None
        achieved = steps * flops_step / spread if steps is not None and flops_step is not None else None
        roofs.append(GpuRoof(
            gpu=gpu.gpu, name=gpu.name, peak_bandwidth=peak_bw, peak_flops=peak_fl,
            model_bandwidth=model_bw if peak_bw else None,
            gpm_bandwidth=gpm_ratio * peak_bw if gpm_ratio is not None and peak_bw else None,
            gpm_ratio=gpm_ratio, intensity=intensity, achieved_flops=achieved,
            # Each data-parallel rank reports its own GPUs' figure and the view sums the ranks.
            engine_bandwidth=thr.engine_bytes_per_gpu / ranks if thr and thr.engine_bytes_per_gpu is not None
            else None,
            engine_flops=thr.engine_flops_per_gpu / ranks if thr and thr.engine_flops_per_gpu is not None else None,
        ))
    mfu = None
    known = [s for s in specs if s is not None]
    computed = thr.prefill_computed_tps if thr is not None else None
    if computed is None and thr is not None:
        computed = thr.prefill_tps  # a Throughput built without the split: no prefix cache known
    if shape is not None and thr is not None and computed is not None and known and len(known) == len(specs):
        total = sum(peak_flops(s, shape) for s in known)
        mfu = prefill_mfu(shape, computed, total, thr.mean_prompt_tokens, thr.prefix_hit_share or 0.0) \
            if total > 0 else None
    return Roofline(tuple(roofs), mfu)


DRAM_BW = "llm_gpu_dram_bandwidth_utilization_ratio"


def samples(roof: Roofline, key: TargetKey) -> list[Sample]:
    target, engine = key.target, key.engine
    out: list[Sample] = []
    for g in roof.gpus:
        for source, bw, ratio in (("model", g.model_bandwidth, g.model_ratio), ("gpm", g.gpm_bandwidth, g.gpm_ratio),
                                  ("engine", g.engine_bandwidth, g.engine_ratio)):
            # sorted by name (test_derive_stages)
            labels = (("engine", engine), ("gpu", g.gpu), ("source", source), ("target", target))
            if bw is not None:
                out.append(Sample("llm_hbm_bandwidth_bytes_per_second", labels, bw))
            if ratio is not None and (source == "gpm" or bw is not None):
                out.append(Sample("llm_hbm_bandwidth_efficiency_ratio", labels, ratio))
        if g.engine_flops_ratio is not None:
            out.append(Sample("llm_engine_flops_utilization_ratio",
                              (("engine", engine), ("gpu", g.gpu), ("target", target)), g.engine_flops_ratio))
    if roof.mfu is not None:
        out.append(Sample("llm_prefill_mfu_ratio", key.labels, roof.mfu))
    return out


def numbers(roof: Roofline) -> dict[str, Any]:
    engine_bw = [g.engine_ratio for g in roof.gpus if g.engine_ratio is not None]
    engine_fl = [g.engine_flops_ratio for g in roof.gpus if g.engine_flops_ratio is not None]
    return {"prefill_mfu": rounded(roof.mfu),
            "engine_hbm_ratio": rounded(sum(engine_bw) / len(engine_bw)) if engine_bw else None,
            "engine_flops_ratio": rounded(sum(engine_fl) / len(engine_fl)) if engine_fl else None}


def _gpm_windows(settings: DeriveSettings) -> ScopedWindows:
    """GPM's DRAM bandwidth is a mean between two collections (1 s); the modelled figure divides the
    steps of the rate window (15 s and more). Compared cycle by cycle they disagree by the second's
    noise (57% against 74% seen in decode-heavy), so GPM is averaged over the same window."""
    return ScopedWindows(settings, lambda: RateWindow(settings.rate_window_s))


def _compute(ctx: Ctx, state: ScopedWindows) -> Roofline | None:
    if not ctx.gpus and ctx.shape is None:
        return None  # nothing to place on a roofline
    window: RateWindow = state.windows.get(ctx.engine.target)
    now = {g.key: v for g in ctx.gpus if (v := g.get(DRAM_BW)) is not None}
    window.observe(ctx.now, {}, now)
    specs = [ctx.spec_for(g.name) for g in ctx.gpus]
    return compute(ctx.gpus, specs, ctx.shape, ctx.tp, ctx.get("throughput"), ctx.get("kv"), ctx.dp,
                   {key: window.mean(key) for key in now})


STAGE = Stage(
    name="roofline", compute=_compute, samples=samples, numbers=numbers, after=("throughput", "kv"),
    emits=("llm_hbm_bandwidth_bytes_per_second", "llm_hbm_bandwidth_efficiency_ratio",
           "llm_prefill_mfu_ratio", "llm_engine_flops_utilization_ratio"),
    gpu=(DRAM_BW,), state=_gpm_windows,
)
