"""Scenarios that drive the twin into each bottleneck (docs/simulator.md has the table).

Load is a fraction of the capacity the twin estimates for the scenario's traffic on healthy
hardware, so each scenario keeps its meaning on any GPU and model; the scenario's own
degradation (slow CPU, hot GPU, narrow link) then shows as the bottleneck.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.physics.costs import NetworkLink
from exporter.simulator.engine import HostConfig
from exporter.simulator.gpu import GpuFault, Thermal
from exporter.simulator.workload import LengthDist, Workload

CHAT_PROMPT = LengthDist(mean=600, sigma=0.8, lo=16, hi=8192)
CHAT_OUTPUT = LengthDist(mean=300, sigma=0.6, lo=4, hi=2048)


MIN_STATED_S = 5  # the demo never promises a verdict sooner: the verdict's own hysteresis is a few 1 s cycles
# After a switch the exporter's windows still hold the previous scenario, in wall-clock time at any
# --speed: the default exporter's (1 s interval) 15 s rate window, the verdict's 3-cycle hold, and as
# many cycles again for late scrapes on a busy machine. The demo computes its own from its settings
# (exporter.app.switch_settle_s).
SWITCH_SETTLE_S = 25.0


@dataclass(frozen=True, slots=True)
class Expect:
    """What `llm-exporter demo --scenario S` shows at `--speed 1` (1 s interval), declared once: the
    demo prints it at start and on each switch (exporter.app.run_demo), `POST /sim/scenario` answers
    it (exporter/simulator/server.py), tests/test_demo_scenarios.py and tests/test_demo_switch.py check
    it on the live process and tests/test_derive_twin.py on the fast-forwarded twin."""

    verdict: str | None  # the llm_bottleneck resource that reads 1; None: no single verdict
    # Wall seconds at --speed 1 by which it shows, after a start or after a switch from any other
    # scenario (measured, rounded up). A switch is bounded below by the exporter's windows, which
    # still hold the previous scenario for their length (15 s rate window + the verdict's hold).
    within_s: float = 60.0
    panels: tuple[str, ...] = ()  # Grafana panels (dashboards/) where the signature shows
    why_no_verdict: str = ""  # with verdict None: why (the demo prints it; no verdict test runs for it)

    def __post_init__(self) -> None:
        if self.verdict is None and not self.why_no_verdict:
            raise ValueError("an Expect without a verdict says why (why_no_verdict)")

    def within(self, speed: float = 1.0, floor_s: float = 0.0) -> int | None:
        """The wall seconds the demo states at `speed` (twin time runs `speed` times faster), at least
        `floor_s`: after a switch, the exporter's windows are wall-clock at any speed and hold the
        previous scenario for their length. None without a verdict."""
        if self.verdict is None:
            return None
        return max(MIN_STATED_S, math.ceil(self.within_s / max(speed, 1e-9)), math.ceil(floor_s))

    def describe(self, speed: float = 1.0, floor_s: float = 0.0) -> dict[str, Any]:
        """What to expect, as data: the `expect` object of `POST /sim/scenario`'s answer, and what
        `lines` and `line` word."""
        doc: dict[str, Any] = {"verdict": self.verdict, "within_s": self.within(speed, floor_s),
                               "metric": "llm_bottleneck", "grafana_panels": list(self.panels)}
        if self.verdict is None:
            doc["why_no_verdict"] = self.why_no_verdict
        return doc

    def _headline(self, speed: float, floor_s: float, where: str) -> str:
        d = self.describe(speed, floor_s)
        if self.verdict is None:
            return f"no single verdict: {self.why_no_verdict}"
        return f"verdict {self.verdict} on {where} within ~{d['within_s']} s"

    def lines(self, speed: float = 1.0, floor_s: float = 0.0,
              where: str = "the status page and llm_bottleneck") -> str:
        """The demo's "what you should see" text, for a twin running at `speed` (the start banner)."""
        return (f"  expect        {self._headline(speed, floor_s, where)}\n"
                + (f"  grafana       {'; '.join(self.panels)}\n" if self.panels else ""))

    def line(self, speed: float = 1.0, floor_s: float = 0.0,
             where: str = "the status page and llm_bottleneck") -> str:
        """The same in one line (the demo's log line on a switch)."""
        return (f"expect {self._headline(speed, floor_s, where)}"
                + (f"; grafana: {'; '.join(self.panels)}" if self.panels else ""))


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
    expect: Expect | None = None  # what the live demo shows (None: undeclared; the demo tests fail)
    gpu_faults: tuple[GpuFault, ...] = ()  # hardware errors, timed from the scenario's start
    # With interconnect "network": the link the tensor-parallel group spans two servers over.
    network: NetworkLink | None = None
    # Prefill/decode disaggregation: the KV-transfer link between a prefill and a decode instance
    # (exporter/simulator/pd.py); the scenario then runs as a pair and its load is a share of what
    # this link carries at the mean prompt.
    pd: NetworkLink | None = None


