"""Routing alerts: the layer in front of the engines (--router; docs/routers.md): a router not read,
a backend the router took out, one replica given most of the traffic while it misses its SLO and
another idles (the verdict's `routing`), and router errors."""

from __future__ import annotations

from exporter.mixin.alerts.lib import alert, fmt_num, sel


def groups(cfg: dict) -> list[dict]:
    window = cfg["router_error_window"]
    open_, routed, not_client = 'state="open"', 'resource="routing"', 'cause!="client"'
    rules = [
        alert("LLMRouterDown", f"{sel('llm_router_up', cfg=cfg)} == 0",
              "warning", "Router target {{ $labels.target }} is not read.",
              "The exporter on {{ $labels.instance }} cannot scrape or parse the /metrics of router target "
              "{{ $labels.target }} ({{ $labels.router }}): its backends' shares, breakers and the routing "
              "verdict are missing. The router itself may still route.",
              cfg["router_down_for"], cfg=cfg),
        alert("LLMRouterBackendOut",
              f"max without (state) ({sel('llm_router_backend_breaker_state', open_, cfg=cfg)}) == 1\n"
              f"or\n"
              f"{sel('llm_router_backend_up', cfg=cfg)} == 0",
              "warning", "Router {{ $labels.target }} took backend {{ $labels.backend }} out.",
              "Router {{ $labels.target }} ({{ $labels.router }}) sends no traffic to backend "
              "{{ $labels.backend }}: its circuit breaker is open or its health check fails. The other "
              "replicas carry its share; check the backend engine (crashed, restarting, overloaded into "
              "errors) before the rest saturate.",
              cfg["router_backend_out_for"], cfg=cfg),
        alert("LLMRoutingSkew", f"{sel('llm_bottleneck', routed, cfg=cfg)} == 1",
              "warning", "Replica {{ $labels.target }} gets most of the traffic and misses its SLO while "
              "another idles.",
              "The exporter on {{ $labels.instance }} names routing as what limits {{ $labels.target }}: "
              "its router sends it most of the requests (a cache-aware or hashing policy following a hot "
              "prefix or session) while another replica idles, and it misses its TTFT/TBT SLO or queues. "
              "Adding replicas does not help while the policy keeps the skew.",
              cfg["routing_skew_for"], cfg=cfg),
        alert("LLMRouterErrors",
              f"sum without (cause) (rate({sel('llm_router_errors_total', not_client, cfg=cfg)}"
              f"[{window}]))\n"
              f"/\n"
              f"rate({sel('llm_router_requests_total', cfg=cfg)}[{window}])\n"
              f"> {fmt_num(cfg['router_error_ratio'])}",
              "warning", "Router {{ $labels.target }} fails {{ $value | humanizePercentage }} of requests.",
              "Router {{ $labels.target }} ({{ $labels.router }}) answered "
              "{{ $value | humanizePercentage }} of its requests with an error over the last "
              f"{window} (client errors aside): llm_router_errors_total by cause says whether no backend "
              "was available, backends failed or timed out, or the router rejected requests itself.",
              cfg["router_errors_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.routing.alerts", "rules": rules}]
