"""docs/routers.md, generated from the router tables so the doc cannot drift from the code.

    python -m exporter.sources.routers.coverage > docs/routers.md

tests/test_routers.py fails when the committed file differs from this output.
"""

from __future__ import annotations

from exporter.catalog.router import BREAKER_STATES, ERROR_CAUSES
from exporter.derive.bottleneck import SKEW_HIGH, SKEW_MIN
from exporter.derive.routing import IDLE_SHARE, MIN_RATE_PER_S
from exporter.sources.routers.normalize import MAX_BACKEND_CHARS, MAX_BACKENDS
from exporter.sources.routers.registry import SPECS
from exporter.sources.routers.table import RouterSpec

INTRO = f"""# Routers: the layer in front of the engines

Generated from `exporter/sources/routers/*.py` by `python -m exporter.sources.routers.coverage`;
do not edit by hand. The normalized families (`llm_router_*`) are in docs/metrics.md.

Point the exporter at a router's Prometheus page with `--router URL` (repeatable; the options of
`--engine`: `kind=`, `name=`, `timeout=`, credentials, TLS). The kind is detected from the page.
vllm-router and sglang-router serve their metrics on `--prometheus-port` (default 29000), not on the
routing port:

    llm-exporter run --engine http://10.0.0.1:8000/metrics --engine http://10.0.0.2:8000/metrics \\
        --router http://10.0.0.9:29000/metrics

## What only the router shows

- **Share and skew.** Each backend's share of the requests the router sent over the rate window
  (`llm_router_backend_share_ratio`) and the load skew among the backends in rotation
  (`llm_router_load_skew`: the busiest one's request rate over their mean; 1 is even, N is all
  traffic on one of N). Omitted under {MIN_RATE_PER_S} requests/s through the router.
- **Backends out.** A backend whose health check fails or whose circuit breaker is open
  (`llm_router_backend_up`, `llm_router_backend_breaker_state{{state}}`: {", ".join(BREAKER_STATES)}),
  counted in `llm_router_backends_out`; alert LLMRouterBackendOut.
- **Time before the engine.** `llm_router_pre_engine_seconds`: the router's median TTFT (its median
  request latency where it has no TTFT) minus the median of the same over its backends' engines that
  this exporter reads (`llm_time_to_first_token_seconds`, else `llm_e2e_request_latency_seconds`):
  the router's queue, its retries and the network, which no engine sees.
- **The routing verdict.** A backend is joined to an engine target when the router names it by the
  host and port of the target's URL (localhost is 127.0.0.1). An engine whose metrics are on another
  port than its API (Triton's 8002) is not joined: its router's share and skew are still exported.
  For a joined target the verdict is `routing` when the router sends it the highest rate among the
  backends in rotation, the skew is at least {SKEW_MIN} (the score ramps to 1.0 at {SKEW_HIGH}),
  another backend in rotation gets under {IDLE_SHARE:g} of its fair share, and the target misses its
  TTFT or TBT SLO or queues requests (docs/diagnosis.md). Even load, or a skew that hurts no SLO, is not named.
- **Errors by cause** (`llm_router_errors_total{{cause}}`): {", ".join(ERROR_CAUSES)}; each table maps
  its router's error types onto these.

Backend names are reduced to host:port (no scheme, credentials or path), at most
{MAX_BACKEND_CHARS} characters; a page naming more than {MAX_BACKENDS:,} backends has the rest dropped
(`llm_exporter_series_dropped_total{{reason="cardinality"}}`).

## Scaling on the SLO

See docs/scaling.md for the per-replica SLO request rate and the KEDA and prometheus-adapter examples.
"""


def _table(spec: RouterSpec) -> list[str]:
    lines = [f"## {spec.title} (`{spec.kind}`)", "",
             f"Releases: {', '.join(spec.versions)}. Read from: {spec.source}.", "",
             f"Detected by: {', '.join(f'`{m}`' for m in spec.markers)}."
             + (f" Policy from `{spec.policy_from[0]}{{{spec.policy_from[1]}}}`." if spec.policy_from else ""), "",
             "| normalized family | router family | note |", "|---|---|---|"]
    for name, alias in sorted(spec.alias_items(), key=lambda item: (item[1].family, item[0])):
        where = f'{{{alias.where[0]}="{alias.where[1]}"}}' if alias.where else ""
        extra = [alias.note] if alias.note else []
        if alias.cause:
            extra.append(f"cause `{alias.cause}`")
        if alias.role:
            extra.append(f"role `{alias.role}`")
        if alias.states:
            extra.append("state " + ", ".join(f"{v:g} {s}" for v, s in alias.states.items()))
        if alias.removed is not None:
            extra.append(f"{alias.removed:g} (a removed backend) skipped")
        lines.append(f"| `{alias.family}` | `{name}{where}` | {'; '.join(extra)} |")
    if spec.labels:
        lines += ["", "Labels: " + ", ".join(f"`{k}` -> `{v}`" for k, v in spec.labels.items()) + "."]
    if spec.causes:
        lines += ["", "Error causes: " + ", ".join(f"`{k}` -> `{v}`" for k, v in spec.causes.items())
                  + "; any other value -> `other`."]
    lines += ["", "Ignored, and why:", "", "| router family | why |", "|---|---|"]
    lines += [f"| `{name}` | {why} |" for name, why in spec.ignored.items()]
    if spec.notes:
        lines += ["", *(f"- {note}" for note in spec.notes)]
    return [*lines, ""]


def render() -> str:
    out = [INTRO]
    for spec in SPECS.values():
        out.append("\n".join(_table(spec)))
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
