"""LLM Serving / GPU and roofline: what "utilization" means, how close decode is to the HBM roof,
memory, power, clocks, interconnect, hardware errors, the driver's recovery action and NVLink fabric
state, and the GPU inventory."""

from __future__ import annotations

from exporter.mixin.dashboards import verdict
from exporter.mixin.dashboards.lib import (
    BOOL_ACTIVE,
    BOOL_UP,
    FILENAMES,
    Panel,
    Promql,
    Row,
    RowBuilder,
    active,
    color_override,
    dashboard,
    fleet,
    layout,
    row,
    standard_variables,
    state_timeline,
    table,
    target,
    text,
    thresholds,
    timeseries,
    value_map,
)
from exporter.specs.nvml_codes import FABRIC_HEALTH, FABRIC_STATES, RECOVERY_ACTIONS

FILENAME = FILENAMES["gpu_roofline"]
TITLE = "LLM Serving / GPU and roofline"

G = Promql("gpu")
TG = Promql("target_gpu")
TM = Promql("target_model")
EX = Promql("exporter")
# One exporter: instance names repeat across clusters (pod IPs), so cluster and namespace are kept beside it.
EXPORTER = fleet("job", "instance")
CURRENT, MAXIMUM, MODELLED = 'state="current"', 'state="max"', 'source="model"'


def xid() -> str:
    return G.sel("llm_gpu_xid_errors_total")


def xid_critical() -> str:
    """The codes LLMGPUXidCritical pages for, as the alert rules of the config in effect list them."""
    return ", ".join(str(code) for code in active()["xid_critical"])


# The labels of llm_gpu_info: one inventory row per GPU.
INFO_LABELS = ("instance", "gpu", "name", "uuid", "pci_bus_id", "driver_version", "cuda_version", "mig_mode")


def recovery_map() -> list[dict]:
    """Colours of the code-valued health gauges, from the catalogue's codes and the mixin's config: red
    where LLMGPURecoveryActionRequired pages, orange where the advisory alert warns."""
    return value_map((code, name, "green" if code == 0 else
                      "red" if name in active()["recovery_action_critical"] else "orange")
                     for code, name in RECOVERY_ACTIONS)


_FABRIC_COLORS = {"completed": "green", "in_progress": "yellow", "healthy": "green", "limited_capacity": "orange"}
FABRIC_STATE_MAP = value_map((code, f"fabric {name}", _FABRIC_COLORS.get(name, "red")) for code, name in FABRIC_STATES)
FABRIC_HEALTH_MAP = value_map((code, f"fabric {name}", _FABRIC_COLORS.get(name, "red")) for code, name in FABRIC_HEALTH)

READING = """
**Read the top row first.** *GPU utilization* is the share of time in which *any* kernel ran: a decode step
that streams all weights and the KV cache through the memory bus keeps it near 100% with idle tensor cores,
and "50% utilization" can still be a GPU at its bandwidth roof. What the GPU is doing is in SM and tensor
activity (compute) and DRAM bandwidth utilization (memory). Decode is bound by HBM bandwidth: the floor of a
step is (weight bytes + KV bytes read) / bandwidth, e.g. a 70B FP16 model on a 2 TB/s card cannot decode one
sequence faster than about 14.6 tokens/s; batching shares that weight read across sequences. Prefill is bound
by compute (about 2 x parameters FLOPs per token): read it as MFU.
"""


def reading_row() -> Row:
    return row(None,
        text("How to read this dashboard", """
Why utilization is not load, and which panel answers compute-bound vs bandwidth-bound.
""", READING, w=24, h=5),
    )


