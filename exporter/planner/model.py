"""The planner's model: a configuration (device, parallelism, dtypes, limits), its calibrated step cost
and a replay of a workload through the twin's engine (exporter/simulator/engine.py).

Calibration fits four numbers of the twin's roofline (exporter/physics/costs.py) to the observed
points: the fraction of the device's peak memory bandwidth a decode step reaches, the fractions of its
peak FLOPs decode and prefill reach, and the per-step overhead. A candidate keeps the fractions (same
engine, same kernels) and changes the physics: bytes per weight, FLOPs peak for the dtype, GPUs,
threads, limits, traffic. On a device the spec table does not know (a CPU), the fractions are of a
nominal peak and only mean something on that same device.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.physics.costs import (
    PRIOR_EFFICIENCY,
    PRIOR_OVERHEAD_S,
    Hardware,
    decode_batch,
    prefill_batch,
    step_cost,
)
from exporter.planner.limits import MAX_CPU_THREADS, MAX_PLAN_CPU_S, MAX_REPLAY_ARRIVALS, MAX_REPLAY_CPU_S
from exporter.planner.observe import Point
from exporter.probe.loadtest_stats import percentile
from exporter.simulator.engine import Engine, EngineConfig, HostConfig, Request, StepRecord, kv_pool_blocks
from exporter.simulator.workload import LengthDist, Workload
from exporter.specs.gpus import GpuSpec, known_gpus, lookup_gpu
from exporter.specs.models import FP4, FP8, INT8, WEIGHT_ONLY, ModelShape, weight_bytes

GiB = 1 << 30


class PlanError(ValueError):
    """A candidate or an input the planner cannot use; one line, exit 2."""


@dataclass(frozen=True, slots=True)
class DType:
    bytes: float  # per element, with the block scales of the format
    quantization: str  # ModelShape.quantization: which matmul the weights run on


# Declared once: `--dtype`, `dtype=`, `kv_dtype=`, the docs and the JSON read this table. GGUF block
# formats carry one fp16 scale per 32 weights (Q8_0: 34 bytes per 32, Q4_0: 18 per 32).
DTYPES: Mapping[str, DType] = {
    "f32": DType(4.0, "none"), "f16": DType(2.0, "none"), "bf16": DType(2.0, "none"),
    "fp8": DType(1.0, FP8), "int8": DType(1.0, INT8), "fp4": DType(0.5625, FP4),
    # GGUF blocks: llama.cpp dequantizes per block inside its dot products; no faster FLOPs peak is assumed
    # (its integer kernels were measured both faster and slower than F16 on the same CPU: docs/planner.md).
    "q8_0": DType(34 / 32, WEIGHT_ONLY), "q4_0": DType(18 / 32, WEIGHT_ONLY),
    "int4": DType(0.53, WEIGHT_ONLY), "awq": DType(0.53, WEIGHT_ONLY), "gptq": DType(0.53, WEIGHT_ONLY),
}
KV_DTYPES: Mapping[str, float] = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "fp8": 1.0, "q8_0": 34 / 32,
                                  "q4_0": 18 / 32}

# A device the spec table does not know (the CPU a llama.cpp or vLLM-CPU engine runs on): nominal peaks
# per core (a server core streams about 25 GB/s and issues two 8-wide FP32 FMAs a cycle), so that
# calibrated fractions stay near 0..1 and cores scale both; the socket's memory channels cap the
# bandwidth. The per-step overhead (scheduling, sampling) runs on one thread and does not scale.
CPU_NOMINAL_BANDWIDTH = 200e9
CPU_NOMINAL_BANDWIDTH_PER_THREAD = 25e9
CPU_NOMINAL_FLOPS_PER_THREAD = 100e9
CPU_MEMORY_BYTES = 64 * GiB
PRIOR_HOST_S = 0.5e-3  # per request: the twin's API server (exporter/simulator/engine.py HostConfig)
PRIOR_WEIGHT = 1e-3  # of the pull to the priors in the calibration's score (squared log ratios)
IDLE_POWER_SHARE = 0.3  # of TDP, for the energy estimate: a serving GPU idles near a third of its TDP


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    kind: str  # gpu | cpu
    bandwidth: float  # peak bytes/s per device
    flops: float  # peak dense 16-bit FLOP/s per device (all threads for a CPU)
    fp8_flops: float | None
    memory_bytes: int
    tdp_w: float | None
    threads: int = 0  # CPU: the engine's threads
    spec: GpuSpec | None = None

    def peak_flops(self, model: ModelShape) -> float:
        if model.matmul_kind in ("fp8", "int8", "fp4") and self.fp8_flops:
            return self.fp8_flops
        return self.flops


def gpu_device(name: str) -> Device:
    spec = lookup_gpu(name)
    if spec is None:
        known = ", ".join(g.key for g in known_gpus())
        raise PlanError(f"unknown GPU {name!r}: one of {known} (or a name NVML reports for one)")
    return Device(spec.display, "gpu", spec.mem_bandwidth_bytes_per_s, spec.bf16_dense_flops, spec.fp8_dense_flops,
                  spec.memory_bytes, spec.tdp_watts, spec=spec)


def cpu_device(threads: int, free_cores: float | None = None) -> Device:
    """A CPU engine's device. Each thread streams memory and computes on its own core; threads past
    the cores free for the engine (`free_cores`: the host's, less what else runs there, such as a load
    generator) time-share them and add nothing."""
    if not 1 <= threads <= MAX_CPU_THREADS:
        raise PlanError(f"threads {threads}: 1..{MAX_CPU_THREADS}")
    cores = float(threads) if free_cores is None else max(1.0, min(float(threads), free_cores))
    name = f"CPU ({threads} threads)" if cores == threads else f"CPU ({threads} threads, {cores:.2g} cores free)"
    return Device(name, "cpu", min(CPU_NOMINAL_BANDWIDTH, CPU_NOMINAL_BANDWIDTH_PER_THREAD * cores),
                  CPU_NOMINAL_FLOPS_PER_THREAD * cores, None, CPU_MEMORY_BYTES, None, threads)


@dataclass(frozen=True, slots=True)
class Setup:
    """One configuration of the deployment: what a candidate changes."""

    device: Device
    model: ModelShape
    tp: int = 1
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    price_per_gpu_hour: float | None = None

    def with_dtype(self, dtype: str | None, kv_dtype: str | None) -> Setup:
        model = self.model
        if dtype is not None:
            d = DTYPES[dtype]
            model = dataclasses.replace(model, dtype_bytes=d.bytes, quantization=d.quantization)
        if kv_dtype is not None:
            model = dataclasses.replace(model, kv_dtype_bytes=KV_DTYPES[kv_dtype])
        return dataclasses.replace(self, model=model)


@dataclass(frozen=True, slots=True)
class Calibration:
    bw: float  # fraction of peak bandwidth decode steps reach
    compute: float  # fraction of peak FLOPs decode reaches
    prefill: float  # fraction of peak FLOPs prefill reaches
    overhead_s: float  # per step
    # Host time per request before it can be scheduled (API server: HTTP, chat template, tokenizer);
    # the twin's API server is one thread, so this queues under load.
    host_s: float = PRIOR_HOST_S
    ci: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # 95% intervals
    # Observed decode batch -> its steps' ratio to the roofline (costs.Hardware.decode_batch_factors).
    batch_factors: tuple[tuple[float, float], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"bandwidth_efficiency": _r(self.bw), "decode_compute_efficiency": _r(self.compute),
                "prefill_compute_efficiency": _r(self.prefill), "step_overhead_seconds": _r(self.overhead_s, 6),
                "host_seconds_per_request": _r(self.host_s, 6),
                "ci95": {k: [_r(lo), _r(hi)] for k, (lo, hi) in self.ci.items()},
                "decode_batch_factors": [[_r(b, 2), _r(f)] for b, f in self.batch_factors]}


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def hardware(setup: Setup, cal: Calibration) -> Hardware:
    dev = setup.device
    if dev.spec is not None:
        spec = dataclasses.replace(dev.spec, bf16_dense_flops=dev.peak_flops(setup.model))
    else:
        spec = GpuSpec(key="cpu", display=dev.name, nvml_name=dev.name, memory_bytes=dev.memory_bytes,
                       memory_type="DDR", mem_bandwidth_bytes_per_s=dev.bandwidth,
                       bf16_dense_flops=dev.peak_flops(setup.model),
                       fp8_dense_flops=None, nvlink_bytes_per_s=None, pcie_gen=4, pcie_width=16, tdp_watts=0.0,
                       max_sm_clock_hz=1e9, max_mem_clock_hz=1e9)
    return Hardware(gpu=spec, tp=setup.tp, bw_efficiency=cal.bw, compute_efficiency=cal.compute,
                    prefill_efficiency=cal.prefill, step_overhead_s=cal.overhead_s,
                    decode_batch_factors=cal.batch_factors)


def engine_config(setup: Setup) -> EngineConfig:
    cpu = setup.device.kind == "cpu"
    return EngineConfig(max_num_seqs=setup.max_num_seqs, max_batched_tokens=setup.max_batched_tokens,
                        gpu_memory_utilization=setup.gpu_memory_utilization,
                        cuda_context_bytes=0 if cpu else GiB // 2,
                        activation_reserve_bytes=GiB // 4 if cpu else 2 * GiB)


def fit_check(setup: Setup) -> tuple[int, float]:
    """KV capacity in tokens and the weights' share of the device memory; PlanError when the weights
    do not fit."""
    hw = hardware(setup, Calibration(1.0, 1.0, 1.0, 0.0))
    blocks = kv_pool_blocks(hw, setup.model, engine_config(setup))
    share = weight_bytes(setup.model) / setup.tp / setup.device.memory_bytes
    if blocks < 1:
        raise PlanError(f"{setup.model.name} at {setup.model.dtype_bytes:g} bytes/weight "
                        f"({weight_bytes(setup.model) / GiB:.1f} GiB) does not fit on {setup.tp} x {setup.device.name} "
                        f"({setup.device.memory_bytes / GiB:.0f} GiB each): more GPUs (tp=) or a smaller dtype")
    return blocks * engine_config(setup).block_size, share


# --- closed form: one step ----------------------------------------------------------------------------

def decode_step_s(setup: Setup, cal: Calibration, batch: float, context: float) -> float:
    b = max(1, round(batch))
    return step_cost(hardware(setup, cal), setup.model, decode_batch(b, int(context))).time_s


def prefill_s(setup: Setup, cal: Calibration, prompt: float) -> float:
    return step_cost(hardware(setup, cal), setup.model, prefill_batch(max(1, int(prompt)))).time_s


def _decode_batch(point: Point, setup: Setup) -> float:
    return max(1.0, min(point.in_flight or point.level, setup.max_num_seqs))


def _context(point: Point) -> float:
    return point.prompt_tokens + point.output_tokens / 2


# --- calibration --------------------------------------------------------------------------------------

GRID = [math.exp(math.log(1e-4) + i * (math.log(4.0) - math.log(1e-4)) / 120) for i in range(121)]
# Per-step overhead from 10 us (a CUDA graph) to 50 ms (a CPU engine's scheduler and sampling).
OVERHEAD_GRID = [math.exp(math.log(1e-5) + i * (math.log(5e-2) - math.log(1e-5)) / 24) for i in range(25)]
TIE_WEIGHT = 1e-4  # of the priors among splits the points fit equally well: below any real misfit
# A per-batch factor is the last resort, for what no one roofline fits: it costs ten times a prior's pull.
FACTOR_WEIGHT = 10.0


def _between(grid: Sequence[float], i: int) -> list[float]:
    """Finer values between grid[i]'s neighbours."""
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    return [lo * (hi / lo) ** (k / 8) for k in range(9)]


