"""LLM Serving / Host: CPU per core and the engine's busiest thread, NUMA placement, memory, PSI,
the GPUs' PCIe links from sysfs, and the exporter's own health."""

from __future__ import annotations

from exporter.mixin.dashboards import verdict
from exporter.mixin.dashboards.lib import (
    BOOL_UP,
    FILENAMES,
    TOKENS_PER_S,
    Promql,
    Row,
    RowBuilder,
    color_override,
    dashboard,
    fleet,
    layout,
    right_axis,
    row,
    standard_variables,
    state_timeline,
    table,
    target,
    thresholds,
    timeseries,
    value_map,
)

FILENAME = FILENAMES["host"]
TITLE = "LLM Serving / Host"

EX = Promql("exporter")
T = Promql("target")
TM = Promql("target_model")
PER_CPU, BUSIEST = 'cpu!~"all|busiest"', 'cpu="busiest"'
CURRENT, MAXIMUM = 'state="current"', 'state="max"'


def cpu_row() -> Row:
    return row("CPU",
        timeseries("CPU busy: whole host vs busiest core", """
The whole host's busy share against its busiest core. A host at 30% with one core at 100% is a
single-threaded bottleneck (tokenizer, scheduler, HTTP/JSON loop): more cores will not help, a faster core or
moving the work off that thread will.
""", [target(EX.sel("llm_host_cpu_busy_ratio", 'cpu="all"'), "all cores {{instance}}"),
      target(EX.sel("llm_host_cpu_busy_ratio", BUSIEST), "busiest core {{instance}}")],
            unit="percentunit", w=12, minimum=0, maximum=1,
            overrides=[color_override("^busiest.*", "orange")]),
        timeseries("Engine process: busiest thread and cores used", f"""
The engine's busiest thread (0..1 of one core) and the CPU cores the engine process uses in total.
A busy thread while the GPU waits between steps is the host_cpu bottleneck: the Python scheduler, tokenizer
or detokenizer cannot feed the GPU fast enough. The verdict's host_cpu score from the busiest thread is 0 up to
{verdict.pct(verdict.HOST_THREAD_START)} of a core (orange line), rising linearly to 1 at
{verdict.pct(verdict.HOST_THREAD_FULL)}; at {verdict.pct(verdict.HOST_THREAD_VERDICT)} (red line) it reaches
{verdict.CONSTRAINT_MIN}, where host_cpu becomes the verdict unless another constraint scores higher. \
The lines hold for the plain case: the score is
halved while a roof (compute or HBM) scores 0.8 or more, and raised by 0.15 once above 0.3 when the engine is
pinned off its GPUs' NUMA node.
""", [target(EX.sel("llm_engine_process_busiest_thread_cpu_ratio"), "busiest thread {{instance}}"),
      target(EX.rate("llm_engine_process_cpu_seconds_total"), "cores used {{instance}}")],
            unit="percentunit", w=12, minimum=0, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (verdict.HOST_THREAD_START, "orange"),
                             (verdict.HOST_THREAD_VERDICT, "red")),
            overrides=[right_axis("^cores used.*", "short")]),
        state_timeline("CPU busy per core", """
Each core's busy share over time (green idle, red saturated). A single hot row is one thread pinned to one core;
a whole NUMA node's block hot and the other cold is placement, see the NUMA row.
""", [target(EX.sel("llm_host_cpu_busy_ratio", PER_CPU), "cpu {{cpu}} ({{instance}})")], unit="percentunit", w=24, h=8,
        color={"mode": "continuous-GrYlRd"}, minimum=0, maximum=1, merge=False, show_values="never"),
        timeseries("Load average vs cores", """
1, 5 and 15-minute load (runnable plus uninterruptible tasks) against the number of cores. Load above cores
means tasks wait for a CPU; PSI below says how long.
""", [target(EX.sel("llm_host_load1"), "load1 {{instance}}"),
      target(EX.sel("llm_host_load5"), "load5 {{instance}}"),
      target(EX.sel("llm_host_load15"), "load15 {{instance}}"),
      target(EX.sel("llm_host_cpus"), "cores {{instance}}")],
            unit="short", w=12, minimum=0, overrides=[color_override("^cores.*", "red", dashed=True)]),
        timeseries("Engine process: threads and resident memory", """
Threads and resident memory of the engine process (and its children). Steady growth of either is a leak; a
jump in threads with flat throughput is often a tokenizer pool fighting the scheduler for cores.
""", [target(EX.sel("llm_engine_process_threads"), "threads {{instance}}"),
      target(EX.sel("llm_engine_process_resident_memory_bytes"), "RSS {{instance}}")],
            unit="short", w=12, minimum=0, overrides=[right_axis("^RSS.*", "bytes")]),
    )