def busy_row() -> Row:
    return row("Is the GPU busy, and with what?",
        timeseries("Utilization next to SM, tensor and DRAM bandwidth activity", """
Utilization (NVML) is a busy-time share: 1 when one kernel ran all period, however little of the chip it used.
SM active and tensor active (GPM) say how much compute was used; DRAM bandwidth utilization (GPM) says how
much of the memory roof was used. Decode at the roof shows DRAM high, tensor low and utilization high.
Memory busy share is NVML's memory-controller busy time, not a fraction of bandwidth.
""", [target(G.sel("llm_gpu_utilization_ratio"), "GPU {{gpu}} ({{instance}}) utilization"),
      target(G.sel("llm_gpu_sm_active_ratio"), "GPU {{gpu}} ({{instance}}) SM active"),
      target(G.sel("llm_gpu_tensor_active_ratio"), "GPU {{gpu}} ({{instance}}) tensor active"),
      target(G.sel("llm_gpu_dram_bandwidth_utilization_ratio"), "GPU {{gpu}} ({{instance}}) DRAM bandwidth"),
      target(G.sel("llm_gpu_memory_utilization_ratio"), "GPU {{gpu}} ({{instance}}) memory busy share"),
      target(G.sel("llm_gpu_sm_occupancy_ratio"), "GPU {{gpu}} ({{instance}}) SM occupancy")],
        unit="percentunit", w=24, h=9, minimum=0, maximum=1,
        overrides=[color_override(".*utilization$", "text"), color_override(".*DRAM bandwidth$", "purple"),
                   color_override(".*tensor active$", "blue")]),
    )


