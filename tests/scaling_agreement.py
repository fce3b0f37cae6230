"""The scaling signal (exporter/derive/scaling.py) against the planner's rate search on the same twin
window: each case runs a twin scenario (exporter/simulator) fast-forwarded, its vLLM page through the
exporter's normalizer into the Deriver (llm_slo_max_request_rate) and, rendered as the exporter's
/metrics, into the planner's own window reader, calibration and max_rate, as `llm-exporter plan --from
URL` does. `python -m tests.scaling_agreement` prints the table docs/scaling.md carries;
tests/test_scaling.py gates it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import MappingProxyType

from exporter.config import Config
from exporter.derive import build_deriver
from exporter.expose import render
from exporter.planner.model import Setup, calibrate, gpu_device
from exporter.planner.observe import Observed, parse_scrape, point_from_scrapes
from exporter.planner.plan import max_rate
from exporter.simulator import Twin, TwinConfig
from exporter.slo import TBT, TTFT
from exporter.snapshot import Snapshot, SourceKind, SourceResult
from exporter.sources.engines.normalize import normalize
from exporter.sources.engines.state import NormalizerState
from exporter.sources.gpu.sim import samples_from_state
from exporter.specs.models import load_model

EPOCH = 1_700_000_000.0
WARMUP_S = 60
WINDOW_S = 60
SEED = 0


@dataclass(frozen=True, slots=True)
class Case:
    scenario: str
    gpu: str
    model: str


# Gated (tests/test_scaling.py): chat traffic on three GPUs and two models, where the rate is bounded
# by TTFT at the running-sequence limit (the queue for a slot), and long prompts with short answers,
# where TPOT p99 is (prefill steps riding on the decodes).
GATED = (
    Case("decode-heavy", "h100-sxm", "llama-3.1-8b"),
    Case("decode-heavy", "a100-sxm4-80gb", "qwen2.5-7b"),
    Case("prefill-heavy", "h100-sxm", "llama-3.1-8b"),
)
# Reported, not gated (docs/scaling.md says why each misses): at the slot limit, where the replay's
# step at a full batch is longer than the closed form's (a model whose KV cache bounds the slots, a
# slower GPU, an MoE model).
REPORTED = (
    Case("decode-heavy", "h100-sxm", "llama-2-7b"),
    Case("decode-heavy", "l40s", "qwen2.5-7b"),
    Case("decode-heavy", "h200", "mixtral-8x7b"),
)
# Printed with the others, not gated (they agree: the test keeps to the three above for CI's time): chat
# traffic on another model and GPU, long prompts on two more GPUs and another model.
MORE = (
    Case("decode-heavy", "h100-sxm", "qwen2.5-7b"),
    Case("decode-heavy", "h200", "llama-3.1-8b"),
    Case("prefill-heavy", "h200", "llama-3.1-8b"),
    Case("prefill-heavy", "a100-sxm4-80gb", "llama-3.1-8b"),
    Case("prefill-heavy", "h100-sxm", "qwen2.5-7b"),
)
CASES = GATED + MORE + REPORTED


@dataclass(frozen=True, slots=True)
class Row:
    case: Case
    runtime: float | None  # llm_slo_max_request_rate at the window's end
    limit: str
    planner: float | None  # plan.max_rate, calibrated on the window
    observed: float  # requests/s the window finished

    @property
    def diff(self) -> float | None:
        if self.runtime is None or not self.planner:
            return None
        return self.runtime / self.planner - 1.0


def run(case: Case) -> Row:
    config = TwinConfig(scenario=case.scenario, gpu=case.gpu, model=case.model, seed=SEED, epoch=EPOCH)
    twin = Twin(config)
    # The deriver's rate window spans the planner's window, so both read the same requests.
    deriver = build_deriver(Config(interval_s=1.0, rate_window_s=float(WINDOW_S), model=case.model))
    state = NormalizerState()
    previous: Snapshot | None = None

    def cycle() -> tuple[str, tuple]:
        nonlocal previous
        scrape = normalize(twin.metrics_text(), target="t", kind=None, state=state, max_series=10_000)
        engine = SourceResult("engine:t", True, 0.0, 0.0, scrape.samples, kind=SourceKind.ENGINE,
                              attrs=MappingProxyType({"kind": "engine", "target": "t", "engine": scrape.kind,
                                                      "model": scrape.model}))
        gpu = SourceResult("gpu", True, 0.0, 0.0, tuple(samples_from_state(twin.gpu_state())), kind=SourceKind.GPU)
        snap = Snapshot(EPOCH + twin.now, MappingProxyType({"engine:t": engine, "gpu": gpu}))
        out = deriver(snap, previous)
        previous = snap
        return render(scrape.samples).decode(), out

    for _ in range(WARMUP_S):
        twin.fast_forward(1.0)
        cycle()
    page, out = cycle()
    first = parse_scrape(page, "t")
    running, waiting = [], []
    for _ in range(WINDOW_S):
        twin.fast_forward(1.0)
        page, out = cycle()
        gauges = parse_scrape(page, "t").gauges
        running.append(gauges["llm_requests_running"])
        waiting.append(gauges.get("llm_requests_waiting", 0.0))
    last = parse_scrape(page, "t")
    point, hit = point_from_scrapes(first, last, running, WINDOW_S, "window", waiting=waiting)
    observed = Observed("twin window", (point,), engine="vllm", model=case.model, gpu_name=case.gpu, gpu_count=1,
                        prefix_hit_rate=hit)
    runtime = next((s.value for s in out if s.name == "llm_slo_max_request_rate"), None)
    limit = deriver.diagnosis()["targets"]["t"]["numbers"].get("slo_max_rate_limit") or ""
    base = Setup(gpu_device(case.gpu), load_model(case.model), max_num_seqs=256)
    cal = calibrate(base, observed.points, seed=SEED, prefix_hit_rate=hit)
    planned = max_rate(base, cal, point, {"rate": 1.0, "prompt": 1.0, "output": 1.0}, TTFT.threshold_seconds,
                       TBT.threshold_seconds, SEED)
    return Row(case, runtime, limit, planned, point.requests_per_s or 0.0)


def table(rows: list[Row]) -> str:
    lines = ["| scenario | GPU | model | observed req/s | llm_slo_max_request_rate | limit | planner max_rate | diff |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = "n/a" if r.diff is None else f"{r.diff:+.1%}"
        lines.append(f"| {r.case.scenario} | {r.case.gpu} | {r.case.model} | {r.observed:.2f} | "
                     f"{r.runtime if r.runtime is None else round(r.runtime, 2)} | {r.limit} | {r.planner} | {diff} |")
    return "\n".join(lines)


if __name__ == "__main__":
    wanted = sys.argv[1:]
    print(table([run(c) for c in CASES if not wanted or c.scenario in wanted]), flush=True)