def numa_memory_row() -> Row:
    return row("NUMA placement and memory",
        state_timeline("Engine pinned off its GPUs' NUMA node", """
1 when the engine process may only run on CPUs outside the NUMA node(s) of its GPUs: every host-to-GPU copy
and every kernel launch then crosses the socket interconnect. Fix with CPU pinning (numactl, cpuset) on the
GPUs' node.
""", [target(EX.sel("llm_engine_numa_mismatch"), "{{instance}}")],
            mappings=value_map([(0, "same node", "green"), (1, "mismatch", "red")]), w=12, h=6),
        table("GPU NUMA nodes (sysfs)", """
The NUMA node each NVIDIA GPU's PCI device is attached to. Pin the engine to the CPUs of that node; with GPUs
on both nodes, pin each tensor-parallel rank to its GPU's node.
""", [target(f"max {fleet('instance', 'pci').by()} ({EX.sel('llm_host_gpu_numa_node')})")], w=12, h=6,
            rename={"Value": "NUMA node", "pci": "PCI address"}),
        timeseries("Memory per NUMA node", """
Used (total - free; page cache counts as used) and total RAM of each NUMA node. One node full and the other
empty, with the engine on the full one, means its allocations spill to the remote node.
""", [target(f"{EX.sel('llm_host_numa_memory_total_bytes')}\n- {EX.sel('llm_host_numa_memory_free_bytes')}",
             "node {{node}} ({{instance}}) used"),
      target(EX.sel("llm_host_numa_memory_total_bytes"), "node {{node}} ({{instance}}) total")],
            unit="bytes", w=12, minimum=0, overrides=[color_override(".*total$", "red", dashed=True)]),
        timeseries("Host memory", """
RAM in use (total - available) against total. The engine's pinned host buffers and CPU KV offload live here;
swapping shows up as memory pressure in the PSI panel.
""", [target(f"{EX.sel('llm_host_memory_total_bytes')}\n- {EX.sel('llm_host_memory_available_bytes')}",
             "used {{instance}}"),
      target(EX.sel("llm_host_memory_total_bytes"), "total {{instance}}")],
            unit="bytes", w=12, minimum=0, overrides=[color_override("^total.*", "red", dashed=True)]),
    )


def pressure_row() -> Row:
    return row("Pressure and the CPU verdict",
        timeseries("PSI: share of time tasks waited", """
Linux pressure stall information ("some", 10 s average): the share of time at least one task waited for CPU,
memory or I/O. CPU pressure while the engine serves means its threads queue for cores; memory pressure means
reclaim or swap stalls.
""", [target(EX.sel("llm_host_pressure_waiting_ratio", 'window="10s"'), "{{resource}} {{instance}}")],
            unit="percentunit", w=12, minimum=0, maximum=1),
        timeseries("Host CPU bottleneck score vs decode tokens/s", f"""
The verdict's host_cpu score per target (0..1; at {verdict.CONSTRAINT_MIN}, the red line, a constraint becomes the
verdict) next to the target's decode tokens/s. A score that rises with load while tokens/s flattens is the CPU
limiting the GPU.
""", [target(T.sel("llm_bottleneck_score", 'resource="host_cpu"'), "host_cpu score {{target}} ({{instance}})"),
      target(TM.sel("llm_decode_tokens_per_second"), "decode tok/s {{target}} {{model}} ({{instance}})")],
            unit="percentunit", w=12, minimum=0, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (verdict.CONSTRAINT_MIN, "red")),
            overrides=[right_axis("^decode.*", TOKENS_PER_S)]),
    )


