"""Network alerts: the engine's links between servers (down, erroring, renegotiated below the rate
they had) and prefill/decode KV transfer (a queue of requests waiting for their KV that stands).

Only the links the exporter counts as the engine's (`llm_host_network_info{engine="true"}`: its NUMA
node, its GPUs' PCIe neighbours, or configured) alert: an unused port down is nobody's page."""

from __future__ import annotations

from exporter.mixin.alerts.lib import TM, alert, fmt_num, fmt_pct, sel, without

LINK = "{{ $labels.device }} on {{ $labels.instance }}"


def groups(cfg: dict) -> list[dict]:
    info = sel("llm_host_network_info", 'engine="true"', cfg=cfg)
    engine_link = f"and on (instance, device)\n  {info}"  # the engine's links only
    ew, bw = cfg["network_error_window"], cfg["network_rate_lookback"]
    counters = [sel(f"llm_host_network_{d}_{k}_total", cfg=cfg) for d in ("receive", "transmit")
                for k in ("errors", "drops")]
    errors = " +\n".join(f"  sum by (instance, device) (rate({c}[{ew}]))" for c in counters)
    speed = sel("llm_host_network_speed_bytes_per_second", cfg=cfg)
    waiting = f"sum {without(cfg=cfg)} ({sel('llm_requests_waiting_kv_transfer', cfg=cfg)})"
    kw = cfg["kv_transfer_queue_window"]
    rules = [
        alert("LLMNetworkLinkDown",
              f"{sel('llm_host_network_up', cfg=cfg)} == 0\n{engine_link}",
              "critical", "Network link {{ $labels.device }} of the engine is down.",
              f"{LINK}: an engine link (tensor parallel or KV transfer traffic between servers) is not up "
              f"(Ethernet operstate, or the InfiniBand/RoCE port not ACTIVE).",
              cfg["network_down_for"], cfg=cfg),
        alert("LLMNetworkLinkErrors",
              f"(\n{errors}\n) > {fmt_num(cfg['network_errors_per_second'])}\n{engine_link}",
              "warning", "Network link {{ $labels.device }} of the engine drops or corrupts packets.",
              f"{LINK}: {{{{ printf \"%.3g\" $value }}}} errors and drops per second over {ew} on an engine "
              f"link: retransmits and NCCL/NIXL retries slow every step or KV transfer that crosses it.",
              cfg["network_errors_for"], cfg=cfg),
        alert("LLMNetworkLinkBelowRate",
              f"{speed}\n  < {fmt_num(cfg['network_rate_ratio'])} * max_over_time({speed}[{bw}])\n{engine_link}",
              "warning", "Network link {{ $labels.device }} of the engine runs below the rate it had.",
              f"{LINK}: link rate {{{{ $value | humanize }}}}B/s, below {fmt_pct(cfg['network_rate_ratio'])} of "
              f"its highest in the last {bw}: renegotiated down (cable, transceiver, switch port).",
              cfg["network_rate_for"], cfg=cfg),
        alert("LLMKVTransferQueueStanding",
              f"quantile_over_time({fmt_num(round(1 - cfg['kv_transfer_queue_share'], 6))}, ({waiting})[{kw}:])"
              f" >= {fmt_num(cfg['kv_transfer_queue_min'])}\n"
              f"and\n{waiting} > 0",  # resolves as soon as the queue empties
              "warning", "Requests keep waiting for their KV cache to arrive.",
              f"{TM}: at least {{{{ $value | humanize }}}} requests waiting for a KV transfer between "
              f"prefill and decode instances in {fmt_pct(cfg['kv_transfer_queue_share'])} of the last {kw}: "
              f"the transfer link, not the GPU, sets TTFT.",
              cfg["kv_transfer_queue_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.network.alerts", "rules": rules}]
