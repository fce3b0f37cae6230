"""The scaling signal per model: how many replicas the observed request rate needs, each replica
loaded to its SLO-bounded rate less a stated headroom (docs/scaling.md).

`llm_slo_max_request_rate` (exporter/derive/scaling.py) is per replica: the request rate at which that
replica would break its TTFT and TPOT SLOs on the traffic it sees. Per model (cluster, namespace,
model: lib.by_fleet):

- `model:llm_slo_max_request_rate:avg`: the mean of the replicas' rates (a replica without traffic in
  its window has no rate and does not count);
- `model:llm_requests:rate<window>`: requests finished per second, summed over the replicas;
- `model:llm_replicas_needed:ratio` = ceil(requests/s / the mean max rate / (1 - headroom)), headroom
  CONFIG["scaling_headroom"] (0.2: each replica runs at most at 80% of the rate where it breaks its
  SLOs). What a KEDA ScaledObject or an HPA on an external metric reads
  (deploy/kubernetes/examples/scaling/).

No sample where no replica has a max rate (no traffic, or no model shape or GPU spec), never a
made-up number; 0 where a model's replicas have a rate but finished nothing in the window.
"""

from __future__ import annotations

from exporter.mixin.alerts.lib import by_fleet, fmt_num, nominal, rec, sel, when_positive

MAX_RATE = "llm_slo_max_request_rate"
FINISHED = "llm_requests_finished_total"


def max_rate_rule() -> str:
    return f"model:{MAX_RATE}:avg"


def request_rate_rule(window: str) -> str:
    return f"model:llm_requests:rate{nominal(window)}"


REPLICAS_NEEDED = "model:llm_replicas_needed:ratio"


def groups(cfg: dict) -> list[dict]:
    w = cfg["rate_window"]
    headroom = cfg["scaling_headroom"]
    if not 0 <= headroom < 1:
        raise ValueError(f"scaling_headroom {headroom!r}: a share from 0 to below 1")
    fleet = by_fleet("model", cfg=cfg)
    max_rate = f"avg {fleet} ({sel(MAX_RATE, cfg=cfg)})"
    requests = f"sum {fleet} (rate({sel(FINISHED, cfg=cfg)}[{w}]))"
    needed = (f"ceil(\n  {request_rate_rule(w)}\n  /\n  {when_positive(max_rate_rule())}\n"
              f"  / {fmt_num(round(1 - headroom, 6))}\n)")
    return [{"name": "llm-exporter.scaling.rules", "rules": [
        rec(max_rate_rule(), max_rate),
        rec(request_rate_rule(w), requests),
        rec(REPLICAS_NEEDED, needed),
    ]}]