SCENARIOS: Mapping[str, Scenario] = MappingProxyType({s.name: s for s in (
    Scenario(
        "idle", "No traffic.",
        "nothing: utilization 0, power at the idle floor, gpu_idle clock event, PCIe link at gen 1",
        "none",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, arrival="none", load=0.0),
        expect=Expect("idle", 25, ("Utilization next to SM, tensor and DRAM bandwidth activity", "Power vs limit",
                                   "Clock event (throttle) reasons", "PCIe link: generation and width vs max")),
    ),
    Scenario(
        "decode-heavy", "Chat traffic near capacity: short prompts, long answers.",
        "DRAM bandwidth utilization high, tensor activity low, large running batch, ITL set by the "
        "weight + KV read per step",
        "HBM bandwidth (decode at the memory roof)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.85, prefix_hit_rate=0.2),
        expect=Expect("memory_bandwidth", 25, ("Roofline: how close to the HBM and compute roofs",
                                               "Achieved vs peak HBM bandwidth", "Requests running and waiting")),
    ),
    Scenario(
        "prefill-heavy", "Long prompts, short answers (RAG, summarization, classification).",
        "tensor activity high, prompt tokens/s far above generation tokens/s, TTFT grows with prompt length",
        "tensor compute (prefill is compute-bound)",
        Workload(LengthDist(mean=6000, sigma=0.4, lo=1024, hi=16000), LengthDist(mean=24, sigma=0.5, lo=1, hi=128),
                 load=0.8),
        expect=Expect("compute", 25, ("Roofline: how close to the HBM and compute roofs", "Prefill vs decode tokens/s",
                                      "Prefill MFU", "Time to first token (p50/p95/p99, 5m)")),
    ),
    Scenario(
        "kv-pressure", "Long contexts and long answers: the KV pool fills before the slots do.",
        "KV cache usage near 1, preemptions counted, waiting queue grows while running stays well "
        "below max_num_seqs",
        "KV-cache capacity (GPU memory)",
        # Arrivals well above what the pool holds at full length: it fills within ~30 s of start.
        Workload(LengthDist(mean=10000, sigma=0.5, lo=1024, hi=24000),
                 LengthDist(mean=1200, sigma=0.4, lo=64, hi=4096), load=1.8),
        expect=Expect("kv_capacity", 60, ("KV cache usage", "Preemptions per second (5m)",
                                          "Requests running and waiting", "KV headroom: sequences that still fit")),
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
        expect=Expect("host_cpu", 25, ("Engine process: busiest thread and cores used",
                                       "CPU busy: whole host vs busiest core",
                                       "Utilization next to SM, tensor and DRAM bandwidth activity")),
    ),
    Scenario(
        "thermal-throttle", "Moderate chat load on a GPU with failing cooling (hot aisle, clogged filter).",
        "temperature climbs to the slowdown threshold, hw_thermal_slowdown set, SM clock halves, "
        "power drops, step time and ITL rise, then the card cools and the cycle repeats",
        "power/thermal (clock throttling)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.6, prefix_hit_rate=0.2),
        thermal=Thermal(ambient_c=38.0, cooling=0.45),
        expect=Expect("power_thermal", 35, ("Temperature", "Clock event (throttle) reasons", "Clocks as a share of max",
                                            "Power vs limit")),
    ),
    Scenario(
        "power-capped", "Long prompts on a GPU whose power limit an operator set to 40% of its default "
        "(nvidia-smi -pl, a rack's power budget): healthy cooling, a cool card.",
        "sw_power_cap set with the enforced power limit at 40% of the default, power flat at that limit, "
        "SM clock well below max while temperature stays low, prefill slower than the card can do",
        "power/thermal (a lowered power limit)",
        Workload(LengthDist(mean=6000, sigma=0.4, lo=1024, hi=16000), LengthDist(mean=24, sigma=0.5, lo=1, hi=128),
                 load=0.8),
        thermal=Thermal(power_limit_share=0.4),
        expect=Expect("power_thermal", 25, ("Power vs limit", "Clock event (throttle) reasons",
                                            "Clocks as a share of max")),
    ),
    Scenario(
        "pcie-degraded", "Tensor parallel over 2 GPUs without NVLink, through a PCIe link that "
        "trained down (gen 3 x8 in a gen 5 x16 slot).",
        "PCIe link generation and width below max, PCIe tx/rx near the degraded link's rate, "
        "all-reduce time dominates the step, ITL high while DRAM and tensor activity are low",
        "interconnect (PCIe)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.12),
        interconnect="pcie", pcie_gen=3, pcie_width=8, min_gpus=2,
        expect=Expect("interconnect", 25, ("PCIe link: generation and width vs max", "PCIe traffic")),
    ),
    Scenario(
        "pd-transfer", "Prefill/decode disaggregation: a prefill instance and a decode instance, the KV "
        "cache of each prompt sent from one to the other over a 25 Gb/s RoCE link, too slow for the "
        "prompt load (long prompts: ~3,000 tokens x 128 KiB of KV each, ~390 MB a request).",
        "the KV link busy ~90-95% of the time, requests standing in the prefill inflight queue and the "
        "decode transfer queue, KV transfer (wait and send) ~80% of the decode instance's TTFT while the "
        "prefill GPU has tensor headroom (~50% active) and the decode batch stays small (~25 of 256 slots)",
        "interconnect (the KV-transfer network link)",
        Workload(LengthDist(mean=3000, sigma=0.4, lo=512, hi=12000), CHAT_OUTPUT, load=0.95),
        pd=NetworkLink(device="mlx5_0:1", kind="roce", bytes_per_s=3.125e9, latency_s=20e-6, numa_node=0),
        expect=Expect("interconnect", 60, ("KV transfer time vs TTFT (p50/p99, 5m)", "Requests waiting for KV transfer",
                                           "Network link utilization", "Network errors and drops")),
    ),
    Scenario(
        "cross-node-tp", "Tensor parallel over 2 GPUs in two servers: each step's all-reduces cross "
        "a 50 Gb/s RoCE link instead of NVLink (long prompts, so each step carries thousands of tokens' "
        "activations).",
        "the RoCE link busy most of each step in both directions, all-reduce (network) time above the "
        "compute and memory time of every step, ITL and TTFT high while DRAM and tensor activity are low",
        "interconnect (the network link of a cross-node tensor-parallel group)",
        # Load is a share of what the pair would serve over NVLink: the network link takes most of it.
        Workload(LengthDist(mean=3000, sigma=0.6, lo=64, hi=12000), LengthDist(mean=200, sigma=0.6, lo=4, hi=2048),
                 load=0.17),
        interconnect="network", min_gpus=2,
        network=NetworkLink(device="mlx5_0:1", kind="roce", bytes_per_s=6.25e9, latency_s=15e-6, numa_node=0),
        expect=Expect("interconnect", 30, ("Network link utilization", "Network errors and drops")),
    ),
    Scenario(
        "overload", "A traffic surge: 20 s of normal chat load, then arrivals at twice capacity.",
        "waiting queue grows without bound after the surge, running pinned at its limit, TTFT p99 "
        "from well under a second to tens of seconds, throughput flat at capacity",
        "offered load above capacity (queueing)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.6, surge_after_s=20.0, surge_load=2.0),
        expect=Expect("scheduler", 60, ("Requests running and waiting", "Time to first token (p50/p95/p99, 5m)",
                                        "TTFT SLO attainment (5m)")),
    ),
    Scenario(
        "faults", "Chat traffic on a GPU that starts failing: ECC errors, XID events, a pending row "
        "remap, PCIe replays and the driver asking for a GPU reset within the first 25 s.",
        "corrected ECC errors at 4 s, XID 13 at 6 s and again at 20 s, PCIe replays from 8 s on, a "
        "double-bit (uncorrected) ECC error with XID 48, a pending row remap, XID 63 and recovery "
        "action gpu_reset at 12 s; traffic and speed unaffected",
        "none (hardware errors: the status UNHEALTHY above any verdict, the alerts and the fault panels)",
        Workload(CHAT_PROMPT, CHAT_OUTPUT, load=0.6, prefix_hit_rate=0.2),
        expect=Expect(None, panels=("XID errors in the time range", "ECC errors, row remapping and PCIe replays"),
                      why_no_verdict="the faults are errors, not a bottleneck: status UNHEALTHY (doctor exit 4) with "
                      "GPU 0's XID 48, ECC error, pending remap and recovery action named above the verdict on "
                      "the status page and in doctor, llm_unhealthy_gpus 1; LLMGPUXidWarning, LLMGPUXidCritical, "
                      "LLMGPUUncorrectableECCErrors and LLMGPURecoveryActionRequired fire"),
        gpu_faults=(
            GpuFault(4.0, ecc_corrected=3),
            GpuFault(6.0, xid=13),
            GpuFault(8.0, pcie_replays_per_s=20.0),
            GpuFault(12.0, xid=48, ecc_uncorrected=1, remap_pending=True),
            GpuFault(12.0, xid=63),
            # The remap applies only at a reset: the driver says so (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
            GpuFault(12.0, recovery_action="gpu_reset"),
            GpuFault(20.0, xid=13, ecc_corrected=2),
        ),
    ),
)})


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}") from None