def calibrate(setup: Setup, points: Sequence[Point], *, refine: bool = True, seed: int = 0,
              prefix_hit_rate: float = 0.0) -> Calibration:
    """Fit the step cost to the points: closed form on each point's mean decode batch, then corrected
    by a search that replays the points through the twin (queueing, prefill interleaving) with the
    prefix-cache hits observed, as the current rows and the candidates replay them."""
    if not points:
        raise PlanError("nothing observed to calibrate on")
    obs = [(p, p.tpot.centre) for p in points if p.tpot.centre]
    if not obs:
        raise PlanError("no observed TPOT to calibrate on")

    cal = _fit(setup, points, obs)
    if refine:
        # The closed form costs pure decode steps; an observed TPOT also carries the prefills its steps
        # shared and the queueing the replay shows. Take those out as the twin sees them, fit again, then
        # search prefill and host time and settle the per-batch factors, all by replaying every point.
        stall = []
        for p, _ in obs:
            replayed = _replay_point(setup, cal, p, seed, prefix_hit_rate)
            pred = replayed.centre("tpot", p.tpot.kind, p.tpot.mean_over)
            step = decode_step_s(setup, cal, _decode_batch(p, setup), _context(p))
            # An open loop the first fit cannot keep up with (its prefill read from a TTFT that also
            # queued) runs a batch that grows without end: its steps say nothing of the point's.
            kept_up = p.mode != "rate" or replayed.requests_per_s >= 0.9 * p.requests_per_s
            stall.append(pred / step if pred and step > 0 and kept_up else 1.0)
        cal = _fit(setup, points, [(p, t / r) for (p, t), r in zip(obs, stall, strict=True)])
        cal = _batch_factors(setup, points, _refine(setup, points, cal, seed, prefix_hit_rate), seed, prefix_hit_rate)
        # The factors' level moved into the decode fractions (_fold), which steps that carry a prefill
        # also run at: the prefill and host time are searched again on them, each trial with its decode
        # settled, and the factors settled last.
        cal = _refine(setup, points, cal, seed, prefix_hit_rate, settle=True)
        cal = _batch_factors(setup, points, cal, seed, prefix_hit_rate)
    rse_t = max((p.tpot.rse() for p in points), default=0.0)
    rse_f = max((p.ttft.rse() for p in points), default=0.0)
    ci = {"bandwidth_efficiency": _interval(cal.bw, rse_t), "decode_compute_efficiency": _interval(cal.compute, rse_t),
          "prefill_compute_efficiency": _interval(cal.prefill, rse_f),
          "host_seconds_per_request": (cal.host_s * max(0.0, 1 - 1.96 * rse_f), cal.host_s * (1 + 1.96 * rse_f))}
    return dataclasses.replace(cal, ci=ci)


