"""The roofline cost of one engine step: pure functions of hardware, model and batch.

step time = max(bytes moved / bandwidth, FLOPs / peak) + per-step overhead + TP interconnect time.
Host CPU time is added by the engine (it depends on the CPU budget, which the engine tracks).
The TP interconnect is NVLink or PCIe inside a server, or a network link (`NetworkLink`: RoCE,
InfiniBand, Ethernet) when the tensor-parallel group spans two servers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from exporter.specs.gpus import GpuSpec, pcie_bytes_per_s
from exporter.specs.models import (
    ModelShape,
    attention_flops,
    attention_params_per_layer,
    expert_params,
    kv_bytes_per_token,
    weight_bytes_read_per_step,
)


@dataclass(frozen=True, slots=True)
class _ModelConstants:
    """Per-model terms of the step cost, computed once (the cost runs at every simulated step)."""

    dense_weight_bytes: float  # weights read per step for a dense model
    kv_bytes_per_token: float
    matmul_flops_per_token: float  # 2 x per-layer active matmul params x layers
    lm_head_flops_per_logit: float
    attention_flops_per_context_token: float


@lru_cache(maxsize=32)
def _constants(model: ModelShape) -> _ModelConstants:
    per_layer = attention_params_per_layer(model) + model.active_experts * expert_params(model)
    if model.is_moe:
        per_layer += model.hidden * model.experts
    return _ModelConstants(
        dense_weight_bytes=weight_bytes_read_per_step(model, 1),
        kv_bytes_per_token=kv_bytes_per_token(model),
        matmul_flops_per_token=2.0 * model.layers * per_layer,
        lm_head_flops_per_logit=2.0 * model.vocab * model.hidden,
        attention_flops_per_context_token=attention_flops(model, 1.0),
    )


NETWORK_KINDS = ("infiniband", "roce", "ethernet")


@dataclass(frozen=True, slots=True)
class NetworkLink:
    """A network link between two servers, as declared by a scenario: the NIC port (`device`, as
    /sys/class/infiniband names it, `mlx5_0:1`, or a netdev name), its kind, its line rate in bytes/s
    (the rate a large transfer reaches: a transfer of B bytes holds the link B / `bytes_per_s`
    seconds) and the one-way latency each message adds (a TP all-reduce, a KV transfer)."""

    device: str = "mlx5_0:1"
    kind: str = "roce"
    bytes_per_s: float = 12.5e9  # 100 Gb/s
    latency_s: float = 10e-6
    numa_node: int | None = 0
    mtu_bytes: int = 4096  # payload per packet (RDMA MTU), for the packet counters

    def __post_init__(self) -> None:
        if self.kind not in NETWORK_KINDS:
            raise ValueError(f"network kind {self.kind!r}: one of {', '.join(NETWORK_KINDS)}")
        if self.bytes_per_s <= 0 or self.latency_s < 0 or self.mtu_bytes < 1:
            raise ValueError("a network link needs a positive rate and MTU and a latency >= 0")

    def transfer_s(self, nbytes: float) -> float:
        """Time a transfer of `nbytes` holds the link (serialization), latency not included."""
        return nbytes / self.bytes_per_s


# The fractions of peak a serving engine reaches, and its per-step overhead, where nothing was measured:
# the twin's defaults (Hardware), the planner's priors, and what the live cost-model check assumes.
PRIOR_EFFICIENCY = {"bw": 0.9, "compute": 0.6, "prefill": 0.6}
PRIOR_OVERHEAD_S = {"gpu": 0.3e-3, "cpu": 0.5e-3}


@dataclass(frozen=True, slots=True)
class Hardware:
    """What the engine runs on, as the step model needs it."""

    gpu: GpuSpec
    tp: int = 1
    interconnect: str = "auto"  # auto | nvlink | pcie | network (the TP group spans two servers)
    pcie_gen: int | None = None  # link as trained; None = the card's maximum
    pcie_width: int | None = None
    # Achievable fractions of peak: streaming kernels reach ~90% of HBM bandwidth, large GEMMs
    # ~60% of dense tensor peak in serving (attention, norms and small shapes pull it down).
    bw_efficiency: float = PRIOR_EFFICIENCY["bw"]
    compute_efficiency: float = PRIOR_EFFICIENCY["compute"]
    # Prefill runs large GEMMs, decode small ones: the planner calibrates the two apart (None: the same).
    prefill_efficiency: float | None = None
    step_overhead_s: float = PRIOR_OVERHEAD_S["gpu"]  # launches and syncs of one CUDA-graph step
    allreduce_latency_nvlink_s: float = 6e-6
    allreduce_latency_pcie_s: float = 20e-6
    pcie_efficiency: float = 0.8  # TLP/DLLP overhead on large transfers
    network: NetworkLink | None = None  # with interconnect "network": the link between the servers
    # Kernels change with the batch (a matrix-vector product for one sequence, tiles that fill as the
    # batch grows): the planner's calibration observes pure decode steps at a few batch sizes and keeps
    # each one's ratio to this roofline, as (batch, factor) pairs sorted by batch. Empty: no correction.
    decode_batch_factors: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError("tp must be >= 1")
        if self.interconnect not in ("auto", "nvlink", "pcie", "network"):
            raise ValueError(f"interconnect {self.interconnect!r}: auto, nvlink, pcie or network")
        if self.interconnect == "network" and self.network is None:
            raise ValueError("interconnect network needs its NetworkLink")

    @property
    def link(self) -> str:
        if self.interconnect != "auto":
            return self.interconnect
        return "nvlink" if self.gpu.nvlink_bytes_per_s else "pcie"

    @property
    def link_gen(self) -> int:
        return self.pcie_gen or self.gpu.pcie_gen

    @property
    def link_width(self) -> int:
        return self.pcie_width or self.gpu.pcie_width

    def interconnect_bytes_per_s(self) -> float:
        """One direction, per GPU."""
        if self.link == "network" and self.network is not None:
            return self.network.bytes_per_s
        if self.link == "nvlink" and self.gpu.nvlink_bytes_per_s:
            return self.gpu.nvlink_bytes_per_s / 2
        return pcie_bytes_per_s(self.link_gen, self.link_width) * self.pcie_efficiency


@dataclass(frozen=True, slots=True)
class Batch:
    """What one step computes. Context sums are token counts summed over sequences."""

    decode_seqs: int = 0
    decode_context: int = 0  # KV tokens the decoding sequences attend to, summed
    prefill_tokens: int = 0
    prefill_context: float = 0.0  # sum over prefill tokens of the positions each attends to
    prefill_cached_read: int = 0  # already-cached KV tokens the prefill chunks read
    logits_tokens: int = 0  # tokens that produce logits (decodes + prompts finishing prefill)

    @property
    def tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens


@dataclass(frozen=True, slots=True)
class StepCost:
    time_s: float  # GPU-side wall time of the step (compute/memory + overhead + interconnect)
    memory_time_s: float
    compute_time_s: float
    comm_time_s: float
    overhead_s: float
    bytes_per_gpu: float  # DRAM bytes each GPU moves
    flops_per_gpu: float
    comm_bytes_per_gpu: float  # bytes each GPU sends (and receives) for TP all-reduce

    @property
    def bound(self) -> str:
        """What sets the step time: memory, compute or interconnect (TP all-reduce)."""
        if self.comm_time_s > max(self.memory_time_s, self.compute_time_s):
            return "interconnect"
        return "memory" if self.memory_time_s >= self.compute_time_s else "compute"


def step_cost(hw: Hardware, model: ModelShape, batch: Batch, *, clock_ratio: float = 1.0) -> StepCost:
    """Roofline time of one step on `hw.tp` GPUs. `clock_ratio` (SM clock / max) < 1 under
    throttling: compute slows in proportion, and memory streaming loses some of its rate too
    because fewer SM cycles are left to issue loads."""
    if batch.tokens == 0:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    tp = hw.tp
    k = _constants(model)
    tokens = batch.tokens
    kv_shards = min(tp, model.kv_heads)  # KV heads are split across TP ranks, replicated beyond that
    kv_tok = k.kv_bytes_per_token / kv_shards
    kv_read = batch.decode_context + batch.prefill_cached_read
    weights = weight_bytes_read_per_step(model, tokens) if model.is_moe else k.dense_weight_bytes
    bytes_gpu = weights / tp + kv_tok * (kv_read + tokens)
    prefill_flops = (k.matmul_flops_per_token * batch.prefill_tokens
                     + k.attention_flops_per_context_token * batch.prefill_context)
    other_flops = (k.matmul_flops_per_token * batch.decode_seqs + k.lm_head_flops_per_logit * batch.logits_tokens
                   + k.attention_flops_per_context_token * batch.decode_context)
    flops_gpu = (prefill_flops + other_flops) / tp

    clock = max(0.05, min(1.0, clock_ratio))
    bw = hw.gpu.mem_bandwidth_bytes_per_s * hw.bw_efficiency * min(1.0, 0.4 + 0.6 * clock)
    # W8A8 (FP8, INT8) and FP4 matmuls run on the tensor cores' 8-bit peak where the card has one, as
    # the planner's roofline has it (exporter/planner/model.py Device.peak_flops); weight-only
    # quantization dequantizes to 16 bits.
    fp8 = hw.gpu.fp8_dense_flops
    peak = (fp8 if model.matmul_kind != "16bit" and fp8 else hw.gpu.bf16_dense_flops) * clock
    prefill_eff = hw.compute_efficiency if hw.prefill_efficiency is None else hw.prefill_efficiency
    t_mem = bytes_gpu / bw
    t_comp = (other_flops / hw.compute_efficiency + prefill_flops / prefill_eff) / tp / peak
    if hw.decode_batch_factors and not batch.prefill_tokens:
        factor = batch_factor(hw.decode_batch_factors, batch.decode_seqs)
        t_mem, t_comp = t_mem * factor, t_comp * factor

    comm_bytes = 0.0
    t_comm = 0.0
    if tp > 1:
        # Two all-reduces of the activations per layer (after attention, after the MLP); a ring
        # all-reduce sends 2(N-1)/N of the buffer from every GPU.
        buf = batch.tokens * model.hidden * 2.0
        per_allreduce = 2.0 * (tp - 1) / tp * buf
        n = 2 * model.layers
        comm_bytes = n * per_allreduce
        if hw.link == "network" and hw.network is not None:
            latency = hw.network.latency_s
        else:
            latency = hw.allreduce_latency_nvlink_s if hw.link == "nvlink" else hw.allreduce_latency_pcie_s
        t_comm = n * latency + comm_bytes / hw.interconnect_bytes_per_s()
    overhead = hw.step_overhead_s
    return StepCost(
        time_s=max(t_mem, t_comp) + overhead + t_comm,
        memory_time_s=t_mem,
        compute_time_s=t_comp,
        comm_time_s=t_comm,
        overhead_s=overhead,
        bytes_per_gpu=bytes_gpu,
        flops_per_gpu=flops_gpu,
        comm_bytes_per_gpu=comm_bytes,
    )


def batch_factor(factors: tuple[tuple[float, float], ...], batch: float) -> float:
    """The correction at `batch`: linear in log(batch) between the observed batches, the nearest
    observed one's beyond them (outside what was seen, the roofline's own shape)."""
    if batch <= factors[0][0]:
        return factors[0][1]
    for (b0, f0), (b1, f1) in zip(factors, factors[1:], strict=False):
        if batch <= b1:
            w = math.log(batch / b0) / math.log(b1 / b0) if b1 > b0 else 1.0
            return f0 + w * (f1 - f0)
    return factors[-1][1]


def decode_batch(seqs: int, context_each: int) -> Batch:
    """`seqs` sequences decoding one token each at the same context length."""
    return Batch(decode_seqs=seqs, decode_context=seqs * context_each, logits_tokens=seqs)


def prefill_batch(prompt_tokens: int, start: int = 0) -> Batch:
    """One prompt chunk of `prompt_tokens` starting at position `start` (causal attention)."""
    return Batch(
        prefill_tokens=prompt_tokens,
        prefill_context=prompt_tokens * (start + prompt_tokens / 2.0),
        prefill_cached_read=start,
        logits_tokens=1,
    )
