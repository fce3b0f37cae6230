"""The planner's exact test bench (issue 41): a twin engine whose physics the planner is not told,
observed the way a user observes a deployment, then run under each held-out configuration and
compared with what the planner predicted for it.

The twin runs in its own clock (exporter/simulator/engine.py advanced in simulated time), so no
wall-clock noise enters: every error in the table is the planner's.

- **Truth.** The twin's engine with fractions of peak, a per-step overhead and a host time per request
  that are not the planner's priors (TRUTH): the calibration has something to find.
- **Observed through the exporter's window.** The twin's vLLM page at two moments a window apart goes
  through the exporter's normalizer and renderer (the families the exporter's /metrics has), and the
  planner reads the two scrapes and the running gauge sampled once a second with its own
  observe.parse_scrape and observe.point_from_scrapes, as `plan --from URL` does.
- **Observed through a load test's JSON.** Closed-loop steps at 1, 8 and 32 in flight with one prompt
  length and one max_tokens, as `llm-exporter loadtest` sends; the document has the fields the load test
  writes (schema llm-exporter-loadtest/1: its requests' percentiles, throughput, the engine's TTFT and
  inter-token means from the exporter it watched) and is read by observe.from_loadtest.
- **Held out.** Each configuration changes one thing the planner offers a key for (another GPU from the
  catalogue, dtype, KV dtype, TP, max_num_seqs, concurrency, request rate, prompt and output length,
  prefix-cache share); the twin then runs it with the truth's physics and its requests' own TTFT p50,
  TPOT p50 and output tokens/s are the answer.

`python -m tests.planner_twin` prints the table docs/planner.md carries; tests/test_planner_twin.py gates
it in `make test`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.expose import render
from exporter.physics.costs import Hardware
from exporter.planner.model import Setup, engine_config, gpu_device
from exporter.planner.observe import Observed, Point, from_loadtest, parse_scrape, point_from_scrapes
from exporter.planner.plan import apply, parse_candidate, plan
from exporter.probe.loadtest_stats import percentile
from exporter.simulator.engine import Engine, HostConfig, Request, kv_pool_blocks
from exporter.simulator.recorders import make_recorder
from exporter.simulator.workload import LengthDist, Workload
from exporter.sources.engines.normalize import normalize
from exporter.sources.engines.state import NormalizerState
from exporter.specs.models import load_model

MODEL = load_model("llama-3.1-8b")
BASE = Setup(gpu_device("h100-sxm"), MODEL, max_num_seqs=256)
# The truth's physics: not the planner's priors (0.9, 0.6, 0.6 of the peaks, 0.3 ms a step, 0.5 ms a
# request), so the calibration has to find them.
TRUTH = {"bw_efficiency": 0.65, "compute_efficiency": 0.45, "prefill_efficiency": 0.5, "step_overhead_s": 0.8e-3}
TRUTH_HOST_S = 1.5e-3
# The window's traffic: chat-like lognormal lengths, a fifth of each prompt in the prefix cache.
WINDOW_PROMPT = LengthDist(800, sigma=0.5, lo=16, hi=8192)
WINDOW_OUTPUT = LengthDist(200, sigma=0.5, lo=8, hi=2048)
WINDOW_RATE_RPS = 6.0
WINDOW_PREFIX = 0.2
WINDOW_WARMUP_S = 30.0
WINDOW_S = 120.0
# The load test's: one prompt and one max_tokens, steps at these concurrencies.
LT_PROMPT = 512
LT_OUTPUT = 128
LT_LEVELS = (1, 8, 32)
LT_REQUESTS = 120  # measured per step, after as many rounds of warm-up as the level needs
TRUTH_REQUESTS = 400  # measured per held-out run
SEED = 11

# Held-out configurations, as the candidate a user would type: one per prediction path.
WINDOW_CANDIDATES = (
    "gpu=h200", "gpu=l40s", "gpu=a100-sxm4-80gb", "dtype=fp8", "kv_dtype=fp8", "tp=2", "max_num_seqs=16",
    "rate=0.5", "rate=1.5", "concurrency=24", "prompt=2", "output=2", "prefix=0.6",
)
LOADTEST_CANDIDATES = (
    "gpu=h200", "gpu=l40s", "dtype=fp8", "kv_dtype=fp8", "tp=2", "max_num_seqs=16", "concurrency=16",
    "concurrency=64", "rate=1.5", "prompt=2", "output=0.5", "prefix=0.5",
)


class _Tee:
    """The engine's observer: the engine format's recorder (its metrics page), and the finished requests."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.done: list[Request] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        return getattr(self.inner, name) if self.inner is not None else (lambda *a, **k: None)

    def on_finish(self, req: Request, now: float, reason: str) -> None:
        req.finished_at = now
        self.done.append(req)
        if self.inner is not None:
            self.inner.on_finish(req, now, reason)