def _replay_point(setup: Setup, cal: Calibration, point: Point, seed: int, prefix: float) -> Prediction:
    """A point replayed as the calibration scores it: its own traffic, with the prefix-cache hits seen.
    Without them every prompt prefilled in full and the fit came out 9% fast on a window with a fifth
    of each prompt cached (tests/planner_twin.py)."""
    return replay(setup, cal, point, workload=workload_for(point, prefix_hit_rate=prefix), seed=seed)


def _fit(setup: Setup, points: Sequence[Point], obs: Sequence[tuple[Point, float]]) -> Calibration:
    """The closed form: decode steps (`obs`: points and their pure decode step times) on a grid of
    splits, then the prefill efficiency on the TTFTs."""
    prior_overhead = PRIOR_OVERHEAD_S[setup.device.kind]
    batches = _by_batch(setup, obs)

    def decode_fit(bw: float, comp: float, overhead: float) -> tuple[float, dict[float, float]]:
        """The misfit and the per-batch factors of one split. Each observed batch gets the factor that
        fits its steps (kernels change with the batch: costs.Hardware.decode_batch_factors); the points
        then fix the level per batch, not how it divides into memory, compute and the per-step
        overhead. Of the splits that fit, the one closest to the priors wins (factors near 1 above all,
        then the prior's bandwidth-to-compute ratio and overhead), so an unobserved dtype, thread count
        or batch scales from the observed ones the way the device's peaks say."""
        cal = Calibration(bw, comp, comp, overhead)
        err, prior, factors = 0.0, 0.0, {}
        for b, group in batches.items():
            roofs = [(decode_step_s(setup, cal, b, _context(p)) - overhead, t) for p, t in group]
            if any(t <= overhead * 1.02 for _, t in roofs):
                return math.inf, {}  # the overhead alone would outlast an observed step
            f = _clamp(math.exp(sum(math.log((t - overhead) / r) for r, t in roofs) / len(roofs)))
            factors[b] = f
            err += sum(math.log((overhead + f * r) / t) ** 2 for r, t in roofs)
            prior += FACTOR_WEIGHT * math.log(f) ** 2
        prior += (math.log((bw / PRIOR_EFFICIENCY["bw"]) / (comp / PRIOR_EFFICIENCY["compute"])) ** 2
                  + math.log(overhead / prior_overhead) ** 2)
        return err + TIE_WEIGHT * prior, factors

    # Coarse grid, then a finer one around the best; no fraction of a known GPU's peak above 1.
    grid = [g for g in GRID if g <= 1.0] if setup.device.kind == "gpu" else GRID
    best = min((decode_fit(bw, c, o)[0], bw, c, o) for bw in grid[::4] for c in grid[::4] for o in OVERHEAD_GRID)
    if not math.isfinite(best[0]):
        raise PlanError("the observed TPOTs are shorter than any per-step overhead the planner can fit")
    i_bw, i_c = grid.index(best[1]), grid.index(best[2])
    fine = [grid[j] for j in range(max(0, i_bw - 4), min(len(grid), i_bw + 5))]
    fine_c = [grid[j] for j in range(max(0, i_c - 4), min(len(grid), i_c + 5))]
    fine_o = _between(OVERHEAD_GRID, OVERHEAD_GRID.index(best[3]))
    _, bw, comp, overhead = min((decode_fit(b, c, o)[0], b, c, o) for b in fine for c in fine_c for o in fine_o)
    factors = tuple(sorted(decode_fit(bw, comp, overhead)[1].items()))

    # A TTFT is the prefill alone only where nothing queues: read it at the lightest load observed (the
    # replay search then fits the rest).
    timed = [(p, p.ttft.centre) for p in points if p.ttft.centre]
    lightest = [(p, ttft) for p, ttft in timed if p.in_flight <= 1.5 * min(q.in_flight for q, _ in timed)]

    def prefill_error(eff: float) -> float:
        cal = Calibration(bw, comp, eff, overhead, batch_factors=factors)
        err = sum((math.log(prefill_s(setup, cal, p.prompt_tokens) / ttft)) ** 2 for p, ttft in lightest)
        # A short prompt's prefill can be memory-bound: every efficiency above some value fits as well;
        # the prior breaks the tie instead of the grid's first value.
        return err + TIE_WEIGHT * math.log(eff / PRIOR_EFFICIENCY["prefill"]) ** 2
    prefill = min(GRID, key=prefill_error) if lightest else comp
    return Calibration(bw, comp, prefill, overhead, batch_factors=factors)