def roofline_row() -> Row:
    return row("Roofline: how close to the HBM and compute roofs",
        timeseries("Achieved vs peak HBM bandwidth", """
Achieved HBM bandwidth per GPU of each exporter: source=model is decode steps/s x (weight bytes + KV bytes read
per step) / tensor-parallel GPUs; source=gpm is measured (DRAM_BW_UTIL x peak); source=engine is the engine's own
estimate of bytes read and written per GPU (vLLM estimated_read/write_bytes_per_gpu). Peak (dashed) is each card's
spec, per exporter and GPU index, so mixed cards keep their own roofs. When achieved sits near peak, decode is at
the memory roof: only fewer bytes per step (quantized weights or KV) or more sequences per weight read (bigger
batch) raise tokens/s.
""", [target(f"max {fleet('instance', 'target', 'gpu', 'source').by()} "
             f"({TG.sel('llm_hbm_bandwidth_bytes_per_second')})",
             "{{source}} GPU {{gpu}} {{target}} ({{instance}})"),
      target(f"max {fleet('instance', 'gpu').by()} (\n"
             f"  {TG.sel('llm_hbm_bandwidth_bytes_per_second', MODELLED)}\n"
             f"  / ({TG.sel('llm_hbm_bandwidth_efficiency_ratio', MODELLED)} > 0)\n)",
             "peak GPU {{gpu}} ({{instance}})")],
            unit="Bps", w=12, minimum=0, overrides=[color_override("^peak.*", "red", dashed=True)]),
        timeseries("HBM bandwidth efficiency (share of peak)", f"""
Achieved / peak HBM bandwidth. The verdict's memory_bandwidth score reads the mean over the target's GPUs
(gpm when the GPU has GPM, else model): 0 up to {verdict.pct(verdict.HBM_LOW)} (yellow line), rising linearly to 1 at
{verdict.pct(verdict.HBM_HIGH)}. At {verdict.pct(verdict.HBM_ROOF)} (purple line) \
it reaches {verdict.ROOF_MIN}, the score a
roof needs: from there memory_bandwidth is the verdict unless a constraint scores {verdict.CONSTRAINT_MIN} or more or
compute scores at least as high (ties go to compute). \
The gap between gpm and model is traffic the model does not explain: prefill,
activations, other processes. Low efficiency with high utilization points at small batches, CPU gaps between
steps or the interconnect.
""", [target(TG.sel("llm_hbm_bandwidth_efficiency_ratio"), "{{source}} GPU {{gpu}} {{target}} ({{instance}})")],
            unit="percentunit", w=12, minimum=0, maximum=1, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (verdict.HBM_LOW, "yellow"), (verdict.HBM_ROOF, "purple"))),
        timeseries("Prefill MFU", f"""
Model FLOPs utilization of prefill = 2 x active parameters x prompt tokens/s / (GPUs x peak dense FLOPS).
Prefill is compute-bound. The verdict's compute score is 0 up to {verdict.pct(verdict.MFU_LOW)} MFU (yellow line),
rising linearly to 1 at {verdict.pct(verdict.MFU_HIGH)}; at {verdict.pct(verdict.MFU_ROOF)} (blue line) it reaches
{verdict.ROOF_MIN}, the score a roof needs: from there compute is the verdict unless a constraint scores
{verdict.CONSTRAINT_MIN} or more or memory_bandwidth scores higher. At the compute roof only fewer FLOPs (FP8, prefix
caching) or more TFLOPS help. Low MFU with long TTFT points at queueing, not compute. "engine" series: the
engine's own estimate of FLOP/s per GPU (vLLM estimated_flops_per_gpu, prefill and decode together) over the peak.
""", [target(TM.sel("llm_prefill_mfu_ratio"), "{{target}} {{model}} ({{instance}})"),
      target(TG.sel("llm_engine_flops_utilization_ratio"), "engine GPU {{gpu}} {{target}} ({{instance}})")],
            unit="percentunit", w=12,
            minimum=0, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (verdict.MFU_LOW, "yellow"), (verdict.MFU_ROOF, "blue"))),
        timeseries("Cost model vs observed: the planner's drift", """
The roofline `llm-exporter plan` starts from (docs/planner.md), run live on this window's mean batch and context:
predicted TPOT / observed TPOT - 1, and the same for decode tokens/s. A steady offset is this deployment's
efficiency, which `plan` calibrates away before it predicts anything; a change in it (a driver, an engine
upgrade, a new traffic mix, throttling) means plans calibrated before it are stale: recalibrate. Negative TPOT
error under prompt-heavy load is prefill sharing the decode steps. Absent without a model shape or a known GPU.
""", [target(TM.sel("llm_model_tpot_error_ratio"), "TPOT {{target}} ({{instance}})"),
      target(TM.sel("llm_model_decode_throughput_error_ratio"), "decode tok/s {{target}} ({{instance}})")],
            unit="percentunit", w=12),
        timeseries("Decode steps/s and mean batch size", """
Each decode step reads all weights once and emits one token per running sequence, so decode tokens/s =
steps/s x batch. Steps/s is the per-sequence token rate (1 / TBT); it falls slowly as the batch grows because
each step also reads more KV cache. A batch that does not grow under load is capped by KV or batch limits.
""", [target(TM.sel("llm_decode_steps_per_second"), "steps/s {{target}} ({{instance}})"),
      target(TM.sel("llm_mean_batch_size"), "batch {{target}} ({{instance}})")], unit="short", w=12, minimum=0,
            overrides=[{"matcher": {"id": "byRegexp", "options": "^batch.*"},
                        "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                       {"id": "unit", "value": "short"}]}]),
    )


def memory_row() -> Row:
    return row("Memory",
        timeseries("Device memory per GPU", """
Used vs installed device memory. Engines preallocate most of it on purpose (weights + a KV pool sized to the
rest), so "90% used" is normal; what matters is the KV headroom on the Overview. Reserved is the driver's
share; engine processes is what the engine's own PIDs hold (needs hostPID in containers).
""", [target(G.sel("llm_gpu_memory_used_bytes"), "GPU {{gpu}} ({{instance}}) used"),
      target(G.sel("llm_gpu_memory_total_bytes"), "GPU {{gpu}} ({{instance}}) total"),
      target(G.sel("llm_gpu_memory_reserved_bytes"), "GPU {{gpu}} ({{instance}}) reserved by driver"),
      target(G.sel("llm_gpu_engine_memory_used_bytes"), "GPU {{gpu}} ({{instance}}) engine processes")],
            unit="bytes", w=12, minimum=0, overrides=[color_override(".*total$", "red", dashed=True)]),
        timeseries("Where device memory goes: KV pool vs weights and the rest", """
Per exporter, all its engines and GPUs together: the KV cache pools the engines allocated, the part in use,
and the rest of used memory (weights, activations, CUDA graphs, other processes) = GPU memory used - KV pools.
Only $job and $instance apply: GPU memory carries no target or model label, so both sides of the subtraction
take every target, model and GPU of the exporter ($target, $model and $gpu do not narrow this panel). KV, not
weights, decides concurrency: a bigger pool (quantized weights, higher memory fraction) fits more sequences.
""", [target(f"sum {EXPORTER.by()} ({EX.sel('llm_kv_cache_capacity_bytes')})", "KV pool {{instance}}"),
      target(f"sum {EXPORTER.by()} ({EX.sel('llm_kv_cache_used_bytes')})", "KV in use {{instance}}"),
      target(f"sum {EXPORTER.by()} ({EX.sel('llm_gpu_memory_used_bytes')})\n"
             f"- {EXPORTER.on()}\nsum {EXPORTER.by()} ({EX.sel('llm_kv_cache_capacity_bytes')})",
             "weights + activations + other {{instance}}")],
            unit="bytes", w=12, minimum=0),
    )


def power_row() -> Row:
    return row("Power, clocks and throttling",
        timeseries("Power vs limit", """
Board power against the enforced limit and the board's default. Decode at the bandwidth roof often draws
well below the limit. Dense prefill on the default limit with sw_power_cap active is the card's own ceiling
(an H200 ran matrix products at 75% of max clock there): part of the compute roof. An enforced limit below
the default is someone's cap (nvidia-smi -pl, a rack budget): the power_thermal verdict.
""", [target(G.sel("llm_gpu_power_watts"), "GPU {{gpu}} ({{instance}}) power"),
      target(G.sel("llm_gpu_power_limit_watts"), "GPU {{gpu}} ({{instance}}) limit"),
      target(G.sel("llm_gpu_power_default_limit_watts"), "GPU {{gpu}} ({{instance}}) default limit")],
            unit="watt", w=8, minimum=0, overrides=[color_override(".*limit$", "red", dashed=True)]),
        timeseries("Clocks as a share of max", """
Current SM and memory clock / their maximum. A SM clock well below max while busy, with a throttle reason
below, is the power/thermal bottleneck: tokens/s falls with the clock and a faster GPU would throttle too.
""", [target(f"{G.sel('llm_gpu_sm_clock_hertz')}\n/\n{G.sel('llm_gpu_sm_clock_max_hertz')}",
             "GPU {{gpu}} ({{instance}}) SM"),
      target(f"{G.sel('llm_gpu_memory_clock_hertz')}\n/\n{G.sel('llm_gpu_memory_clock_max_hertz')}",
             "GPU {{gpu}} ({{instance}}) memory")], unit="percentunit", w=8, minimum=0, maximum=1.05),
        timeseries("Temperature", """
GPU die and HBM temperature. Slowdown usually starts in the mid 80s C (card-specific); a sawtooth of
temperature with clocks dropping at the top is failing cooling, not load.
""", [target(G.sel("llm_gpu_temperature_celsius"), "GPU {{gpu}} ({{instance}}) die"),
      target(G.sel("llm_gpu_memory_temperature_celsius"), "GPU {{gpu}} ({{instance}}) HBM")],
            unit="celsius", w=8, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (83, "orange"), (90, "red"))),
        state_timeline("Clock event (throttle) reasons", """
Each reason NVML reports, red while active. gpu_idle and applications_clocks_setting are benign;
sw_power_cap means the power limit holds clocks down (the card's own ceiling on its default limit, a
constraint below it); hw_slowdown, hw_thermal_slowdown, sw_thermal_slowdown
and hw_power_brake_slowdown while serving are the power_thermal bottleneck (alert LLMGPUSlowdownWhileServing).
""", [target(G.sel("llm_gpu_clock_event_active"), "GPU {{gpu}} ({{instance}}) {{reason}}")],
            mappings=BOOL_ACTIVE, w=24, h=8),
    )


def interconnect_row() -> Row:
    return row("Interconnect",
        timeseries("PCIe traffic", """
Bytes/s over PCIe (host <-> GPU). A Gen5 x16 link moves about 63 GB/s each way, Gen4 about 32, Gen3 about 16.
Traffic near the trained link's rate during tensor-parallel decode means all-reduce over PCIe is the step's
bottleneck (interconnect verdict).
""", [target(G.sel("llm_gpu_pcie_tx_bytes_per_second"), "GPU {{gpu}} ({{instance}}) tx"),
      target(G.sel("llm_gpu_pcie_rx_bytes_per_second"), "GPU {{gpu}} ({{instance}}) rx")], unit="Bps", w=8, minimum=0),
        timeseries("NVLink traffic", """
Bytes/s over NVLink, all links. With tensor parallelism every layer all-reduces activations between GPUs;
NVLink keeps that off PCIe. Zero traffic with TP > 1 means the GPUs talk over PCIe (check topology).
""", [target(G.sel("llm_gpu_nvlink_tx_bytes_per_second"), "GPU {{gpu}} ({{instance}}) tx"),
      target(G.sel("llm_gpu_nvlink_rx_bytes_per_second"), "GPU {{gpu}} ({{instance}}) rx")],
            unit="Bps", w=8, minimum=0),
        table("PCIe link: generation and width vs max", """
The PCIe link as trained now against the most the GPU and slot support. Idle GPUs train down to save power
(normal); current below max under load is a bad riser, slot or BIOS setting and halves host transfers.
""", [target(f"max {fleet('instance', 'gpu').by()} ({G.sel('llm_gpu_pcie_link_generation', CURRENT)})"),
      target(f"max {fleet('instance', 'gpu').by()} ({G.sel('llm_gpu_pcie_link_generation', MAXIMUM)})"),
      target(f"max {fleet('instance', 'gpu').by()} ({G.sel('llm_gpu_pcie_link_width', CURRENT)})"),
      target(f"max {fleet('instance', 'gpu').by()} ({G.sel('llm_gpu_pcie_link_width', MAXIMUM)})")],
            w=8, rename={"Value #A": "gen now", "Value #B": "gen max", "Value #C": "width now",
                         "Value #D": "width max"}),
    )


def health_row() -> Row:
    return row("Health and hardware errors",
        state_timeline("GPU reachable", """
Whether NVML could read the GPU this cycle (llm_gpu_up). Down means fallen off the bus, driver error or a
reset in progress: its other series disappear, XID counts stay.
""", [target(G.sel("llm_gpu_up"), "GPU {{gpu}} ({{instance}})")], mappings=BOOL_UP, w=12, h=6,
            steps=thresholds((None, "red"), (1, "green"))),
        table("XID errors in the time range", f"""
XID events per GPU and code over the dashboard's time range. {xid_critical()} are
critical (uncorrectable memory, fallen off the bus, GSP errors); 13, 31, 43, 45 are usually application faults.
See docs/alerts.md for the lists. A code's series starts with its first event, which increase() reads as 0,
so a series that started in the range counts from 0 (the alerts do the same).
""", [target(f"sum {fleet('instance', 'gpu', 'xid').by()} ((increase({xid()}[$__range]) > 0) or clamp_min({xid()} - "
             f"({xid()} offset $__range or {xid()} * 0), 0))")],
            w=12, h=6, rename={"Value": "events"}),
        timeseries("ECC errors, row remapping and PCIe replays", """
Volatile ECC counts since the driver loaded (corrected single-bit are absorbed; any uncorrected one is
critical), remapped rows by state (pending waits for a GPU reset, failed needs service), and PCIe replays/s
(link-level retransmissions: a bad link before it trains down).
""", [target(G.sel("llm_gpu_ecc_errors_total"), "GPU {{gpu}} ({{instance}}) ECC {{type}}"),
      target(G.sel("llm_gpu_remapped_rows"), "GPU {{gpu}} ({{instance}}) rows {{state}}"),
      target(G.rate("llm_gpu_pcie_replay_errors_total"), "GPU {{gpu}} ({{instance}}) PCIe replays/s")],
        unit="short", w=24, h=7, minimum=0),
    )


def _mappings_by_query(panel: Panel, mappings: dict[str, list]) -> Panel:
    """Per-query value mappings: the codes of different gauges overlap (1 is gpu_reset for the
    recovery action and not_started for the fabric state), so one panel-wide mapping cannot name
    them all."""
    panel.body["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": [{"id": "mappings", "value": value}]}
        for ref, value in mappings.items()]
    return panel


