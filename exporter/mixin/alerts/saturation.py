"""Saturation alerts: KV cache, preemptions, a queue growing while the batch stays flat or standing
deep, and a speculative decoder whose drafts are mostly rejected."""

from __future__ import annotations

from exporter.mixin.alerts.lib import TM, alert, fmt_num, fmt_pct, sel, without


def groups(cfg: dict) -> list[dict]:
    w, qw, sw = cfg["rate_window"], cfg["queue_window"], cfg["spec_window"]
    kw, stw = cfg["kv_cache_window"], cfg["queue_standing_window"]
    usage, kv = "target_model:llm_kv_cache_usage_ratio:max", fmt_num(cfg["kv_cache_usage_ratio"])
    floor = fmt_num(cfg["queue_min_waiting"])
    drafted = f"sum {without(cfg=cfg)} (rate({sel('llm_spec_decode_draft_tokens_total', cfg=cfg)}[{sw}]))"
    accepted = f"sum {without(cfg=cfg)} (rate({sel('llm_spec_decode_accepted_tokens_total', cfg=cfg)}[{sw}]))"
    rules = [
        # `and` the usage now, as for the standing queue below: a dead engine's last samples stay in
        # the window, and as its dips leave it the quantile rose and opened a ticket during the outage
        # (seen in the live story, four seconds after LLMEngineDown).
        alert("LLMKVCacheNearlyFull",
              f"(\n"
              f"  quantile_over_time({fmt_num(round(1 - cfg['kv_cache_share'], 6))}, {usage}[{kw}]) >= {kv}\n"
              f"  or\n"
              f"  (\n"
              f"    max_over_time({usage}[{kw}]) >= {kv}\n"
              f"    and\n"
              f"    sum {without(cfg=cfg)} (increase({sel('llm_preemptions_total', cfg=cfg)}[{kw}])) > 0\n"
              f"  )\n"
              f")\n"
              f"and\n"
              f"{usage}",
              "warning", "KV cache nearly full.",
              f"{TM}: KV cache usage at or above {fmt_pct(cfg['kv_cache_usage_ratio'])} "
              f"({{{{ $value | humanizePercentage }}}}) for over {fmt_pct(cfg['kv_cache_share'])} of the "
              f"last {kw}, or reaching it while the engine preempts sequences: new sequences wait or "
              f"preempt others.",
              cfg["kv_cache_for"], cfg=cfg),
        alert("LLMPreemptionsHappening",
              f"target_model:llm_preemptions:rate{w} > {fmt_num(cfg['preemption_rate'])}",
              "warning", "The engine is preempting sequences: the KV cache ran out.",
              f"{TM}: {{{{ printf \"%.3g\" $value }}}} preemptions/s over {w}; preempted sequences are "
              f"recomputed or swapped, which costs throughput and tail latency.",
              cfg["preemption_for"], cfg=cfg),
        alert("LLMRequestQueueGrowing",
              f"target_model:llm_requests_waiting:sum > {floor}\n"
              f"and\n"
              f"sum {without(cfg=cfg)} (deriv({sel('llm_requests_waiting', cfg=cfg)}[{qw}])) > 0\n"
              f"and\n"
              f"abs(sum {without(cfg=cfg)} (delta({sel('llm_requests_running', cfg=cfg)}[{qw}])))\n"
              f"  <= {fmt_num(cfg['queue_running_flat_ratio'])} * target_model:llm_requests_running:sum",
              "warning", "Requests queue up while the running batch stays flat.",
              f"{TM}: {{{{ $value | humanize }}}} requests waiting and growing over {qw} while the "
              f"running batch did not grow: the engine is at its batch or KV limit.",
              cfg["queue_for"], cfg=cfg),
        # `and` the queue now: over_time keeps a dead engine's last samples for the whole window, and
        # they must not open a ticket during the outage (LLMEngineDown's to report; seen in the live
        # story: the queue stood again just before the kill and the rule fired a second after it).
        alert("LLMRequestQueueStanding",
              f"quantile_over_time({fmt_num(round(1 - cfg['queue_standing_share'], 6))}, "
              f"target_model:llm_requests_waiting:sum[{stw}]) >= {floor}\n"
              f"and\n"
              f"target_model:llm_requests_waiting:sum",
              "warning", "Requests keep waiting: the engine admits no more than it runs.",
              f"{TM}: at least {{{{ $value | humanize }}}} requests waiting in "
              f"{fmt_pct(cfg['queue_standing_share'])} of the last {stw} (floor {floor}). A queue that "
              f"stands instead of draining means arrivals exceed what the engine admits: it runs at its "
              f"sequence or slot cap, its token budget or its KV cache (or not at all: check "
              f"llm_requests_running).",
              cfg["queue_standing_for"], cfg=cfg),
        alert("LLMKVCacheHeadroomExhausted",
              f"min {without(cfg=cfg)} ({sel('llm_kv_cache_headroom_sequences', cfg=cfg)}) "
              f"< {fmt_num(cfg['headroom_min_sequences'])}\n"
              f"and\n"
              f"target_model:llm_requests_waiting:sum > 0",
              "warning", "No KV cache room for another sequence while requests wait.",
              f"{TM}: room for {{{{ printf \"%.1f\" $value }}}} more sequences of the current mean length "
              f"while requests are waiting.",
              cfg["headroom_for"], cfg=cfg),
        alert("LLMSpecDecodeLowAcceptance",
              f"{accepted}\n  /\n{drafted}\n  < {fmt_num(cfg['spec_acceptance_min'])}\nand\n{drafted} > 0",
              "warning", "Speculative decoding accepts too few draft tokens: it slows decoding.",
              f"{TM}: {{{{ $value | humanizePercentage }}}} of draft tokens accepted over {sw} (under "
              f"{fmt_pct(cfg['spec_acceptance_min'])}): each rejected draft costs a draft step and a wider "
              f"verification for nothing.",
              cfg["spec_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.saturation.alerts", "rules": rules}]