SEARCH_FACTORS = (1.41, 1.19, 1.09, 1.04)
SEARCH_PASSES = 6  # moves per factor at most: the closed form starts near the answer


def _refine(setup: Setup, points: Sequence[Point], cal: Calibration, seed: int, prefix: float, *,
            settle: bool = False) -> Calibration:
    """Coordinate search on the prefill efficiency and the host time per request, each move scored by
    replaying every point through the twin: the closed form cannot see requests queueing for the API
    server or a slot, or prompts waiting behind each other; the replay does. With `settle`, each trial's
    decode steps are first settled to its points' TPOT (one round of _batch_factors): prefill chunks
    share the decode steps, so a slower prefill reads as slower decode, and a search that held the
    decode fixed stopped where the two traded off (the demo's decode-heavy window: prefill 0.41 of peak
    where the twin runs 0.6, TTFT +43%)."""
    def trial_of(c: Calibration) -> Calibration:
        return _batch_factors(setup, points, c, seed, prefix, rounds=1) if settle else c

    def score(c: Calibration) -> float:
        total = 0.0
        for p in points:
            pred = _replay_point(setup, c, p, seed, prefix)
            for which, stat in (("tpot", p.tpot), ("ttft", p.ttft)):
                value = pred.centre(which, stat.kind, stat.mean_over)
                if value and stat.centre:
                    total += math.log(value / stat.centre) ** 2
        # A parameter the points cannot see (a prefill too short to be compute-bound) would wander; a weak
        # pull to the prior keeps it where the twin has it, far below any real misfit.
        prior = math.log(c.prefill / PRIOR_EFFICIENCY["prefill"]) ** 2 + math.log(c.host_s / PRIOR_HOST_S) ** 2
        return total + PRIOR_WEIGHT * prior

    best = score(cal)
    for factor in SEARCH_FACTORS:
        for _ in range(SEARCH_PASSES):
            # Every parameter both ways from the same point; the best move wins the pass.
            trials = [dataclasses.replace(cal, **{name: getattr(cal, name) * f})
                      for name in ("prefill", "host_s") for f in (factor, 1 / factor)]
            if setup.device.kind == "gpu":  # a known peak cannot be beaten
                trials = [t for t in trials if max(t.bw, t.compute, t.prefill) <= 1.0]
            if not trials:
                break
            value, trial = min(((score(t), t) for t in map(trial_of, trials)), key=lambda vt: vt[0])
            if value >= best - 1e-9:
                break
            cal, best = trial, value
    return cal