def recovery_row() -> Row:
    critical = ", ".join(active()["recovery_action_critical"])
    return row("Recovery action, NVLink fabric and inventory",
        _mappings_by_query(state_timeline("Recovery action and NVLink fabric state", f"""
What the driver asks for before the GPU can be trusted again (llm_gpu_recovery_action): none is green;
{critical} are red (the GPU is unusable until done, LLMGPURecoveryActionRequired pages); drain_p2p and
recover_imex_domain are orange (LLMGPURecoveryActionAdvised). On NVSwitch systems (HGX/DGX, NVL72) the GPU's
NVLink fabric registration (not_started, in_progress, completed: CUDA refuses the GPU before completed) and the
fabric's health summary; GPUs outside a fabric have no fabric rows. A row that stops is a GPU that went down
(see GPU reachable).
""", [target(G.sel("llm_gpu_recovery_action"), "GPU {{gpu}} ({{instance}}) recovery action"),
      target(G.sel("llm_gpu_fabric_state"), "GPU {{gpu}} ({{instance}}) fabric state"),
      target(G.sel("llm_gpu_fabric_health"), "GPU {{gpu}} ({{instance}}) fabric health")],
            w=24, h=7, steps=thresholds((None, "green"), (1, "orange"))),  # orange: a code newer than the maps
            {"A": recovery_map(), "B": FABRIC_STATE_MAP, "C": FABRIC_HEALTH_MAP}),
        table("GPU inventory", """
One row per GPU now: model name, UUID, PCI bus id, driver and CUDA driver version, MIG mode (from llm_gpu_info),
with the enforced power limit and installed memory. Mixed driver versions across a fleet, a GPU with MIG on where
the engine expects a whole GPU, or a lowered power limit stand out here. A GPU that is lost keeps no row.
""", [target(f"max by ({', '.join(INFO_LABELS)}) ({G.sel('llm_gpu_info')})"),
      # No join onto llm_gpu_info: the table's merge matches rows on the labels both queries have,
      # and a join would fail (many-to-many) in the scrape after the info labels change.
      target(f"max by ({', '.join(INFO_LABELS[:4])}) ({G.sel('llm_gpu_power_limit_watts')})"),
      target(f"max by ({', '.join(INFO_LABELS[:4])}) ({G.sel('llm_gpu_memory_total_bytes')})")],
            w=24, h=7, exclude=("Time", "Value #A"),
            rename={"Value #B": "power limit", "Value #C": "memory total", "pci_bus_id": "PCI bus id",
                    "driver_version": "driver", "cuda_version": "CUDA", "mig_mode": "MIG"},
            overrides=[{"matcher": {"id": "byName", "options": "power limit"},
                        "properties": [{"id": "unit", "value": "watt"}]},
                       {"matcher": {"id": "byName", "options": "memory total"},
                        "properties": [{"id": "unit", "value": "bytes"}]}]),
    )


ROWS: tuple[RowBuilder, ...] = (reading_row, busy_row, roofline_row, memory_row, power_row, interconnect_row,
                                health_row, recovery_row)


def build() -> dict:
    return dashboard(FILENAME, TITLE, "Per GPU: utilization read correctly, HBM roofline, MFU, memory, power, "
                     "clocks and throttling, PCIe/NVLink, hardware errors (llm-exporter).", layout(ROWS),
                     standard_variables(gpu=True))