def truth_engine(setup: Setup, work: Workload, tee: _Tee, seed: int = SEED) -> Engine:
    """The twin's engine on `setup`'s device, model and limits, with the truth's physics."""
    spec = setup.device.spec
    assert spec is not None, "the bench runs GPUs"
    hw = Hardware(spec, tp=setup.tp, **TRUTH)
    host = HostConfig(cpu_budget_cores=64.0, request_overhead_s=TRUTH_HOST_S)
    return Engine(hw, setup.model, engine_config(setup), host, work, random.Random(seed), tee)


@dataclass(frozen=True, slots=True)
class Measured:
    ttft_p50: float
    tpot_p50: float
    output_tps: float


def measure(setup: Setup, work: Workload, requests: int = TRUTH_REQUESTS, seed: int = SEED) -> Measured:
    """The twin under `work`: its requests' own TTFT p50 and TPOT p50 (after a warm-up of a quarter as
    many, and of two rounds of a closed loop), and its throughput. A closed loop's is its clients times
    a request's tokens over a request's cycle (each client sends its next request when the last one
    ends): tokens counted between two moments would depend on where they fall among its waves of
    requests (10% at 128 in flight). An open loop's is the tokens generated while they ran."""
    tee = _Tee()
    engine = truth_engine(setup, work, tee, seed)
    closed = work.arrival == "fixed"
    skip = max(requests // 4, 2 * work.concurrency if closed else 0)
    start_tokens, start_t = 0, 0.0
    while len(tee.done) < skip + requests and engine.t < 3600:
        engine.advance_to(engine.t + 0.25)
        if len(tee.done) >= skip and not start_t:
            start_tokens, start_t = engine.counters.generation_tokens, engine.t
    measured = tee.done[skip:skip + requests]
    ttft = [r.first_token - r.arrival for r in measured]
    tpot = [(r.finished_at - r.first_token) / (r.generated - 1) for r in measured if r.generated > 1]
    if closed:
        cycle = statistics.fmean(r.finished_at - r.arrival for r in measured) + work.think_s
        tps = work.concurrency * statistics.fmean(r.generated for r in measured) / cycle
    else:
        tps = (engine.counters.generation_tokens - start_tokens) / max(1e-9, engine.t - start_t)
    return Measured(percentile(ttft, 0.5), percentile(tpot, 0.5), tps)


# --- observing the truth's calibration configuration ---------------------------------------------------

def window_workload(rate_scale: float = 1.0, prompt_scale: float = 1.0, output_scale: float = 1.0,
                    prefix: float = WINDOW_PREFIX, concurrency: int | None = None) -> Workload:
    prompt = dataclasses.replace(WINDOW_PROMPT, mean=WINDOW_PROMPT.mean * prompt_scale)
    output = dataclasses.replace(WINDOW_OUTPUT, mean=WINDOW_OUTPUT.mean * output_scale)
    if concurrency is not None:
        return Workload(prompt, output, arrival="fixed", concurrency=concurrency, prefix_hit_rate=prefix)
    return Workload(prompt, output, rate_rps=WINDOW_RATE_RPS * rate_scale, load=1.0, prefix_hit_rate=prefix)


def observe_window() -> Observed:
    """The window as `plan --from URL` reads it: the twin's vLLM page normalized and rendered as the
    exporter's /metrics at the window's ends, the running gauge once a second between."""
    setup = BASE
    cfg = engine_config(setup)
    blocks = kv_pool_blocks(Hardware(setup.device.spec, **TRUTH), setup.model, cfg)
    recorder = make_recorder("vllm", MODEL.name, 0.0, 0.0, max_model_len=MODEL.max_context,
                             kv_capacity_tokens=blocks * cfg.block_size)
    tee = _Tee(recorder)
    engine = truth_engine(setup, window_workload(), tee)
    state = NormalizerState()

    def scrape() -> str:
        page = recorder.render(engine.state(), {"gpu_memory_utilization": str(cfg.gpu_memory_utilization),
                                                "enable_prefix_caching": "True"})
        return render(normalize(page, target="twin", kind="vllm", state=state).samples).decode()

    engine.advance_to(WINDOW_WARMUP_S)
    point, hit = _sample_window(engine, scrape, WINDOW_WARMUP_S, WINDOW_S)
    return Observed("twin window", (point,), engine="vllm", model=MODEL.name, gpu_name=setup.device.name,
                    gpu_count=1, prefix_hit_rate=hit)


def _sample_window(engine: Engine, scrape: Callable[[], str], start: float, seconds: float) -> tuple[Point, float]:
    """`seconds` of the exporter's /metrics from `start` (twin time, where the engine stands), as `plan --from
    URL` samples them: a scrape at each end, the running and waiting gauges once a second between."""
    first = parse_scrape(scrape(), "twin")
    running, waiting = [], []
    for second in range(1, int(seconds) + 1):
        engine.advance_to(start + second)
        gauges = parse_scrape(scrape(), "twin").gauges
        running.append(gauges["llm_requests_running"])
        waiting.append(gauges["llm_requests_waiting"])
    last = parse_scrape(scrape(), "twin")
    return point_from_scrapes(first, last, running, seconds, "window", waiting=waiting)


def _pcts(values: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(values, 0.5), "p95": percentile(values, 0.95), "p99": percentile(values, 0.99),
            "count": len(values)}


def loadtest_workload(level: int, prompt: float = LT_PROMPT, output: float = LT_OUTPUT,
                      prefix: float = 0.0) -> Workload:
    return Workload(LengthDist(prompt, kind="fixed"), LengthDist(output, kind="fixed"), arrival="fixed",
                    concurrency=level, prefix_hit_rate=prefix)


def loadtest_step(level: int) -> dict[str, Any]:
    """One closed-loop step as `llm-exporter loadtest --json` writes it (docs/loadtest.md)."""
    tee = _Tee()
    engine = truth_engine(BASE, loadtest_workload(level), tee)
    skip = max(2 * level, 10)
    while len(tee.done) < skip:
        engine.advance_to(engine.t + 0.25)
    # The load test's step is a fixed duration (--duration), long enough here for LT_REQUESTS at the
    # warm-up's pace: its throughput is what that duration saw, waves and all.
    t0, tokens0, n0 = engine.t, engine.counters.generation_tokens, len(tee.done)
    duration = math.ceil(LT_REQUESTS / (skip / t0))
    engine.advance_to(t0 + duration)
    return _step(level, tee.done[n0:], duration, engine.counters.generation_tokens - tokens0)


def _step(level: int, done: Sequence[Request], elapsed: float, gen: int) -> dict[str, Any]:
    """A load test's step over these finished requests: their percentiles, the throughput, and the
    engine's TTFT and inter-token means (what the load test reads from the exporter it watches)."""
    ttft = [r.first_token - r.arrival for r in done]
    tpot = [(r.finished_at - r.first_token) / (r.generated - 1) for r in done]
    return {"mode": "concurrency", "level": level, "elapsed_s": elapsed, "requests": {"ok": len(done)},
            "latency_s": {"ttft": _pcts(ttft), "tpot": _pcts(tpot)},
            "throughput": {"requests_per_s": len(done) / elapsed, "input_tokens": sum(r.prompt for r in done),
                           "output_tokens": sum(r.generated for r in done), "output_tokens_per_s": gen / elapsed},
            "server": {"ttft_mean_s": statistics.fmean(ttft),
                       "itl_mean_s": sum(r.finished_at - r.first_token for r in done)
                       / sum(r.generated - 1 for r in done)},
            "in_flight": {"mean": float(level)}, "client": {"cpu_cores": 0.0}}


def observe_loadtest() -> Observed:
    doc = {"schema": "llm-exporter-loadtest/1", "config": {"model": MODEL.name, "gpu": BASE.device.name},
           "steps": [loadtest_step(level) for level in LT_LEVELS]}
    return from_loadtest(doc, "twin load test")


# --- one run, observed both ways -----------------------------------------------------------------------

SAME_RUN_LEVEL = 32
SAME_RUN_S = 60.0
# Questions both plans answer in one replay mode: the window of a load test's closed loop is read as
# one (observe.closed_loop_level).
SAME_RUN_CANDIDATES = ("concurrency=16", "concurrency=32", "rate=2", "gpu=h200", "gpu=l40s", "dtype=fp8", "tp=2",
                       "prompt=2")


def observe_same_run(seed: int = SEED) -> tuple[Observed, Observed]:
    """One closed loop at SAME_RUN_LEVEL, as a load test runs against an engine its exporter watches:
    the exporter's window over the step and the load test's JSON of the same requests."""
    cfg = engine_config(BASE)
    blocks = kv_pool_blocks(Hardware(BASE.device.spec, **TRUTH), MODEL, cfg)
    recorder = make_recorder("vllm", MODEL.name, 0.0, 0.0, max_model_len=MODEL.max_context,
                             kv_capacity_tokens=blocks * cfg.block_size)
    tee = _Tee(recorder)
    engine = truth_engine(BASE, loadtest_workload(SAME_RUN_LEVEL), tee, seed)
    state = NormalizerState()

    def scrape() -> str:
        page = recorder.render(engine.state(), {"gpu_memory_utilization": str(cfg.gpu_memory_utilization)})
        return render(normalize(page, target="twin", kind="vllm", state=state).samples).decode()

    engine.advance_to(WINDOW_WARMUP_S)
    n0, tokens0 = len(tee.done), engine.counters.generation_tokens
    point, hit = _sample_window(engine, scrape, WINDOW_WARMUP_S, SAME_RUN_S)
    window = Observed("twin window", (point,), engine="vllm", model=MODEL.name, gpu_name=BASE.device.name,
                      gpu_count=1, prefix_hit_rate=hit)
    step = _step(SAME_RUN_LEVEL, tee.done[n0:], SAME_RUN_S, engine.counters.generation_tokens - tokens0)
    doc = {"schema": "llm-exporter-loadtest/1", "config": {"model": MODEL.name, "gpu": BASE.device.name},
           "steps": [step]}
    return window, from_loadtest(doc, "twin load test")


def same_run(seed: int = SEED) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each closed-loop question, as the plan from the window and the plan from the load test answer it."""
    window, loadtest = observe_same_run(seed)
    cands = [parse_candidate(t, i) for i, t in enumerate(SAME_RUN_CANDIDATES)]
    docs = [plan(obs, BASE, cands, ttft_slo=2.5, tpot_slo=0.1, search_rate=False) for obs in (window, loadtest)]
    return [(text, a["predicted"], b["predicted"])
            for text, a, b in zip(SAME_RUN_CANDIDATES, docs[0]["candidates"], docs[1]["candidates"], strict=True)]


def twin_spread(text: str, seeds: Sequence[int] = (1, 2, 3)) -> dict[str, float]:
    """The twin's own spread on a closed-loop question: the half-range of its answers over `seeds`,
    relative to their median, per metric."""
    setup = apply(BASE, parse_candidate(text, 0))
    c = parse_candidate(text, 0).changes
    runs = [measure(setup, loadtest_workload(c.get("concurrency", SAME_RUN_LEVEL), LT_PROMPT * c.get("prompt", 1.0)),
                    seed=s) for s in seeds]
    out = {}
    for key in ("ttft_p50", "tpot_p50", "output_tps"):
        values = [getattr(r, key) for r in runs]
        out[key] = (max(values) - min(values)) / 2 / statistics.median(values)
    return out


# --- the held-out configurations ------------------------------------------------------------------------

def truth_for(source: str, text: str, observed: Observed) -> Measured:
    """What the twin does under the candidate `text`, from the calibration configuration of `source`."""
    cand = parse_candidate(text, 0)
    setup = apply(BASE, cand)
    c = cand.changes
    if source == "window":
        work = window_workload(c.get("rate", 1.0), c.get("prompt", 1.0), c.get("output", 1.0),
                               c.get("prefix", WINDOW_PREFIX), c.get("concurrency"))
    else:
        primary = observed.points[-1]
        level = c.get("concurrency") or max(1, round(primary.level * c.get("rate", 1.0)))
        work = loadtest_workload(level, LT_PROMPT * c.get("prompt", 1.0), LT_OUTPUT * c.get("output", 1.0),
                                 c.get("prefix", 0.0))
    return measure(setup, work)


def err(pred: float | None, truth: float) -> float | None:
    return None if pred is None or not truth else pred / truth - 1.0


@dataclass(frozen=True, slots=True)
class Row:
    source: str
    candidate: str
    truth: Measured
    predicted: dict[str, Any]

    @property
    def errors(self) -> dict[str, float | None]:
        p = self.predicted
        return {"tpot_p50": err(p["tpot_p50_s"], self.truth.tpot_p50),
                "output_tokens_per_s": err(p["output_tokens_per_s"], self.truth.output_tps),
                "ttft_p50": err(p["ttft_p50_s"], self.truth.ttft_p50)}


def bench(source: str) -> tuple[dict[str, Any], list[Row]]:
    """Calibrate on the source's observation of the truth, predict every held-out configuration, run
    each on the twin: the plan and one row per configuration."""
    observed = observe_window() if source == "window" else observe_loadtest()
    candidates = WINDOW_CANDIDATES if source == "window" else LOADTEST_CANDIDATES
    doc = plan(observed, BASE, [parse_candidate(t, i) for i, t in enumerate(candidates)], ttft_slo=2.5,
               tpot_slo=0.1, search_rate=False)
    rows = [Row(source, text, truth_for(source, text, observed), c["predicted"])
            for text, c in zip(candidates, doc["candidates"], strict=True)]
    return doc, rows


KEYS = ("tpot_p50", "output_tokens_per_s", "ttft_p50")


def summary(rows: Sequence[Row]) -> dict[str, tuple[float, float]]:
    """Per metric: the median and the largest absolute error over the rows."""
    out = {}
    for key in KEYS:
        errs = [abs(e) for r in rows if (e := r.errors[key]) is not None]
        out[key] = (statistics.median(errs), max(errs))
    return out


def table(rows: Sequence[Row]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f}"

    def pc(v: float | None) -> str:
        return "-" if v is None else f"{v:+.0%}"

    lines = ["| source | held out | TPOT p50 ms twin / pred | err | tok/s twin / pred | err | TTFT p50 ms twin / pred "
             "| err |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, p, t = r.errors, r.predicted, r.truth
        lines.append(f"| {r.source} | `{r.candidate}` | {ms(t.tpot_p50)} / {ms(p['tpot_p50_s'])} | {pc(e['tpot_p50'])} "
                     f"| {t.output_tps:.0f} / {p['output_tokens_per_s']:.0f} | {pc(e['output_tokens_per_s'])} "
                     f"| {ms(t.ttft_p50)} / {ms(p['ttft_p50_s'])} | {pc(e['ttft_p50'])} |")
    s = summary(rows)
    lines.append("| | **median / max abs** | | " + f"{s['tpot_p50'][0]:.1%} / {s['tpot_p50'][1]:.1%} | | "
                 f"{s['output_tokens_per_s'][0]:.1%} / {s['output_tokens_per_s'][1]:.1%} | | "
                 f"{s['ttft_p50'][0]:.1%} / {s['ttft_p50'][1]:.1%} |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    rows: list[Row] = []
    for source in argv or ("window", "loadtest"):
        rows += bench(source)[1]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
