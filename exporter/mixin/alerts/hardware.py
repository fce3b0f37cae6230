"""Hardware alerts: XIDs, ECC, row remapping, the driver's recovery action, the NVLink fabric,
throttling, PCIe links, GPU memory, NUMA, a stuck non-GPU bottleneck verdict."""

from __future__ import annotations

from exporter.mixin.alerts.lib import GPU, alert, fmt_num, fmt_pct, on_gpu_join, regex_of, sel
from exporter.specs.nvml_codes import FABRIC_COMPLETED, FABRIC_HEALTH, FABRIC_HEALTHY, RECOVERY_ACTIONS


def code_name(codes: tuple[tuple[int, str], ...]) -> str:
    """An alert template that names a code-valued gauge's $value (`gpu_reset` for 1), so the page
    says what the driver asks for without a lookup table."""
    branches = "".join(f"{{{{ {'if' if i == 0 else 'else if'} eq $value {code:.1f} }}}}{name}"
                       for i, (code, name) in enumerate(codes))
    return branches + "{{ else }}code {{ $value }}{{ end }}"


def equals_any(series: str, codes: list[int]) -> str:
    """`S == 1 or S == 2 ...`: PromQL has no set membership for sample values."""
    return "\nor\n".join(f"{series} == {code}" for code in codes)


def recovery_and_fabric(cfg: dict) -> list[dict]:
    """The driver's recovery action and the NVLink fabric state (NVSwitch systems)."""
    names = {name: code for code, name in RECOVERY_ACTIONS}
    wrong = sorted(set(cfg["recovery_action_critical"]) - set(names) | {"none"} & set(cfg["recovery_action_critical"]))
    if wrong:
        raise ValueError(f"recovery_action_critical: {wrong} are not actions that need doing; "
                         f"choose from {', '.join(n for n in names if n != 'none')}")
    action = sel("llm_gpu_recovery_action", cfg=cfg)
    critical = equals_any(action, sorted(names[n] for n in cfg["recovery_action_critical"]))
    up = f"{sel('llm_gpu_up', cfg=cfg)} == 1"
    what = code_name(RECOVERY_ACTIONS)
    fabric_for = cfg["fabric_for"]
    return [
        alert("LLMGPURecoveryActionRequired", critical,
              "critical", f"GPU {{{{ $labels.gpu }}}} needs {what}.",
              f"{GPU}: the driver asks for {what} (llm_gpu_recovery_action {{{{ $value }}}}) before the GPU can "
              f"be used again. Drain its engine and do that; until then its work fails or is wrong.",
              cfg["recovery_action_for"], cfg=cfg),
        alert("LLMGPURecoveryActionAdvised", f"{action} > 0\nunless\n({critical})",
              "warning", f"GPU {{{{ $labels.gpu }}}}: the driver advises {what}.",
              f"{GPU}: the driver asks for {what} (llm_gpu_recovery_action {{{{ $value }}}}); the GPU still "
              f"runs, but peer-to-peer or multi-node NVLink work on it may fail until that is done.",
              cfg["recovery_action_for"], cfg=cfg),
        # `and` binds tighter than `or` in PromQL: the parentheses are the rule.
        alert("LLMGPUFabricNotReady",
              f"(\n  {sel('llm_gpu_fabric_state', cfg=cfg)} != {FABRIC_COMPLETED}\n"
              f"  or\n  {sel('llm_gpu_fabric_status', cfg=cfg)} != 0\n)\nand\n{up}",
              "critical", "GPU {{ $labels.gpu }} has not joined the NVLink fabric.",
              f"{GPU} has been up for {fabric_for} without a successful NVLink fabric registration: the "
              f"fabric state is not completed (1 not started, 2 in progress) or it completed with a non-zero "
              f"NVML status (value {{{{ $value }}}}). CUDA cannot use the GPU until then; check "
              f"nvidia-fabricmanager and the NVSwitches.",
              fabric_for, cfg=cfg),
        alert("LLMGPUFabricDegraded",
              f"{sel('llm_gpu_fabric_health', cfg=cfg)} != {FABRIC_HEALTHY}\nand\n{up}",
              "warning", "NVLink fabric of GPU {{ $labels.gpu }} is degraded.",
              f"{GPU}: the NVLink fabric reports {code_name(FABRIC_HEALTH)} for {fabric_for}: all-reduce "
              f"between GPUs runs slower or over fewer links.",
              fabric_for, cfg=cfg),
    ]