FACTOR_ROUNDS = 3
FACTOR_RANGE = (0.25, 4.0)


def _batch_factors(setup: Setup, points: Sequence[Point], cal: Calibration, seed: int, prefix: float, *,
                   rounds: int = FACTOR_ROUNDS) -> Calibration:
    """Per observed decode batch, the ratio of its observed TPOT to the replayed one, on the roofline
    part of the step (the overhead is the same at every batch): one roofline cannot follow kernels
    that change with the batch, and Vidur profiles each batch size for that reason. Points at the
    same batch share one factor (geometric mean); a few rounds settle the factors against each other
    through the replay."""
    by_batch = _by_batch(setup, [(p, p.tpot.centre) for p in points if p.tpot.centre])
    if not by_batch:
        return cal
    factors = dict(cal.batch_factors)
    factors.update({b: 1.0 for b in by_batch if b not in factors})
    for _ in range(rounds):
        trial = dataclasses.replace(cal, batch_factors=tuple(sorted(factors.items())))
        for b, group in by_batch.items():
            logs = []
            for p, seen in group:
                pred = _replay_point(setup, trial, p, seed, prefix).centre("tpot", p.tpot.kind, p.tpot.mean_over)
                if pred:
                    o = cal.overhead_s
                    logs.append(math.log((seen - o) / (pred - o)) if min(seen, pred) > 2 * o
                                else math.log(seen / pred))
            if logs:
                factors[b] = _clamp(factors[b] * math.exp(sum(logs) / len(logs)))
        cal, factors = _fold(setup, cal, factors)
    return dataclasses.replace(cal, batch_factors=tuple(sorted(factors.items())))


def _fold(setup: Setup, cal: Calibration, factors: dict[float, float]) -> tuple[Calibration, dict[float, float]]:
    """The factors' common level moves into the decode fractions of peak: a factor is for kernels that
    change between batches, and applies to pure decode steps only. A level left in it would run the
    steps that carry a prefill at the wrong speed, and a candidate that moves the bandwidth-to-compute
    balance (another GPU) would scale the wrong part. What the GPU's peak (1) leaves over stays."""
    level = math.exp(sum(math.log(f) for f in factors.values()) / len(factors))
    scale = level
    if setup.device.kind == "gpu":
        scale = max(level, cal.bw, cal.compute) if level < 1 else level  # no fraction past 1
    if abs(math.log(scale)) < 1e-6:
        return cal, factors
    cal = dataclasses.replace(cal, bw=cal.bw / scale, compute=cal.compute / scale)
    return cal, {b: _clamp(f / scale) for b, f in factors.items()}


def _by_batch(setup: Setup, obs: Sequence[tuple[Point, float]]) -> dict[float, list[tuple[Point, float]]]:
    """Observed (point, TPOT) pairs grouped by the point's mean decode batch: one factor each."""
    groups: dict[float, list[tuple[Point, float]]] = {}
    for p, t in obs:
        groups.setdefault(round(_decode_batch(p, setup), 2), []).append((p, t))
    return groups


def _clamp(factor: float) -> float:
    return min(FACTOR_RANGE[1], max(FACTOR_RANGE[0], factor))


def _interval(value: float, rse: float) -> tuple[float, float]:
    """A fraction of peak is inversely proportional to the time it was fitted on: +-1.96 standard
    errors of that time's median."""
    return value / (1 + 1.96 * rse), value / max(0.05, 1 - 1.96 * rse)


