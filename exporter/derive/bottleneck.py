"""The bottleneck verdict: one resource per target, with scores, evidence and remedies.

The diagnosis order (docs/diagnosis.md): first which phase is slow (is there load at all,
prefill or decode), then compute, HBM bandwidth, memory capacity (KV), CPU, interconnect, power
and thermal. Two kinds of resource are told apart:

- roofs (compute, memory_bandwidth): the GPU doing its job at its limit. That is where a healthy,
  loaded engine sits; prefill tends to the compute roof, decode to the bandwidth roof.
- constraints (kv_capacity, scheduler, host_cpu, interconnect, power_thermal): something that keeps the GPU
  from its roof or caps concurrency. When one is clearly active it is the verdict even if a roof
  also scores high, because the fix is elsewhere ("the most expensive mistake is upgrading a part
  that was never the bottleneck").

Rules (thresholds in docs/diagnosis.md): no work -> idle; else the constraint with the highest
score >= CONSTRAINT_MIN; else the higher roof if >= ROOF_MIN; else headroom (serving, nothing near
a limit: healthy, and not idle, which says there is no work). Two roofs with
the same score (both clamp at 1.0 once past their ramp) are told apart by how far past its ramp
each input is (the unclamped ramp position); other ties go to the earlier resource in the order.
Hysteresis: the standing verdict needs STICKY less to stay, and it is replaced only after it lost
HOLD_CYCLES cycles in a row (by the last of them's winner).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from exporter.catalog.derived import RESOURCES
from exporter.slo import latency_text
from exporter.snapshot import Sample

ROOFS = ("compute", "memory_bandwidth")
CONSTRAINTS = ("kv_capacity", "scheduler", "host_cpu", "interconnect", "power_thermal", "routing")
CONSTRAINT_MIN = 0.6
ROOF_MIN = 0.35
STICKY = 0.1
CO_EQUAL = 0.05
"""Another active constraint within this of the verdict's score limits the target as much: the
diagnosis names it beside the verdict, with its remedies (the gauge keeps one verdict)."""
HOLD_CYCLES = 3
NO_WORK_TOKENS_PER_S = 0.5
MFU_LOW, MFU_HIGH = 0.20, 0.50  # prefill MFU: 50% is about what good prefill kernels reach
HBM_LOW, HBM_HIGH = 0.30, 0.70  # HBM share of peak: decode kernels rarely sustain more than 70-80%
SLO_TARGET = 0.9  # attainment below this marks the target degraded whatever the verdict

SEVERE_REASONS = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown"})
POWER_CAP = "sw_power_cap"

# How each verdict is named to a person: (short, for the status page; long, for doctor's report).
VERDICT_WORDS: Mapping[str, tuple[str, str]] = {
    "idle": ("idle", "idle (waiting for work)"),
    "headroom": ("headroom", "headroom (serving, no resource near its limit)"),
    "compute": ("compute (tensor FLOPS)", "compute (tensor FLOPS, prefill)"),
    "memory_bandwidth": ("HBM bandwidth", "HBM bandwidth (decode)"),
    "kv_capacity": ("KV cache capacity", "KV cache capacity"),
    "scheduler": ("scheduler limit (max sequences/slots)", "the scheduler's limit (max running sequences or slots)"),
    "host_cpu": ("host CPU", "host CPU"),
    "interconnect": ("interconnect (PCIe/NVLink/network)",
                     "interconnect (PCIe, NVLink, or the network between servers)"),
    "power_thermal": ("power / thermal throttling", "power / thermal throttling"),
    "routing": ("routing (load skew across replicas)",
                "routing: the router sends this replica most of the traffic while others idle"),
}
UNKNOWN_VERDICT_WORDS = "cannot tell yet"

REMEDIES: Mapping[str, tuple[str, ...]] = {
    "idle": (
        "Nothing to fix on this node: the engine waits for work.",
        "If users still see slow tokens, look upstream (load balancer, network, client) before the GPU.",
        "Consider fewer replicas or a smaller GPU for this load.",
    ),
    "headroom": (
        "Nothing to fix: the engine serves its load and no resource is near its limit.",
        "How much more load fits: llm_kv_cache_headroom_sequences is how many more sequences of the current "
        "mean context the KV cache holds; the roof scores (llm_bottleneck_score, resource compute and "
        f"memory_bandwidth) show how far the GPU is from its roof (a roof verdict from {ROOF_MIN}).",
        "Capacity planning: raise the load (or consolidate replicas) until a roof verdict appears and size "
        "replicas on that load; if users still see slow tokens, look upstream (load balancer, network, client).",
    ),
    "compute": (
        "Prefill is compute-bound: quantize to FP8/INT8 where the GPU has those tensor cores.",
        "Set batch limits: cap the per-step token budget (chunked prefill, e.g. vLLM --max-num-batched-tokens) "
        "so long prompts do not stall decode.",
        "Enable prefix caching for repeated system prompts; add replicas or a GPU with more TFLOPS.",
    ),
    "memory_bandwidth": (
        "Decode is HBM-bound: quantize weights (FP8/INT8/INT4) to cut the bytes every step reads.",
        "Raise batch limits (e.g. vLLM --max-num-seqs) so more sequences share each weight read, if the "
        "TBT budget allows; quantize the KV cache (fp8) for long contexts.",
        "Add replicas, or pick a GPU with more HBM bandwidth (not more TFLOPS).",
    ),
    "kv_capacity": (
        "KV cache is full: set KV limits (lower --max-model-len / --max-num-seqs) so admitted requests fit.",
        "Quantize the KV cache (fp8) or the weights to free memory for KV; raise gpu-memory-utilization.",
        "Add more replicas (or more GPUs per replica) to spread the KV; route long-context requests apart.",
    ),
    "scheduler": (
        "Requests wait while the KV cache has room: the engine runs as many sequences as it is allowed "
        "(vLLM --max-num-seqs, SGLang --max-running-requests, llama.cpp -np slots, TGI "
        "--max-concurrent-requests). Raise that cap if TBT has budget left.",
        "Raise the per-step token budget with it (vLLM --max-num-batched-tokens) so the larger batch is "
        "scheduled; check that the KV headroom covers the extra sequences.",
        "Or add replicas behind the load balancer when the latency budget is already spent.",
    ),
    "host_cpu": (
        "The host CPU feeds the GPU too slowly: apply CPU pinning on the GPU's NUMA node (numactl/taskset).",
        "Give the engine more or faster cores; move tokenization/detokenization off the scheduler thread "
        "(more API-server processes).",
        "Cut per-request overhead (JSON, streaming chunk size, logging) before buying GPUs.",
    ),
    "interconnect": (
        "Check link training: nvidia-smi -q -d PCI (current vs max generation/width); reseat the card or riser, "
        "check the BIOS PCIe setting.",
        "Check NVLink status (nvidia-smi nvlink -s) and topology (nvidia-smi topo -m).",
        "Keep tensor parallelism inside one NVLink domain, or run replicas (data parallel) instead of TP over PCIe.",
    ),
    "routing": (
        "The router's policy piles requests on this replica while others idle: its queue and SLO misses are "
        "the skew's, not a resource's. Check the policy (a cache-aware or consistent-hash policy follows "
        "prompt prefixes or sessions; one hot prefix or tenant lands on one replica).",
        "Bound the policy's imbalance (vllm-router/sglang-router --balance-abs-threshold and "
        "--balance-rel-threshold make cache-aware fall back to the least loaded; power_of_two or round_robin "
        "spread evenly), or give the hot prefix more replicas.",
        "Check that the idle replicas are registered and healthy in the router (llm_router_backend_up, the "
        "breaker state) before adding capacity: more replicas behind the same policy stay idle too.",
    ),
    "power_thermal": (
        "Check cooling: airflow, fans, inlet temperature, dust; the GPU is slowing its clocks.",
        "Check the power limit (nvidia-smi -q -d POWER,PERFORMANCE) and the PSU/VRM; restore the default limit.",
        "Do not buy faster GPUs until the clocks hold under load.",
    ),
}
# interconnect's remedies when the network between servers is what scored (remedies()): the
# checks of the links, then the fix for what crosses them (network_remedies()).
_LINK_CHECKS = (
    "Check the links between servers: state, rate and error counters (ibstat / ibv_devinfo for InfiniBand and "
    "RoCE, ethtool and ip -s link for Ethernet); a link down, trained below its rate or dropping packets is "
    "the first suspect.",
)
_KV_TRANSFER_FIX = (
    "Make sure the KV transfer takes RDMA (NIXL, Mooncake or LMCache over GPUDirect RDMA, not TCP) and the "
    "right NIC: the one on the GPUs' PCIe switch and NUMA node, on the same leaf switch as the peer.",
    "Put the prefill and decode instances in one rack or NVLink domain, or shrink the KV to move (fp8 KV "
    "cache, prefix caching on the decode side); add prefill-to-decode bandwidth before adding GPUs.",
)
_ALL_REDUCE_FIX = (
    "Make sure NCCL takes RDMA (GPUDirect RDMA, NCCL_IB_HCA set to the right HCAs, not TCP sockets) and the "
    "NIC on the GPUs' PCIe switch and NUMA node.",
    "Keep tensor parallelism inside one NVLink box and go across servers with pipeline or data parallelism; "
    "overlap communication with compute.",
)
NETWORK_REMEDIES: tuple[str, ...] = (*_LINK_CHECKS, _ALL_REDUCE_FIX[0], _KV_TRANSFER_FIX[1])
"""When nothing says what crosses the network: both kinds of fix."""


def network_remedies(s: Signals) -> tuple[str, ...]:
    """The network's remedies for what crosses it: the KV transfer of a prefill/decode pair, or the
    all-reduce of tensor parallelism across servers."""
    if s.role in ("prefill", "decode") or s.kv_transfer_share is not None or s.kv_waiting:
        return (*_LINK_CHECKS, *_KV_TRANSFER_FIX)
    if s.spans_parallel:
        return (*_LINK_CHECKS, *_ALL_REDUCE_FIX)
    return NETWORK_REMEDIES


def ramp(value: float | None, low: float, high: float) -> float:
    """0 at or below `low`, 1 at or above `high`, linear in between; 0 for unknown."""
    if value is None:
        return 0.0
    if high <= low:
        return 1.0 if value >= high else 0.0
    return min(1.0, max(0.0, (value - low) / (high - low)))


def ramp_position(value: float | None, low: float, high: float) -> float:
    """ramp() without the clamp at 1: how far past `high` a value is, in ramp widths (1.5 is half a
    width past it). Tells apart two roofs that both score 1.0."""
    if value is None:
        return 0.0
    if high <= low:
        return 1.0 if value >= high else 0.0
    return max(0.0, (value - low) / (high - low))


def pct(value: float) -> str:
    """A ratio as a percentage, in whole percent unless that would round a miss up to 100% or
    something down to 0% (0.99938 reads 99.9%, not 100%; 0.0004 reads 0.04%)."""
    scaled = value * 100
    digits = 0
    while digits < 3 and ((0.0 < value < 1.0 and round(scaled, digits) in (0.0, 100.0))
                          or (value > 1.0 and round(scaled, digits) == 100.0)):
        digits += 1
    return f"{scaled:.{digits}f}%"


def per_s(rate: float) -> str:
    """A rate per second as the boards show it (Prometheus' unit for rates): three significant digits."""
    return f"{rate:.3g}"


class Signals(NamedTuple):
    """What the verdict reads for one target; None where a source does not say."""

    running: float | None = None
    waiting: float | None = None
    mean_batch: float | None = None
    mean_waiting: float | None = None
    peak_running: float | None = None
    running_cap: float | None = None
    prefill_tps: float | None = None
    decode_tps: float | None = None
    prefill_share: float | None = None
    time_source: str = ""
    preemptions_per_s: float | None = None
    prefix_hit_share: float | None = None  # of prompt tokens, served by the prefix cache
    kv_usage: float | None = None
    kv_headroom: float | None = None
    hbm_gpm: float | None = None
    hbm_model: float | None = None
    hbm_engine: float | None = None  # the engine's own estimate (vLLM estimated bytes), shown, never scored
    mfu: float | None = None
    tensor_active: float | None = None
    gpu_util: float | None = None
    busiest_thread: float | None = None
    cpu_all: float | None = None
    numa_mismatch: bool | None = None
    tp: int = 1
    degraded_links: tuple[str, ...] = ()
    link_util: float | None = None
    link_util_what: str = ""
    throttles: tuple[str, ...] = ()  # "gpu0: hw_thermal_slowdown"
    power_capped: tuple[str, ...] = ()  # sw_power_cap under a lowered limit: a constraint
    power_envelope: tuple[str, ...] = ()  # sw_power_cap at the default limit: the card's own ceiling
    clock_ratio: float | None = None  # lowest SM clock / max over busy GPUs
    temperature: float | None = None
    gpus_known: bool = False
    ttft_p99: float | None = None
    tbt_p99: float | None = None
    ttft_attainment: float | None = None
    ttft_bound: float | None = None
    tbt_attainment: float | None = None
    tbt_bound: float | None = None
    # The client probe's (--probe) own part of running, mean_batch and the token rates: a probe
    # against an otherwise idle engine is not work (the verdict stays idle, not headroom).
    probe_tps: float = 0.0
    probe_running: float = 0.0
    probe_mean_running: float = 0.0
    # What crosses servers (the transfer stage): prefill/decode KV transfer and the engine's network links.
    role: str = ""  # prefill | decode | both; "" not reported
    kv_waiting: float | None = None  # mean requests waiting for a KV transfer
    waiting_has_kv: bool = False  # the engine's waiting counts kv_waiting's requests too (vLLM)
    kv_transfer_share: float | None = None  # median KV transfer / median TTFT
    kv_transfer_p50: float | None = None
    kv_failures_per_s: float | None = None
    spans: str = ""  # why the work crosses servers ("": nothing says it does)
    spans_parallel: bool = False  # by tensor or pipeline parallelism: every step crosses the network
    net_util: float | None = None  # busiest engine link, busier direction
    net_util_what: str = ""
    net_down: tuple[str, ...] = ()
    net_errors: tuple[str, ...] = ()
    # What the routers in front of this target say (derive/routing.py): the busiest router's view.
    routing_router: str = ""  # "router NAME (kind, policy P)"; "" when no router read here sends it traffic
    routing_share: float | None = None  # this replica's share of that router's requests over the window
    routing_fair: float | None = None  # 1 / the backends in rotation
    routing_skew: float | None = None  # busiest in-rotation backend's rate over their mean
    routing_busiest: bool = False
    routing_idle: tuple[str, ...] = ()  # in-rotation backends under half their fair share
    routing_queues: str = ""  # the engines' waiting queues across the router's backends, where read here

    def queued(self, waiting: float | None) -> float | None:
        """`waiting` without the requests waiting for their KV to arrive: those wait on the network,
        not on KV blocks or a scheduler slot, so neither kv_capacity nor scheduler may count them."""
        if waiting is None or not self.waiting_has_kv or not self.kv_waiting:
            return waiting
        return max(0.0, waiting - self.kv_waiting)

    @property
    def network(self) -> bool:
        """Whether the network between servers is in play for this target."""
        return bool(self.spans or self.net_down or self.net_errors or self.kv_transfer_share is not None
                    or (self.net_util or 0.0) >= NET_UTIL_LOW)

    @property
    def rates_known(self) -> bool:
        return self.decode_tps is not None or self.prefill_tps is not None

    @property
    def work(self) -> bool:
        # Requests waiting for their KV to arrive are work: a decode instance starved by a slow
        # transfer is not idle.
        load = max((self.running or 0.0) - self.probe_running, (self.mean_batch or 0.0) - self.probe_mean_running,
                   self.waiting or 0.0, self.kv_waiting or 0.0)
        tokens = (self.decode_tps or 0.0) + (self.prefill_tps or 0.0) - self.probe_tps
        return load >= 0.5 or tokens >= NO_WORK_TOKENS_PER_S


@dataclass(frozen=True, slots=True)
class Assessment:
    scores: Mapping[str, float]
    evidence: Mapping[str, tuple[str, ...]]  # per resource
    context: tuple[str, ...]  # facts worth showing whatever the verdict


# Each resource's score, and the evidence for it appended to `ev` when `ev` is a list: the
# verdict needs the scores every cycle, the words are only built for the diagnosis.

def _compute(s: Signals, ev: list[str] | None, r=ramp) -> float:
    # MFU is the direct measure; tensor-core activity (GPM) also counts attention and decode
    # matmuls at low efficiency, so it only stands in when there is no MFU.
    score = r(s.mfu, MFU_LOW, MFU_HIGH) if s.mfu is not None else r(s.tensor_active, 0.40, 0.80)
    if ev is not None:
        if s.mfu is not None:
            cached = f" (prefix cache served {pct(s.prefix_hit_share)} of prompt tokens, not computed)" \
                if s.prefix_hit_share else ""
            ev.append(f"prefill MFU {pct(s.mfu)}{cached}")
        if s.tensor_active is not None:
            ev.append(f"tensor cores active {pct(s.tensor_active)} (GPM)")
        if s.power_envelope and s.clock_ratio is not None:
            ev.append(f"on the default power limit: SM clock at {pct(s.clock_ratio)} of max, this card's compute "
                      "ceiling under dense math")
    if s.mfu is None and s.tensor_active is None and s.gpu_util is not None and s.prefill_share is not None:
        score = 0.8 * r(s.gpu_util, 0.5, 0.95) * s.prefill_share
        if ev is not None:
            ev.append(f"GPU busy {pct(s.gpu_util)} with prefill {pct(s.prefill_share)} of engine time (no MFU: "
                      "model shape or GPU spec unknown)")
    return score


HBM_AGREE = 0.10  # two HBM figures within this share of the larger agree (docs/diagnosis.md)


def _hbm_words(s: Signals) -> str:
    """The HBM figures, which one the verdict reads and, when the others differ from it by more than
    HBM_AGREE, why that one: GPM is measured on the card (every kernel, every process); the model
    counts what decode must read (weights and KV per step, from the shape and the engine's steps/s);
    the engine's estimate is its own count of the same."""
    used, how = (s.hbm_gpm, "by GPM") if s.hbm_gpm is not None else (s.hbm_model, "modelled")
    if used is None:
        return ""
    others = [(name, value) for name, value in (("modelled", s.hbm_model), ("the engine's estimate", s.hbm_engine))
              if value is not None and not (name == "modelled" and s.hbm_gpm is None)]
    words = f"HBM at {pct(used)} of peak {how}"
    if not others:
        return words + ("" if s.hbm_gpm is not None else " (from decode steps/s and the model shape)")
    off = [(n, v) for n, v in others if abs(v - used) > HBM_AGREE * max(v, used)]
    listed = " and ".join(f"{n} {pct(v)}" for n, v in others)
    if not off:
        return f"{words}; {listed} {'agree' if len(others) > 1 else 'agrees'} within {pct(HBM_AGREE)}"
    why = ("the verdict reads GPM: it is measured on the card, every kernel and process included, where the model "
           "counts only the weight and KV reads of decode steps" if s.hbm_gpm is not None else
           "the verdict reads the model: no GPM on this GPU, and the engine's estimate is the engine's own count")
    return (f"{words}; {listed} {'differ' if len(others) > 1 else 'differs'} from it by more than "
            f"{pct(HBM_AGREE)}: {why}")


def _bandwidth(s: Signals, ev: list[str] | None, r=ramp) -> float:
    ratio = s.hbm_gpm if s.hbm_gpm is not None else s.hbm_model
    score = r(ratio, HBM_LOW, HBM_HIGH)
    if ratio is not None:
        if ev is not None and (words := _hbm_words(s)):
            ev.append(words)
    elif s.gpu_util is not None and s.prefill_share is not None:
        score = 0.8 * r(s.gpu_util, 0.5, 0.95) * (1.0 - s.prefill_share)
        if ev is not None:
            ev.append(f"GPU busy {pct(s.gpu_util)} with decode {pct(1 - s.prefill_share)} of engine time (no "
                      "bandwidth figure: no GPM and no model shape)")
    return score


def _kv(s: Signals, ev: list[str] | None) -> float:
    usage = s.kv_usage
    score = 0.55 * ramp(usage, 0.80, 0.97)
    if usage is not None and ev is not None:
        room = f", room for {s.kv_headroom:.0f} more sequences" if s.kv_headroom is not None else ""
        ev.append(f"KV cache {pct(usage)} used{room}")
    if s.preemptions_per_s is not None and s.preemptions_per_s > 0:
        score = max(score, 0.6 + 0.4 * ramp(usage, 0.70, 0.95))
        if ev is not None:
            ev.append(f"{per_s(s.preemptions_per_s)} preemptions/s (sequences evicted for lack of KV blocks)")
    queued = s.queued(s.waiting) or 0.0
    if queued >= 1 and usage is not None and usage >= 0.9:
        score = max(score, 0.6 + 0.4 * ramp(usage, 0.90, 0.98))
        if ev is not None:
            ev.append(f"{queued:.0f} requests waiting while the KV cache is full")
    return score


SCHEDULER_WAITING_MIN = 1.0  # mean requests waiting over the window
AT_CAP = 0.9  # running at this share of its cap (or of its peak in the window) counts as at the cap,
# and so does running within AT_CAP_SLACK sequences of it: with llama.cpp's 4 slots 10% is less than
# one, and a slot handed from a finished request to the next queued one reads as free in some
# samples (live: mean 3.5 of 4 with 4 waiting, and the verdict fell back to headroom).
AT_CAP_SLACK = 1.0
KV_ROOM = 0.9  # KV usage under this leaves room: the wait is not KV's


def _scheduler(s: Signals, roof: float, ev: list[str] | None) -> float:
    """Requests wait, running sits at its cap and the KV cache has room: the engine's own limit on
    running sequences (or slots) holds them back, not a resource. Next to a GPU at its roof the
    queue is the roof's (a larger batch would not go much faster), so the score halves there."""
    waiting, running = s.queued(s.mean_waiting), s.mean_batch
    if waiting is None or running is None or waiting < SCHEDULER_WAITING_MIN or running < 1.0:
        return 0.0
    cap = s.running_cap if s.running_cap else s.peak_running
    if not cap or running < min(AT_CAP * cap, cap - AT_CAP_SLACK):
        return 0.0
    if (s.kv_usage is not None and s.kv_usage >= KV_ROOM) or (s.preemptions_per_s or 0.0) > 0:
        return 0.0  # waiting on KV blocks: kv_capacity's case
    score = 0.6 + 0.4 * ramp(waiting / running, 0.1, 1.0)
    if roof >= 0.8:
        score *= 0.5
    if ev is not None:
        what = f"its configured maximum of {s.running_cap:.0f}" if s.running_cap else \
            f"its peak of {cap:.0f} (a cap: it does not go higher)"
        room = f", KV cache {pct(s.kv_usage)} used" if s.kv_usage is not None else ""
        ev.append(f"{waiting:.1f} requests waiting on average while {running:.1f} run, at {what}{room}")
    return score


def _host(s: Signals, roof: float, ev: list[str] | None) -> float:
    score = max(ramp(s.busiest_thread, 0.70, 0.95), 0.5 * ramp(s.cpu_all, 0.85, 0.98))
    cpu_inference = not s.gpus_known and s.work and s.cpu_all is not None
    if cpu_inference:
        # No GPU: the model runs on the CPU cores, and all of them busy is the compute roof.
        score = max(score, ramp(s.cpu_all, 0.70, 0.95))
    if ev is not None:
        if s.busiest_thread is not None:
            ev.append(f"busiest engine thread at {pct(s.busiest_thread)} of a core")
        if cpu_inference and s.cpu_all is not None:  # (cpu_inference implies it; said again for the checker)
            ev.append(f"no GPU seen: inference runs on the host CPUs, {pct(s.cpu_all)} busy")
        elif s.cpu_all is not None and s.cpu_all >= 0.85:
            ev.append(f"host CPUs {pct(s.cpu_all)} busy")
    if score > 0 and roof >= 0.8:
        # A busy CPU next to a GPU at its roof is not what limits tokens/s.
        score *= 0.5
    if s.numa_mismatch and score > 0.3:
        score = min(1.0, score + 0.15)
        if ev is not None:
            ev.append("engine pinned to CPUs outside the GPUs' NUMA node")
    return score


NET_UTIL_LOW, NET_UTIL_HIGH = 0.6, 0.9  # an engine network link's utilization ramp
KV_SHARE_LOW, KV_SHARE_HIGH = 0.25, 0.5  # KV transfer's share of TTFT: half of it is the transfer's
KV_QUEUE_LOW, KV_QUEUE_HIGH = 1.0, 8.0  # mean requests waiting for a KV transfer
COMM_UTIL_LOW, COMM_UTIL_HIGH = 0.3, 0.8  # an engine link's utilization while the GPU sits off its roofs
LEAD = 0.5  # a network sign without a known reason for the work to cross servers is a lead


def _network(s: Signals, roof: float, ev: list[str] | None) -> float:
    """The network between servers: prefill/decode KV transfer and the engine's NIC/RDMA links.
    `roof`: the higher roof score (compute, memory_bandwidth)."""
    score = 0.0
    if s.spans and ev is not None:
        ev.append(s.spans)
    if s.kv_transfer_share is not None:
        score = max(score, ramp(s.kv_transfer_share, KV_SHARE_LOW, KV_SHARE_HIGH))
        if ev is not None and s.kv_transfer_p50 is not None:
            ev.append(f"KV transfer {pct(s.kv_transfer_share)} of TTFT (median transfer "
                      f"{s.kv_transfer_p50 * 1000:.3g} ms)")
    if s.kv_waiting is not None and s.kv_waiting >= KV_QUEUE_LOW:
        score = max(score, CONSTRAINT_MIN + 0.4 * ramp(s.kv_waiting, KV_QUEUE_LOW, KV_QUEUE_HIGH))
        if ev is not None:
            ev.append(f"{s.kv_waiting:.1f} requests waiting for a KV transfer on average")
    if s.kv_failures_per_s:
        score = max(score, CONSTRAINT_MIN)
        if ev is not None:
            ev.append(f"{per_s(s.kv_failures_per_s)} failed KV transfers/s")
    weight = 1.0 if s.spans else LEAD
    if s.net_down:
        score = max(score, 0.9 * weight)
        if ev is not None:
            ev.append("engine network link down: " + ", ".join(s.net_down))
    if s.net_errors:
        score = max(score, 0.65 * weight)
        if ev is not None:
            ev.append("engine network link errors: " + ", ".join(s.net_errors))
    if s.net_util is not None:
        score = max(score, ramp(s.net_util, NET_UTIL_LOW, NET_UTIL_HIGH) * weight)
        if ev is not None and s.net_util >= 0.5:
            ev.append(f"network link {s.net_util_what} at {pct(s.net_util)} of its rate{_carrying(s)}")
        # Tensor parallelism across servers: the all-reduce comes in bursts, so the link's mean
        # utilization understates it; a GPU serving far below both roofs while its link carries that
        # much is waiting on the network every step.
        if s.spans_parallel and s.work and roof < ROOF_MIN and s.net_util >= COMM_UTIL_LOW:
            score = max(score, CONSTRAINT_MIN + 0.4 * ramp(s.net_util, COMM_UTIL_LOW, COMM_UTIL_HIGH))
            if ev is not None:
                ev.append(f"the GPU serves far below its roofs (best roof score {roof:.2f}) while its link between "
                          f"servers is {pct(s.net_util)} busy: every step waits on the all-reduce across servers")
    return score


def _carrying(s: Signals) -> str:
    """What an engine's network link carries, in words, as far as the signals say."""
    if s.role in ("prefill", "decode"):
        return ", carrying the KV cache between the prefill and decode instances"
    if s.spans_parallel:
        return ", carrying the tensor-parallel all-reduce"
    return ""


def _interconnect(s: Signals, ev: list[str] | None, roof: float = 0.0) -> float:
    score = _network(s, roof, ev) if s.network else 0.0
    if s.degraded_links:
        score = max(score, 0.9 if s.tp > 1 else 0.45)
        if ev is not None:
            ev.append("PCIe link trained down under load: " + ", ".join(s.degraded_links))
            if s.tp > 1:
                ev.append(f"tensor parallel over {s.tp} GPUs: every step waits on the slow link")
    elif s.gpus_known and ev is not None and not s.network:
        ev.append("PCIe links at their maximum generation and width")
    if s.link_util is not None:
        score = max(score, ramp(s.link_util, 0.6, 0.9) * (1.0 if s.tp > 1 else 0.6))
        if s.link_util >= 0.5 and ev is not None:
            ev.append(f"{s.link_util_what} at {pct(s.link_util)} of link capacity")
    return score


def _power(s: Signals, ev: list[str] | None) -> float:
    drop = ramp(None if s.clock_ratio is None else 1.0 - s.clock_ratio, 0.10, 0.35)
    # Clocks held down by the default power limit are the roof itself, not something keeping the GPU from it.
    score = 0.0 if s.power_envelope and not s.power_capped else 0.4 * drop
    if s.throttles:
        score = 1.0
    if s.power_capped:
        score = max(score, 0.45 + 0.5 * drop)
    if ev is None:
        return score
    if s.throttles:
        ev.append("clock slowdown active: " + ", ".join(s.throttles))
    if s.power_capped:
        ev.append("power cap reached: " + ", ".join(s.power_capped))
    if s.power_envelope:
        ev.append("power cap reached at the default limit (" + ", ".join(s.power_envelope)
                  + "): the card's own envelope under full load, not a fault")
    if s.clock_ratio is not None and (s.throttles or s.power_capped or s.power_envelope or drop > 0):
        ev.append(f"SM clock at {pct(s.clock_ratio)} of max")
    if s.temperature is not None and s.temperature >= 85:
        ev.append(f"GPU at {s.temperature:.0f} C")
    if not ev and s.gpus_known:
        ev.append("no throttling")
    return score


SKEW_MIN, SKEW_HIGH = 1.5, 3.0  # the busiest replica's rate over the mean: a routing score from 1.5x


def _routing(s: Signals, ev: list[str] | None) -> float:
    """The router gives this replica most of the traffic while another replica it routes to idles,
    and this one misses its SLO or queues: the fix is the routing, not this replica's resources."""
    skew, share = s.routing_skew, s.routing_share
    if skew is None or share is None or skew < SKEW_MIN or not s.routing_busiest or not s.routing_idle:
        return 0.0
    misses = [f"{kind} SLO attainment {pct(att)}" for kind, att in (("TTFT", s.ttft_attainment),
                                                                   ("TBT", s.tbt_attainment))
              if att is not None and att < SLO_TARGET]
    queued = s.queued(s.mean_waiting) or 0.0
    if queued >= SCHEDULER_WAITING_MIN:
        misses.append(f"{queued:.1f} requests waiting on average")
    if not misses:
        return 0.0
    if ev is not None:
        fair = f" (fair share {pct(s.routing_fair)})" if s.routing_fair is not None else ""
        ev.append(f"{s.routing_router} sends this replica {pct(share)} of its requests{fair}: load skew "
                  f"{skew:.2f}x (busiest over mean)")
        ev.append(f"idle meanwhile: {', '.join(s.routing_idle[:4])}" + (" and more" if len(s.routing_idle) > 4 else ""))
        ev.append("here: " + ", ".join(misses))
        if s.routing_queues:
            ev.append(s.routing_queues)
    return 0.6 + 0.4 * ramp(skew, SKEW_MIN, SKEW_HIGH)


def _context(s: Signals) -> list[str]:
    out = []
    if s.prefill_share is not None:
        phase, share = ("decode", 1 - s.prefill_share) if s.prefill_share < 0.5 else ("prefill", s.prefill_share)
        out.append(f"{phase} is {pct(share)} of engine time ({s.time_source})")
    rates = [f"{phase} {tps:.0f} tok/s" for phase, tps in (("prefill", s.prefill_tps), ("decode", s.decode_tps))
             if tps is not None]  # a decode instance of a PD pair has no prefill rate of its own
    if rates:
        out.append(", ".join(rates))
    if s.mean_batch is not None:
        waiting = f", {s.waiting:.0f} waiting" if s.waiting else ""
        out.append(f"batch {s.mean_batch:.1f}{waiting}")
    if s.ttft_p99 is not None:
        slo = ""
        if s.ttft_attainment is not None and s.ttft_bound is not None:
            slo = f"; {pct(s.ttft_attainment)} within {latency_text(s.ttft_bound, 'ttft')}"
        out.append(f"TTFT p99 {latency_text(s.ttft_p99, 'ttft')}{slo}")
    if s.tbt_p99 is not None:
        slo = ""
        if s.tbt_attainment is not None and s.tbt_bound is not None:
            slo = f"; {pct(s.tbt_attainment)} within {latency_text(s.tbt_bound, 'tbt')}"
        out.append(f"TBT p99 {latency_text(s.tbt_p99, 'tbt')}{slo}")
    return out


def _scores(s: Signals, evidence: dict[str, list[str]] | None) -> dict[str, float]:
    """Scores per resource, rounded as exported; with an `evidence` dict, the words for each too."""

    def ev(resource: str) -> list[str] | None:
        return None if evidence is None else evidence.setdefault(resource, [])

    compute = _compute(s, ev("compute"))
    bandwidth = _bandwidth(s, ev("memory_bandwidth"))
    kv = _kv(s, ev("kv_capacity"))
    scheduler = _scheduler(s, max(compute, bandwidth), ev("scheduler"))
    host = _host(s, max(compute, bandwidth), ev("host_cpu"))
    link = _interconnect(s, ev("interconnect"), max(compute, bandwidth))
    power = _power(s, ev("power_thermal"))
    routed = _routing(s, ev("routing"))
    limits = {"compute": compute, "memory_bandwidth": bandwidth, "kv_capacity": kv, "scheduler": scheduler,
              "host_cpu": host, "interconnect": link, "power_thermal": power, "routing": routed}
    work = s.work
    # idle: there is no work. headroom: there is, and the closer the nearest limit, the lower it is.
    idle = 0.0 if work else 1.0
    headroom = max(0.0, 1.0 - 2.0 * max(limits.values())) if work else 0.0
    if evidence is not None:
        evidence["idle"] = [] if work else [
            "no requests running or waiting and no tokens generated"
            + (" but the probe's own" if s.probe_tps > 0 or s.probe_mean_running > 0 else "")]
        evidence["headroom"] = _headroom_words(limits) if work else []
    scores = {"idle": idle, "headroom": headroom, **limits}
    return {k: round(v, 4) for k, v in scores.items()}


def _headroom_words(limits: Mapping[str, float]) -> list[str]:
    """Worded only when no resource reaches its verdict's threshold (else the words would contradict
    the roof or constraint that does)."""
    if any(limits[r] >= ROOF_MIN for r in ROOFS) or any(limits[r] >= CONSTRAINT_MIN for r in CONSTRAINTS):
        return []
    # The first resource in the diagnosis order among the highest: the one closest to its limit.
    nearest = max(limits, key=lambda r: (limits[r], -RESOURCES.index(r)))
    if limits[nearest] <= 0:
        return ["serving, and no resource scores above 0 (a series no source provides scores 0: see omitted)"]
    kind, needs = ("roof", ROOF_MIN) if nearest in ROOFS else ("constraint", CONSTRAINT_MIN)
    return [f"serving, and no resource near its limit: the highest score is {nearest} {limits[nearest]:.2f} "
            f"(a {kind} verdict needs {needs})"]


def scores(s: Signals) -> dict[str, float]:
    """assess(s).scores, without wording the evidence (what every cycle needs)."""
    return _scores(s, None)


def assess(s: Signals) -> Assessment:
    evidence: dict[str, list[str]] = {}
    scores = _scores(s, evidence)
    return Assessment(scores, {k: tuple(evidence[k]) for k in RESOURCES}, tuple(_context(s)))


def roof_positions(s: Signals) -> dict[str, float]:
    """The roofs' scores without the clamp at 1.0 (ramp_position): how far past its roof each is."""
    return {"compute": _compute(s, None, ramp_position), "memory_bandwidth": _bandwidth(s, None, ramp_position)}


def _best(candidates: Sequence[str], scores: Mapping[str, float], current: str | None,
          s: Signals | None = None) -> str:
    # Highest score (the standing verdict gets the sticky margin, so two resources with close
    # scores do not swap every cycle); two roofs on a tie by their unclamped positions; other
    # ties to the earlier resource in the diagnosis order.
    def adjusted(r: str) -> float:
        return scores[r] + (STICKY if r == current else 0.0)

    top = max(map(adjusted, candidates))
    positions = roof_positions(s) if s is not None and sum(adjusted(r) == top for r in candidates) > 1 else {}

    def key(r: str) -> tuple[float, float, int]:
        return (adjusted(r), positions.get(r, 0.0), -RESOURCES.index(r))

    return max(candidates, key=key)


def raw_verdict(s: Signals, scores: Mapping[str, float], current: str | None) -> tuple[str, str]:
    """(resource, rule that chose it) for this cycle alone; `current` gets the sticky margin."""
    if not s.rates_known:
        return "", "warming up: token rates need two cycles"
    if not s.work:
        return "idle", "no work"

    def passes(resource: str, minimum: float) -> bool:
        return scores[resource] >= minimum - (STICKY if resource == current else 0.0)

    active = [r for r in CONSTRAINTS if passes(r, CONSTRAINT_MIN)]
    if "routing" in active:
        # The hot replica's queue, KV pressure or busy CPU are the skew's symptoms: with the load spread
        # they go. The diagnosis still names those that score as high (co_equal).
        return "routing", f"routing score >= {CONSTRAINT_MIN}: the skew comes before this replica's own limits"
    if active:
        return _best(active, scores, current), f"constraint score >= {CONSTRAINT_MIN}"
    roofs = [r for r in ROOFS if passes(r, ROOF_MIN)]
    if roofs:
        return _best(roofs, scores, current, s), f"roof score >= {ROOF_MIN}"
    return "headroom", f"serving; no constraint >= {CONSTRAINT_MIN} and no roof >= {ROOF_MIN}"


def co_equal(verdict: str, scores: Mapping[str, float]) -> list[str]:
    """The other constraints that score as high as a constraint verdict (within CO_EQUAL, each at
    least CONSTRAINT_MIN), in the diagnosis order: two limits at once, say KV full on a throttled GPU,
    each with its own fix. Roofs and idle/headroom verdicts have none."""
    if verdict not in CONSTRAINTS:
        return []
    top = scores.get(verdict, 0.0)
    return [r for r in CONSTRAINTS if r != verdict and scores.get(r, 0.0) >= max(CONSTRAINT_MIN, top - CO_EQUAL)]


class Hysteresis(NamedTuple):
    verdict: str | None = None
    since: float = 0.0
    pending: str | None = None
    streak: int = 0


def settle(state: Hysteresis, raw: str, now: float, hold_cycles: int = HOLD_CYCLES) -> Hysteresis:
    """Adopt `raw` at once the first time; later, once the standing verdict has lost `hold_cycles`
    cycles in a row, this cycle's winner replaces it. The losses count whoever won them: on a live
    llama.cpp over its slot cap, scheduler and host_cpu took turns as the winner for a minute, and
    "the same winner N times" kept `headroom` standing while requests queued."""
    # Built directly rather than with dataclasses.replace(), which inspects the fields each call.
    if state.verdict is None:
        return Hysteresis(raw, now)
    if raw == state.verdict:
        return Hysteresis(state.verdict, state.since)
    streak = state.streak + 1
    if streak >= hold_cycles:
        return Hysteresis(raw, now)
    return Hysteresis(state.verdict, state.since, raw, streak)


def remedies(verdict: str, s: Signals) -> tuple[str, ...]:
    """The verdict's remedies; interconnect's are the network's when the network is what scored."""
    roof = max(_compute(s, None), _bandwidth(s, None))
    if verdict == "interconnect" and s.network and _network(s, roof, None) >= _interconnect_local(s):
        return network_remedies(s)
    return REMEDIES[verdict]


def _interconnect_local(s: Signals) -> float:
    """interconnect's score from PCIe and NVLink alone."""
    return _interconnect(s._replace(spans="", kv_transfer_share=None, kv_waiting=None, kv_failures_per_s=None,
                                    net_util=None, net_down=(), net_errors=()), None)


def is_degraded(verdict: str, s: Signals) -> list[str]:
    """Why the target counts as degraded (empty: healthy)."""
    why = []
    if verdict in CONSTRAINTS:
        why.append(f"limited by {verdict}, not by the GPU's own roof")
    if s.ttft_attainment is not None and s.ttft_attainment < SLO_TARGET:
        why.append(f"only {pct(s.ttft_attainment)} of requests meet the TTFT SLO")
    if s.tbt_attainment is not None and s.tbt_attainment < SLO_TARGET:
        why.append(f"only {pct(s.tbt_attainment)} of token gaps meet the TBT SLO")
    return why


def samples(target: str, verdict: str, scores: Mapping[str, float], engine: str = "") -> list[Sample]:
    out = []
    for resource in RESOURCES:
        labels = (("engine", engine), ("resource", resource), ("target", target))  # sorted (test_derive_stages)
        out.append(Sample("llm_bottleneck", labels, 1.0 if resource == verdict else 0.0))
        out.append(Sample("llm_bottleneck_score", labels, scores.get(resource, 0.0)))
    return out