def pcie_sysfs_row() -> Row:
    return row("GPU PCIe links (sysfs)",
        table("GPU PCIe links from sysfs", """
Each NVIDIA GPU's PCIe link speed (GT/s: 8 = Gen3, 16 = Gen4, 32 = Gen5) and width, as trained now and at
most. Read without NVML, so it works when the driver is wedged; current below max under load is a degraded
link (see the GPU dashboard's NVML view).
""", [target(f"max {fleet('instance', 'pci').by()} ({EX.sel('llm_host_gpu_pcie_link_speed_gts', CURRENT)})"),
      target(f"max {fleet('instance', 'pci').by()} ({EX.sel('llm_host_gpu_pcie_link_speed_gts', MAXIMUM)})"),
      target(f"max {fleet('instance', 'pci').by()} ({EX.sel('llm_host_gpu_pcie_link_width', CURRENT)})"),
      target(f"max {fleet('instance', 'pci').by()} ({EX.sel('llm_host_gpu_pcie_link_width', MAXIMUM)})")],
        w=24, h=6, rename={"Value #A": "GT/s now", "Value #B": "GT/s max", "Value #C": "width now",
                           "Value #D": "width max", "pci": "PCI address"}),
    )


# One link of one exporter's host (instance names repeat across clusters, so cluster and namespace too).
NET = fleet("instance", "device")


def network_row() -> Row:
    engine_info = EX.sel("llm_host_network_info", 'engine="true"')
    link = f"max {NET.by('kind')} ({engine_info})"
    return row("Network links (NIC and RDMA)",
        timeseries("Network link utilization", f"""
Each NIC and RDMA port's traffic over the last cycle as a share of its link rate, per direction (receive,
transmit): sysfs statistics for Ethernet, the port counters for InfiniBand and RoCE (data counted in 4-byte words).
Solid lines are the links the exporter counts as the engine's (its NUMA node, its GPUs' PCIe neighbours, or
configured): the ones tensor parallelism across servers and prefill/decode KV transfer cross. The verdict calls
interconnect from {verdict.pct(verdict.NET_UTIL_VERDICT)} on an engine link when the engine's work is known to
cross servers (red line); without that it is only a lead.
""", [target(EX.sel("llm_host_network_utilization_ratio") + f"\n* on ({', '.join(NET)}) group_left (kind) {link}",
             "{{device}} {{direction}} engine ({{instance}})"),
      target(EX.sel("llm_host_network_utilization_ratio") + f"\nunless on ({', '.join(NET)}) {link}",
             "{{device}} {{direction}} ({{instance}})")],
            unit="percentunit", w=12, minimum=0, maximum=1, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (verdict.NET_UTIL_VERDICT, "red")),
            overrides=[color_override("^((?!engine).)*$", "text", dashed=True)]),
        timeseries("Network errors and drops", """
Errors and drops per second on each link, both directions summed (sysfs rx/tx errors and dropped; for an RDMA
port the receive errors, transmit discards and symbol errors). Any sustained rate on a link that carries tensor
parallel or KV transfer traffic slows every step or transfer (retransmits, NCCL timeouts): check cables,
transceivers and the switch port (LLMNetworkLinkErrors).
""", [target(f"sum {NET.by()} ({EX.rate(f'llm_host_network_{d}_{k}_total')})",
             f"{d} {k} {{{{device}}}} ({{{{instance}}}})")
      for d in ("receive", "transmit") for k in ("errors", "drops")], unit="short", w=12, minimum=0),
        table("Network links: state and rate", """
Each link's kind (ethernet, infiniband, roce), NUMA node, whether it counts as the engine's, state (1 up) and
rate. A link down, or at a lower rate than it had (LLMNetworkLinkBelowRate: renegotiated down after a bad
cable or a switch port change), halves what crosses it.
""", [target(f"max by ({', '.join(NET)}, kind, numa_node, engine) ({EX.sel('llm_host_network_info')})",
),
      target(f"max by ({', '.join(NET)}) ({EX.sel('llm_host_network_up')})", instant=True, fmt="table"),
      target(f"max by ({', '.join(NET)}) ({EX.sel('llm_host_network_speed_bytes_per_second')}) * 8")],
            w=24, h=6, rename={"Value #B": "up", "Value #C": "bits/s", "numa_node": "NUMA node"}),
    )