# --- replay -------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    output_tps: float
    requests_per_s: float
    goodput_share: float | None  # requests meeting both SLOs
    gpu_busy: float  # share of the time the device computed
    memory_share: float  # of busy time, the memory-bound share
    preemptions: int
    waiting_share: float  # share of steps with requests waiting
    full_share: float  # share of steps with max_num_seqs running
    kv_peak: float  # KV pool peak use 0..1
    stopped: str | None = None  # why the replay stopped short of the requests it wanted, in words
    stopped_by: str | None = None  # which budget stopped it: a key of STOP_WORDS
    ttft_mean: float | None = None
    tpot_mean: float | None = None  # per generated token after the first, over all requests (as an ITL mean)
    tpot_request_mean: float | None = None  # each request's TPOT, averaged over requests

    def centre(self, which: str, kind: str, over: str = "tokens") -> float | None:
        """The predicted `which` (ttft or tpot) as the statistic `kind` (mean or p50) an observation
        carries (observe.Stat.kind), a TPOT mean with its weighting `over` (observe.Stat.mean_over): a
        mean is compared with a mean taken the same way, a median with a median."""
        if kind != "mean":
            return getattr(self, f"{which}_p50")
        return self.tpot_request_mean if which == "tpot" and over == "requests" else getattr(self, f"{which}_mean")


