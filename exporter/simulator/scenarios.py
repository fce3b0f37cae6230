"""Scenarios that drive the twin into each bottleneck (docs/simulator.md has the table).

Load is a fraction of the capacity the twin estimates for the scenario's traffic on healthy
hardware, so each scenario keeps its meaning on any GPU and model; the scenario's own
degradation (slow CPU, hot GPU, narrow link) then shows as the bottleneck.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.simulator.engine import HostConfig
from exporter.simulator.gpu import Thermal
from exporter.simulator.workload import LengthDist, Workload

CHAT_PROMPT = LengthDist(mean=600, sigma=0.8, lo=16, hi=8192)
CHAT_OUTPUT = LengthDist(mean=300, sigma=0.6, lo=4, hi=2048)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    what_moves: str
    bottleneck: str
    workload: Workload
    host: HostConfig = field(default_factory=HostConfig)
    thermal: Thermal = field(default_factory=Thermal)
    interconnect: str = "auto"
    pcie_gen: int | None = None  # link as trained (None: the card's maximum)
    pcie_width: int | None = None
    min_gpus: int = 1


SCENARIOS: Mapping[str, Scenario] = MappingProxyType({s.name: s for s in (
    Scenario(
        "idle", "No traffic.",
        "nothing: utilization 0, power at the idle floor, gpu_idle clock event, PCIe link at gen 1",
        "none",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, arrival="none", load=0.0),
    ),
    Scenario(
        "decode-heavy", "Chat traffic near capacity: short prompts, long answers.",
        "DRAM bandwidth utilization high, tensor activity low, large running batch, ITL set by the "
        "weight + KV read per step",
        "HBM bandwidth (decode at the memory roof)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.85, prefix_hit_rate=0.2),
    ),
    Scenario(
        "prefill-heavy", "Long prompts, short answers (RAG, summarization, classification).",
        "tensor activity high, prompt tokens/s far above generation tokens/s, TTFT grows with prompt length",
        "tensor compute (prefill is compute-bound)",
        Workload(LengthDist(mean=6000, sigma=0.4, lo=1024, hi=16000), LengthDist(mean=24, sigma=0.5, lo=1, hi=128),
                 load=0.8),
    ),
    Scenario(
        "kv-pressure", "Long contexts and long answers: the KV pool fills before the slots do.",
        "KV cache usage near 1, preemptions counted, waiting queue grows while running stays well "
        "below max_num_seqs",
        "KV-cache capacity (GPU memory)",
        Workload(LengthDist(mean=6000, sigma=0.5, lo=1024, hi=24000), LengthDist(mean=1500, sigma=0.4, lo=64, hi=4096),
                 load=1.15),
    ),
    Scenario(
        "cpu-bound", "The engine pinned to 2 CPUs; JSON-mode requests build their token masks on "
        "the CPU for every sequence at every step, input preparation in Python per batch token, a "
        "slow tokenizer: the engine core's one thread cannot keep the GPU fed.",
        "the engine core thread at 100% of its CPU (busiest thread ~1.0) while the other CPUs idle, "
        "GPU utilization well below 1 (idle between steps), TTFT and ITL up while DRAM and tensor "
        "activity stay low",
        "host CPU (tokenizer / scheduler thread)",
        Workload(LengthDist(mean=1500, sigma=0.5, lo=64, hi=8192), LengthDist(mean=120, sigma=0.5, lo=4, hi=1024),
                 load=0.45),
        host=HostConfig(cpu_budget_cores=2.0, pinned=True, request_overhead_s=3e-3, tokenize_tokens_per_s=60_000,
                        detokenize_s_per_token=30e-6, sched_base_s=3e-3, sched_per_seq_s=500e-6,
                        sched_per_token_s=20e-6),
    ),
    Scenario(
        "thermal-throttle", "Moderate chat load on a GPU with failing cooling (hot aisle, clogged filter).",
        "temperature climbs to the slowdown threshold, hw_thermal_slowdown set, SM clock halves, "
        "power drops, step time and ITL rise, then the card cools and the cycle repeats",
        "power/thermal (clock throttling)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.6, prefix_hit_rate=0.2),
        thermal=Thermal(ambient_c=38.0, cooling=0.45),
    ),
    Scenario(
        "pcie-degraded", "Tensor parallel over 2 GPUs without NVLink, through a PCIe link that "
        "trained down (gen 3 x8 in a gen 5 x16 slot).",
        "PCIe link generation and width below max, PCIe tx/rx near the degraded link's rate, "
        "all-reduce time dominates the step, ITL high while DRAM and tensor activity are low",
        "interconnect (PCIe)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.12),
        interconnect="pcie", pcie_gen=3, pcie_width=8, min_gpus=2,
    ),
    Scenario(
        "overload", "A traffic surge: 60 s of normal chat load, then arrivals at twice capacity.",
        "waiting queue grows without bound after the surge, running pinned at its limit, TTFT p99 "
        "explodes far above p50, throughput flat at capacity",
        "offered load above capacity (queueing)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.6, surge_after_s=60.0, surge_load=2.0),
    ),
)})


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}") from None