def self_health_row() -> Row:
    return row("Exporter self-health",
        state_timeline("Source status", """
Whether each of the exporter's sources (engine:<target>, gpu, host) succeeded on its last collection. A
failing source's series are absent, not zero: panels that read it go blank rather than lie.
""", [target(EX.sel("llm_exporter_source_up"), "{{source}} {{instance}}")], mappings=BOOL_UP, w=12, h=6,
            steps=thresholds((None, "red"), (1, "green"))),
        timeseries("Collection duration", """
Wall time of each source's last collection and of the whole cycle (sources and derive). A source near the
collection interval or its timeout delays nothing (scrapes read the last snapshot) but makes its data stale.
""", [target(EX.sel("llm_exporter_collect_duration_seconds"), "{{source}} {{instance}}"),
      target(EX.sel("llm_exporter_cycle_duration_seconds"), "whole cycle {{instance}}")],
            unit="s", w=12, h=6, minimum=0),
        timeseries("Time since last successful collection", """
Seconds since each source last succeeded. It stays near the interval while healthy and grows while
every collection fails (LLMExporterSourceFailing for the GPU and host sources, LLMEngineDown for an
engine); a source that fails on and off shows as a saw-tooth (LLMExporterSourceFlapping).
""", [target(f"time() - {EX.sel('llm_exporter_last_success_timestamp_seconds')}", "{{source}} {{instance}}")],
            unit="s", w=8, minimum=0),
        timeseries("Collection errors by reason", """
Failed collections per second by source and reason code (timeout, connection, parse, ...). Pair with Source
status: a steady trickle of timeouts on one engine target usually means its /metrics page is too large or slow.
""", [target(f"sum {fleet('instance', 'source', 'reason').by()} ({EX.rate('llm_exporter_collect_errors_total')})",
             "{{source}} {{reason}} {{instance}}")], unit="short", w=8, minimum=0),
        timeseries("Requests refused and series dropped", """
What the exporter refused to protect itself (docs/security.md has each limit): /metrics requests and
pages answered 503 because too many were in flight, HTTP connections it closed (idle or slow clients,
evicted at the connection limit), and engine series dropped by reason
(cardinality, over-long labels, invalid histograms or counters). All should stay near 0: refused
requests or closed connections point at a scrape storm or a hostile client, drops at an engine page
the exporter cannot trust.
""", [target(EX.rate("llm_exporter_scrapes_rejected_total"), "scrapes rejected/s {{instance}}"),
      target(EX.sum_rate("llm_exporter_http_requests_rejected_total", by=("instance", "path", "reason")),
             "{{path}} {{reason}}/s {{instance}}"),
      target(EX.sum_rate("llm_exporter_http_connections_rejected_total", by=("instance", "reason")),
             "connections closed {{reason}}/s {{instance}}"),
      target(EX.sum_rate("llm_exporter_series_dropped_total", by=("instance", "source", "reason")),
             "series dropped {{reason}}/s {{source}} {{instance}}")],
            unit="short", w=8, minimum=0),
        table("Exporter build", """
Version of each exporter and its Python; collection cycles completed since start. Mixed versions across
exporters explain panels that are blank on some instances only.
""", [target(f"max {fleet('instance', 'version', 'python').by()} ({EX.sel('llm_exporter_build_info')})"),
      target(f"max {fleet('instance').by()} ({EX.sel('llm_exporter_collections_total')})")],
        w=24, h=5, rename={"Value #A": "build_info", "Value #B": "cycles"}, exclude=("Time", "Value #A")),
    )


ROWS: tuple[RowBuilder, ...] = (cpu_row, numa_memory_row, pressure_row, pcie_sysfs_row, network_row,
                                self_health_row)


def build() -> dict:
    return dashboard(FILENAME, TITLE, "The host next to the engine: CPU per core and the engine's busiest thread, "
                     "NUMA placement, memory, PSI, GPU PCIe links from sysfs, and the exporter's own health "
                     "(llm-exporter).", layout(ROWS), standard_variables())