class ReplaySpent(Exception):
    """A replay reached its budget (`reason`: arrivals, steps or cpu): raised from inside the twin's
    engine, so the replay stops there instead of growing; the replay reports what it had."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# The CPU clock is read once per this many steps: cheap, and a step is microseconds.
CPU_CHECK_EVERY_STEPS = 1024
# What stops a replay, in the words of its note (Prediction.stopped).
STOP_WORDS = {
    "arrivals": "{arrivals:,} arrivals: the offered load outruns the device and its queue would grow without end",
    "steps": "{steps:,} steps",
    "cpu": "{cpu:g} s of CPU",
    "time": "{sim:g} s of simulated time",
}


class _Recorder:
    """The twin's observer, keeping what the planner reports (the engine calls every hook), and the
    replay's budget: past `max_arrivals` arrivals, `max_steps` steps or CPU time `cpu_deadline`
    (time.process_time) it raises ReplaySpent inside the engine, so no chunk of simulated time can
    run past them."""

    def __init__(self, skip: int, *, max_arrivals: int = MAX_REPLAY_ARRIVALS, max_steps: int | None = None,
                 cpu_deadline: float = math.inf) -> None:
        self.skip = skip
        self.done: list[Request] = []
        self.steps = 0
        self.waiting_steps = 0
        self.full_steps = 0
        self.preemptions = 0
        self.max_num_seqs = 1
        self.arrivals = 0
        self.max_arrivals = max_arrivals
        self.max_steps = max_steps
        self.cpu_deadline = cpu_deadline

    def on_arrival(self, req: Request, now: float) -> None:
        self.arrivals += 1
        if self.arrivals > self.max_arrivals:
            raise ReplaySpent("arrivals")

    def on_itl(self, value: float, count: int) -> None: ...
    def on_first_token(self, req: Request, now: float) -> None: ...
    def on_prefix_cache(self, queries: int, hits: int) -> None: ...
    def on_abort(self, req: Request, now: float) -> None: ...
    def on_kv_sent(self, req: Request, now: float) -> None: ...
    def on_kv_received(self, req: Request, now: float) -> None: ...

    def on_preempt(self, req: Request, now: float) -> None:
        self.preemptions += 1

    def on_step(self, rec: StepRecord) -> None:
        self.steps += 1
        self.waiting_steps += rec.waiting > 0
        self.full_steps += rec.running >= self.max_num_seqs
        if self.max_steps is not None and self.steps >= self.max_steps:
            raise ReplaySpent("steps")
        if self.steps % CPU_CHECK_EVERY_STEPS == 0 and time.process_time() > self.cpu_deadline:
            raise ReplaySpent("cpu")

    def on_finish(self, req: Request, now: float, reason: str) -> None:
        req.finished_at = now
        self.done.append(req)


def client_gap(points: Sequence[Point], level: float) -> float:
    """The load generator's turnaround at `level` requests in flight (a client sharing the machine
    queues its own work as it sends more)."""
    return along_level(points, level, lambda p: p.client_gap_s)


def client_cores(points: Sequence[Point], level: float) -> float:
    """CPUs the load generator keeps busy at `level` requests in flight."""
    return along_level(points, level, lambda p: p.client_cores)


def along_level(points: Sequence[Point], level: float, value: Callable[[Point], float]) -> float:
    """A client-side quantity at `level` requests in flight: linear in the level through the
    closed-loop points observed, extended past the ends, never negative."""
    closed = sorted((p.level, value(p)) for p in points if p.mode == "concurrency")
    if not closed:
        return 0.0
    if len(closed) == 1:
        return closed[0][1]
    (x0, y0), (x1, y1) = (closed[0], closed[1]) if level <= closed[1][0] else (closed[-2], closed[-1])
    for a, b in zip(closed, closed[1:], strict=False):
        if a[0] <= level <= b[0]:
            (x0, y0), (x1, y1) = a, b
    if x1 == x0:
        return max(0.0, y1)
    return max(0.0, y0 + (level - x0) * (y1 - y0) / (x1 - x0))


def _lengths(mean: float, sigma: float) -> LengthDist:
    """The observed mean, fixed, or lognormal with the observed spread (observe.Point.prompt_sigma)."""
    mean = max(1.0, mean)
    if sigma <= 0:
        return LengthDist(mean, kind="fixed")
    return LengthDist(mean, kind="lognormal", sigma=sigma, lo=1, hi=max(2, int(mean * 64)))


def workload_for(point: Point, *, rate_scale: float = 1.0, prompt_scale: float = 1.0, output_scale: float = 1.0,
                 concurrency: int | None = None, prefix_hit_rate: float = 0.0,
                 think_s: float | None = None) -> Workload:
    prompt = _lengths(point.prompt_tokens * prompt_scale, point.prompt_sigma)
    output = _lengths(point.output_tokens * output_scale, point.output_sigma)
    if concurrency is not None or (point.mode == "concurrency" and rate_scale == 1.0):
        level = concurrency if concurrency is not None else max(1, round(point.level))
        return Workload(prompt, output, arrival="fixed", concurrency=level, prefix_hit_rate=prefix_hit_rate,
                        think_s=point.client_gap_s if think_s is None else think_s)
    rate = max(1e-6, (point.requests_per_s or point.level) * rate_scale)
    return Workload(prompt, output, arrival="poisson", rate_rps=rate, load=1.0, prefix_hit_rate=prefix_hit_rate)


MAX_REPLAY_REQUESTS = 4000
MAX_REPLAY_SIM_S = 3600.0
MAX_REPLAY_STEPS = 200_000  # about 4 s of CPU: the bound on one replay whatever the candidate


def _over_plan_budget(budget_s: float) -> PlanError:
    return PlanError(f"the plan ran past its budget of {budget_s:g} s of CPU (limits.MAX_PLAN_CPU_S): "
                     "fewer points or candidates, or --no-rate-search")


# The plan's CPU deadline (time.process_time) and budget in seconds, set by plan.plan for its run:
# every replay stops there.
PLAN_CPU_DEADLINE: contextvars.ContextVar[tuple[float, float]] = contextvars.ContextVar(
    "plan_cpu_deadline", default=(math.inf, MAX_PLAN_CPU_S))


def replay(setup: Setup, cal: Calibration, point: Point, *, workload: Workload | None = None, seed: int = 0,
           requests: int | None = None, ttft_slo_s: float = 2.5, tpot_slo_s: float = 0.1,
           max_steps: int = MAX_REPLAY_STEPS, max_arrivals: int = MAX_REPLAY_ARRIVALS) -> Prediction:
    """Run the twin's engine under `setup` with the point's workload until `requests` finish (after a
    warm-up), bounded in arrivals (so in memory), steps, CPU time and simulated time; the latencies
    are the twin's own. A replay cut short says why in `stopped`; past the plan's CPU deadline
    (PLAN_CPU_DEADLINE) it is a PlanError."""
    work = workload or workload_for(point)
    closed = work.arrival == "fixed"
    level = work.concurrency if closed else 1
    # A closed loop of fixed lengths settles into a repeating pattern after a couple of rounds: a few
    # rounds measure it. Poisson arrivals need a couple of hundred requests for a stable median.
    want = requests or (max(24, 3 * level) if closed else 200)
    want = min(MAX_REPLAY_REQUESTS, want)
    skip = max(level * 2, want // 10)
    # An open loop starts from an empty engine and fills to its steady batch over a request's time in
    # the engine: requests finished before that saw a smaller batch (shorter steps, no queue). Two
    # rounds of the largest running batch are left out, and as many measured (the batch, not the queue:
    # an overloaded replay's queue grows without end; the replay's bounds still hold).
    peak_in_flight = 0
    plan_deadline, plan_budget = PLAN_CPU_DEADLINE.get()
    if time.process_time() > plan_deadline:  # replays of under CPU_CHECK_EVERY_STEPS steps never look inside
        raise _over_plan_budget(plan_budget)
    rec = _Recorder(skip, max_arrivals=max_arrivals, max_steps=max_steps,
                    cpu_deadline=min(time.process_time() + MAX_REPLAY_CPU_S, plan_deadline))
    rec.max_num_seqs = setup.max_num_seqs
    # Open-loop arrivals at far more than the device serves would queue without end: the arrivals
    # budget stops it (inside the engine, whatever the chunk), the time cap a slow drain.
    host = HostConfig(cpu_budget_cores=64.0, request_overhead_s=cal.host_s)
    chunk = 1.0
    peak_kv = 0.0
    stopped = None
    engine = None
    try:
        engine = Engine(hardware(setup, cal), setup.model, engine_config(setup), host, work, random.Random(seed), rec)
        while len(rec.done) < want + skip and engine.t < MAX_REPLAY_SIM_S:
            engine.advance_to(engine.t + chunk)
            if not closed:
                # Rounded up to a power of two: a batch one larger (1% more traffic) must not move the
                # measured requests, or the throughput's sampling noise reads as the traffic's effect.
                peak_in_flight = max(peak_in_flight, len(engine.running))
                rounds = 1 << max(0, 2 * peak_in_flight - 1).bit_length()
                skip = min(MAX_REPLAY_REQUESTS, max(skip, rounds))
                want = min(MAX_REPLAY_REQUESTS, max(want, rounds))
            used = engine.num_blocks - engine.free_blocks
            peak_kv = max(peak_kv, used / engine.num_blocks if engine.num_blocks else 0.0)
            chunk = min(chunk * 1.5, 30.0)
    except ReplaySpent as spent:
        stopped = spent.reason
    if stopped == "cpu" and time.process_time() > plan_deadline:
        raise _over_plan_budget(plan_budget)
    if stopped is None and len(rec.done) < want + skip:
        stopped = "time"
    note = None if stopped is None else "the replay stopped at " + STOP_WORDS[stopped].format(
        arrivals=max_arrivals, steps=max_steps, cpu=MAX_REPLAY_CPU_S, sim=MAX_REPLAY_SIM_S)
    if engine is None:  # its first closed-loop round alone was over the arrivals budget
        return Prediction(None, None, None, None, 0.0, 0.0, None, 0.0, 0.0, 0, 1.0, 0.0, 0.0, note, stopped)
    if engine.num_blocks:  # the last chunk, when a budget ended it half-way
        peak_kv = max(peak_kv, (engine.num_blocks - engine.free_blocks) / engine.num_blocks)
    act = engine.activity
    busy = act.gpu_busy_s / engine.t if engine.t else 0.0
    steps = max(1, rec.steps)
    measured = rec.done[skip:skip + want]  # not what else the last chunk of simulated time finished
    if not measured:  # what the device did is known, what a request saw is not
        return Prediction(None, None, None, None, 0.0, 0.0, None, min(1.0, busy),
                          act.memory_s / max(1e-12, act.memory_s + act.compute_s), rec.preemptions,
                          rec.waiting_steps / steps, rec.full_steps / steps, peak_kv, note, stopped)
    start = min(r.arrival for r in measured)
    first_done = rec.done[skip - 1].finished_at if skip else start
    end = measured[-1].finished_at
    span = max(1e-9, end - first_done)
    kept_up = False
    if not closed and len(measured) > 1:
        # An open loop that keeps up serves what arrives: its throughput is the offered rate. A sample's
        # finish times add noise that reads as the traffic's effect (+5% tokens/s for 1% more
        # arrivals); a replay that falls behind keeps the finish-time span.
        arrived = max(r.arrival for r in measured) - min(r.arrival for r in measured)
        if arrived > 0 and span <= arrived / 0.9 and work.rate_rps:  # kept up: within 90% of the arrivals
            span = len(measured) / work.rate_rps  # the offered rate itself, not a sample of it
            kept_up = True
    ttft = [r.first_token - r.arrival for r in measured]
    tpot = [(r.finished_at - r.first_token) / (r.generated - 1) for r in measured if r.generated > 1]
    tokens: float = sum(r.generated for r in measured)
    if kept_up:
        # Kept up: the tokens are what arrives, the rate times the lengths' mean, not a sample of a
        # few hundred lognormal lengths (+-4% at a spread of 0.5).
        tokens = len(measured) * work.output.mean
    decoded = [r for r in measured if r.generated > 1]
    tpot_mean = (sum(r.finished_at - r.first_token for r in decoded) / sum(r.generated - 1 for r in decoded)
                 if decoded else None)
    good = sum(1 for r in measured if r.first_token - r.arrival <= ttft_slo_s
               and (r.generated <= 1 or (r.finished_at - r.first_token) / (r.generated - 1) <= tpot_slo_s))
    return Prediction(
        ttft_p50=percentile(ttft, 0.5), ttft_p99=percentile(ttft, 0.99), tpot_p50=percentile(tpot, 0.5),
        tpot_p99=percentile(tpot, 0.99), output_tps=tokens / span, requests_per_s=len(measured) / span,
        goodput_share=good / len(measured), gpu_busy=min(1.0, busy),
        memory_share=act.memory_s / max(1e-12, act.memory_s + act.compute_s),
        preemptions=rec.preemptions, waiting_share=rec.waiting_steps / steps, full_share=rec.full_steps / steps,
        kv_peak=peak_kv, stopped=note, stopped_by=stopped, ttft_mean=sum(ttft) / len(ttft), tpot_mean=tpot_mean,
        tpot_request_mean=sum(tpot) / len(tpot) if tpot else None)


def verdict(pred: Prediction) -> str:
    """The exporter's verdict words (exporter/derive/bottleneck.py) for what bounds the replay."""
    if pred.gpu_busy < 0.3 and pred.waiting_share < 0.05:
        return "idle" if pred.gpu_busy < 0.05 else "headroom"
    if pred.preemptions or (pred.kv_peak > 0.95 and pred.waiting_share > 0.2):
        return "kv_capacity"
    if pred.full_share > 0.5 and pred.waiting_share > 0.5:
        return "scheduler"
    return "memory_bandwidth" if pred.memory_share >= 0.5 else "compute"