def groups(cfg: dict) -> list[dict]:
    crit, warn = set(cfg["xid_critical"]), set(cfg["xid_warning"])
    if crit & warn:
        raise ValueError(f"XID codes in both the critical and the warning list: {sorted(crit & warn)}")
    xw, join = cfg["xid_window"], on_gpu_join(cfg)
    sw = cfg["slowdown_window"]
    slowdown = sel("llm_gpu_clock_event_active", f'reason=~"{regex_of(cfg["slowdown_reasons"])}"', cfg=cfg)
    current, maximum = 'state="current"', 'state="max"'
    ecc = sel("llm_gpu_ecc_errors_total", 'type="uncorrected"', cfg=cfg)
    rules = []
    for name, sev, codes in (("LLMGPUXidCritical", "critical", cfg["xid_critical"]),
                             ("LLMGPUXidWarning", "warning", cfg["xid_warning"])):
        series = sel("llm_gpu_xid_errors_total", f'xid=~"{regex_of(codes)}"', cfg=cfg)
        # A series is created by its first event, and increase() of a new series is 0: the second
        # branch catches a series with no sample at all in the window before the last one. (Not
        # `unless S offset 1h`: that single point is missing after any scrape gap an hour ago,
        # and an old XID would page again.)
        rules.append(alert(
            name,
            f"increase({series}[{xw}]) > 0\n"
            f"or\n"
            f"({series} unless max_over_time({series}[{xw}] offset {xw}))",
            sev, "XID {{ $labels.xid }} on GPU {{ $labels.gpu }}.",
            f"{GPU} reported XID {{{{ $labels.xid }}}} ({{{{ $value | humanize }}}} events in the last "
            f"{xw}).",
            labels=None, cfg=cfg,
        ))
    ew = cfg["ecc_window"]
    rules += [
        # As the XID alerts: increase() sees errors counted while the exporter watched; the second
        # branch a count already there when the GPU was first scraped (no sample in the window before
        # the last), which increase() of a new series reads as 0. It pages for one window, like a new
        # error, and not again while the series stays.
        alert("LLMGPUUncorrectableECCErrors",
              f"increase({ecc}[{ew}]) > 0\n"
              f"or\n"
              f"({ecc} > 0 unless max_over_time({ecc}[{ew}] offset {ew}))",
              "critical", "Uncorrectable ECC errors on GPU {{ $labels.gpu }}.",
              f"{GPU} counted {{{{ $value | humanize }}}} uncorrected (double-bit) ECC errors that are new in "
              f"the last {ew} or were there when the exporter first saw the GPU.", cfg=cfg),
        alert("LLMGPURowRemapFailure",
              sel("llm_gpu_remapped_rows", 'state="failed"', cfg=cfg) + " > 0",
              "critical", "Row remapping failed on GPU {{ $labels.gpu }}.",
              f"{GPU}: a memory row remap failed; the GPU needs service.", cfg=cfg),
        alert("LLMGPURowRemapPending",
              sel("llm_gpu_remapped_rows", 'state="pending"', cfg=cfg) + " > 0",
              "warning", "A row remap waits for a reset of GPU {{ $labels.gpu }}.",
              f"{GPU}: a memory row remap is pending; it takes effect at the next GPU reset.",
              cfg["row_remap_pending_for"], cfg=cfg),
        alert("LLMGPUSlowdownWhileServing",
              f"avg_over_time({slowdown}[{sw}]) > {fmt_num(cfg['slowdown_ratio'])}\n"
              f"and on ({join})\n"
              f"(sum by ({join}) (max_over_time({sel('llm_requests_running', cfg=cfg)}[{sw}])) > 0)",
              "warning", "GPU {{ $labels.gpu }} is throttled ({{ $labels.reason }}) while serving.",
              f"{GPU} had clock event {{{{ $labels.reason }}}} active {{{{ $value | humanizePercentage }}}} "
              f"of the last {sw} while its engine ran requests: clocks, and so tokens/s, are held down "
              f"by heat or power.",
              cfg["slowdown_for"], cfg=cfg),
    ]
    rules += recovery_and_fabric(cfg)
    load = f"{sel('llm_gpu_utilization_ratio', cfg=cfg)} > {fmt_num(cfg['pcie_load_utilization'])}"
    for name, metric, what in (("LLMGPUPCIeLinkGenerationDegraded", "llm_gpu_pcie_link_generation",
                                "generation"),
                               ("LLMGPUPCIeLinkWidthDegraded", "llm_gpu_pcie_link_width", "width")):
        unit = "Gen {{ $value }}" if what == "generation" else "x{{ $value }}"
        rules.append(alert(
            name,
            f"{sel(metric, current, cfg=cfg)}\n"
            f"  < ignoring (state) {sel(metric, maximum, cfg=cfg)}\n"
            f"and ignoring (state)\n"
            f"({load})",
            "warning", f"PCIe link of GPU {{{{ $labels.gpu }}}} runs below its max {what} under load.",
            f"{GPU}: PCIe link at {unit}, below the max the GPU and slot support, while the GPU is "
            f"more than {fmt_pct(cfg['pcie_load_utilization'])} busy.",
            cfg["pcie_for"], cfg=cfg,
        ))
    rules += [
        alert("LLMGPUMemoryNearlyFull",
              f"{sel('llm_gpu_memory_used_bytes', cfg=cfg)}\n/\n"
              f"{sel('llm_gpu_memory_total_bytes', cfg=cfg)}\n"
              f"> {fmt_num(cfg['gpu_memory_ratio'])}",
              "info", "GPU {{ $labels.gpu }} memory is nearly full.",
              f"{GPU}: {{{{ $value | humanizePercentage }}}} of device memory in use (threshold "
              f"{fmt_pct(cfg['gpu_memory_ratio'])}). Engines preallocate most memory on purpose; this "
              f"means nothing is left for activations, CUDA graphs or a second process.",
              cfg["gpu_memory_for"], cfg=cfg),
        alert("LLMGPULost", f"{sel('llm_gpu_up', cfg=cfg)} == 0",
              "critical", "GPU {{ $labels.gpu }} is lost.",
              f"{GPU} cannot be read through NVML (fallen off the bus, driver error, or reset "
              f"in progress).", cfg["gpu_lost_for"], cfg=cfg),
        alert("LLMEngineNUMAMismatch", f"{sel('llm_engine_numa_mismatch', cfg=cfg)} == 1",
              "warning", "The engine process runs on the wrong NUMA node.",
              "{{ $labels.instance }}: the engine process is pinned to CPUs outside the NUMA node of "
              "its GPUs; host-to-GPU copies and scheduling pay the cross-socket hop.",
              cfg["numa_for"], cfg=cfg),
        alert("LLMBottleneckStuck",
              sel("llm_bottleneck", f'resource=~"{regex_of(cfg["bottleneck_resources"])}"', cfg=cfg)
              + " == 1",
              "warning", "{{ $labels.target }} is limited by {{ $labels.resource }}, not by the GPU.",
              f"{{{{ $labels.target }}}} on {{{{ $labels.instance }}}}: the bottleneck verdict has been "
              f"{{{{ $labels.resource }}}} for {cfg['bottleneck_for']}. A faster GPU would not help; fix "
              f"the {{{{ $labels.resource }}}} limit first.",
              cfg["bottleneck_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.hardware.alerts", "rules": rules}]
