"""Calibrate, then predict each candidate: the planner's one pipeline, and its JSON (schema
llm-exporter-plan/1, docs/planner.md). The command line (cmd.py) and the live validation call this."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.planner.limits import (
    MAX_CONCURRENCY,
    MAX_CPU_THREADS,
    MAX_NUM_SEQS,
    MAX_PLAN_CPU_S,
    MAX_PRICE,
    MAX_RATE_RPS,
    MAX_SCALE,
    MAX_TOKENS_PER_REQUEST,
    MAX_TP,
    RATE_SEARCH_MAX_ARRIVALS,
)
from exporter.planner.model import (
    DTYPES,
    IDLE_POWER_SHARE,
    KV_DTYPES,
    PLAN_CPU_DEADLINE,
    PRIOR_EFFICIENCY,
    PRIOR_OVERHEAD_S,
    Calibration,
    Device,
    PlanError,
    Prediction,
    Setup,
    calibrate,
    client_cores,
    client_gap,
    cpu_device,
    fit_check,
    gpu_device,
    replay,
    verdict,
    workload_for,
)
from exporter.planner.observe import Observed, Point
from exporter.simulator.workload import Workload

SCHEMA_ID = "llm-exporter-plan/1"
MAX_CANDIDATES = 16
# The twin's workload takes a hit share below 1 (a request always prefills its last token); the observed
# share is capped the same way (observe.py).
MAX_PREFIX_HIT = 0.95
RATE_SEARCH_STEPS = 7
RATE_SEARCH_MAX_STEPS = 50_000  # per replay of the search: 14 replays per candidate at most


def _positive(kind: type, most: float) -> Callable[[str], Any]:
    """A positive number of `kind`, at most `most` (limits.py: each bound far above any real setting,
    so a typo is refused before a replay is sized by it)."""
    def parse(text: str) -> Any:
        value = kind(text)
        if not (0 < value <= most):  # NaN and the infinities too
            raise ValueError(f"must be positive and at most {most:g}")
        return value
    return parse


def _share(most: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not (0 <= value <= most):  # NaN too
            raise ValueError(f"a share from 0 to {most:g}")
        return value
    return parse


def _choice(table: Mapping[str, object]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        key = text.strip().lower()
        if key not in table:
            raise ValueError(f"one of {', '.join(table)}")
        return key
    return parse


# Declared once: `--candidate` parses these, `plan --help` and docs/planner.md list them.
CANDIDATE_KEYS: Mapping[str, tuple[Callable[[str], Any], str]] = {
    "name": (str, "label in the report"),
    "gpu": (str, "GPU from the spec table (h100-sxm, H200, L4...)"),
    "threads": (_positive(int, MAX_CPU_THREADS), "CPU threads of the engine (CPU deployments)"),
    "tp": (_positive(int, MAX_TP), "GPUs per replica (tensor parallel)"),
    "dtype": (_choice(DTYPES), "weight dtype: " + ", ".join(DTYPES)),
    "kv_dtype": (_choice(KV_DTYPES), "KV-cache dtype: " + ", ".join(KV_DTYPES)),
    "max_num_seqs": (_positive(int, MAX_NUM_SEQS), "running-sequence limit (vLLM --max-num-seqs, llama.cpp -np)"),
    "rate": (_positive(float, MAX_SCALE), "request rate multiplier (open loop)"),
    "concurrency": (_positive(int, MAX_CONCURRENCY), "requests in flight (closed loop), instead of the observed "
                                                      "level"),
    "prompt": (_positive(float, MAX_SCALE), "prompt length multiplier"),
    "output": (_positive(float, MAX_SCALE), "output length multiplier"),
    "prefix": (_share(MAX_PREFIX_HIT), "prefix-cache hit share of each prompt (0 to "
                                        f"{MAX_PREFIX_HIT:g}), instead of the observed one"),
    "price": (_positive(float, MAX_PRICE), "price of one GPU-hour"),
}


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    changes: Mapping[str, Any]


def parse_candidate(text: str, index: int) -> Candidate:
    changes: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in CANDIDATE_KEYS:
            raise PlanError(f"candidate {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                            f"{', '.join(CANDIDATE_KEYS)}")
        try:
            changes[key] = CANDIDATE_KEYS[key][0](value.strip())
        except ValueError as error:
            raise PlanError(f"candidate {text!r}: {key}={value}: {error}") from None
    if "gpu" in changes and "threads" in changes:
        raise PlanError(f"candidate {text!r}: gpu= and threads= name two devices")
    if "gpu" in changes:
        gpu_device(changes["gpu"])  # unknown GPU: the error now, not after calibrating
    name = str(changes.pop("name", "") or text or f"candidate {index + 1}")
    return Candidate(name, changes)


def free_cores(observed: Observed, level: float, override: float | None = None) -> float | None:
    """CPUs free for a CPU engine at `level`: given (--cpu-cores), or the load generator's machine less
    what the load generator used there when it ran beside the engine; None when unknown."""
    if override is not None:
        return override
    if observed.shared_host_cpus:
        return observed.shared_host_cpus - client_cores(observed.points, level)
    return None


def apply(base: Setup, cand: Candidate, cores: float | None = None) -> Setup:
    c = cand.changes
    device: Device = base.device
    if "gpu" in c:
        device = gpu_device(c["gpu"])
    elif "threads" in c or (cores is not None and base.device.kind == "cpu"):
        if base.device.kind != "cpu":
            raise PlanError(f"candidate {cand.name!r}: threads= is for CPU deployments; this one runs on "
                            f"{base.device.name}")
        device = cpu_device(c.get("threads", base.device.threads), cores)
    setup = dataclasses.replace(base, device=device, tp=c.get("tp", base.tp),
                                max_num_seqs=c.get("max_num_seqs", base.max_num_seqs),
                                price_per_gpu_hour=c.get("price", base.price_per_gpu_hour))
    return setup.with_dtype(c.get("dtype"), c.get("kv_dtype"))


def transfer(base: Setup, cal: Calibration, setup: Setup) -> Calibration:
    """The calibrated fractions of peak carry over to the same kind of device (same engine, same
    kernels); moving between a device the table does not know and a GPU, no observed fraction applies,
    so the twin's priors do. The host time per request stays: the API server does not change."""
    if setup.device.kind == base.device.kind:
        return cal
    return Calibration(PRIOR_EFFICIENCY["bw"], PRIOR_EFFICIENCY["compute"], PRIOR_EFFICIENCY["prefill"],
                       PRIOR_OVERHEAD_S[setup.device.kind], host_s=cal.host_s)  # the host stays the same


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


# The one replay mode of a plan, from how its primary point's traffic came: the current rows and every
# candidate replay the same way (a `concurrency=` candidate asks for a closed loop by name).
REPLAY_MODES = {
    "concurrency": "closed loop at the observed concurrency (rate=k: k times the clients)",
    "rate": "open loop: Poisson arrivals at the observed request rate (rate=k: k times the rate)",
}


def observed_dict(p: Point) -> dict[str, Any]:
    """What the source measured, each statistic as what it is: percentiles from the load test's own
    requests or the exporter's histogram buckets, means from the engine's _sum/_count."""
    return {"ttft_p50_s": _r(p.ttft.p50), "ttft_p99_s": _r(p.ttft.p99), "ttft_mean_s": _r(p.ttft.mean),
            "tpot_p50_s": _r(p.tpot.p50), "tpot_p99_s": _r(p.tpot.p99), "tpot_mean_s": _r(p.tpot.mean),
            "output_tokens_per_s": _r(p.output_tps, 3)}


def prediction_dict(pred: Prediction, tpot_mean_over: str = "tokens") -> dict[str, Any]:
    """The replay's figures; its TPOT mean weighted as the source's is (observe.Stat.mean_over)."""
    return {"ttft_p50_s": _r(pred.ttft_p50), "ttft_p99_s": _r(pred.ttft_p99), "tpot_p50_s": _r(pred.tpot_p50),
            "tpot_p99_s": _r(pred.tpot_p99), "ttft_mean_s": _r(pred.ttft_mean),
            "tpot_mean_s": _r(pred.centre("tpot", "mean", tpot_mean_over)),
            "queue_share": _r(pred.waiting_share, 4), "output_tokens_per_s": _r(pred.output_tps, 3),
            "requests_per_s": _r(pred.requests_per_s, 4), "goodput_share": _r(pred.goodput_share, 4),
            "device_busy": _r(pred.gpu_busy, 4), "kv_peak": _r(pred.kv_peak, 4), "preemptions": pred.preemptions,
            "verdict": verdict(pred), "replay_stopped": pred.stopped}


def _err(pred: float | None, obs: float | None) -> float | None:
    return None if pred is None or not obs else _r(pred / obs - 1.0, 4)


def max_rate(setup: Setup, cal: Calibration, point: Point, scales: Mapping[str, float], ttft_slo: float,
             tpot_slo: float, seed: int) -> float | None:
    """The highest Poisson rate whose replay keeps TTFT p99 and TPOT p99 within the SLOs: doubling,
    then bisection, RATE_SEARCH_STEPS replays each way at most."""
    base_rate = point.requests_per_s or point.level or 1.0

    def ok(rate: float) -> bool:
        work = workload_for(dataclasses.replace(point, mode="rate", requests_per_s=rate), prompt_scale=scales["prompt"],
                            output_scale=scales["output"])
        p = replay(setup, cal, point, workload=work, seed=seed, requests=300, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo,
                   max_steps=RATE_SEARCH_MAX_STEPS, max_arrivals=RATE_SEARCH_MAX_ARRIVALS)
        # Within the SLOs, and keeping up: a replay cut short while the queue still grows is not a pass.
        return (p.ttft_p99 is not None and p.tpot_p99 is not None and p.ttft_p99 <= ttft_slo
                and p.tpot_p99 <= tpot_slo and p.requests_per_s >= 0.9 * rate and p.stopped_by != "arrivals")
    lo, hi = 0.0, min(base_rate, MAX_RATE_RPS)
    for _ in range(RATE_SEARCH_STEPS):
        if not ok(hi):
            break
        if hi >= MAX_RATE_RPS:  # keeps up at the highest rate a replay may have
            return _r(hi, 4)
        lo, hi = hi, min(hi * 2, MAX_RATE_RPS)
    else:
        return _r(lo, 4)
    for _ in range(RATE_SEARCH_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return _r(lo, 4) if lo > 0 else None


def economics(setup: Setup, pred: Prediction) -> dict[str, Any]:
    gpus = setup.tp if setup.device.kind == "gpu" else 0
    cost = None
    if setup.price_per_gpu_hour and gpus and pred.output_tps > 0:
        cost = setup.price_per_gpu_hour * gpus / 3600.0 / pred.output_tps * 1e6
    energy = None
    if setup.device.tdp_w and gpus and pred.output_tps > 0:
        watts = setup.device.tdp_w * (IDLE_POWER_SHARE + (1 - IDLE_POWER_SHARE) * pred.gpu_busy) * gpus
        energy = watts / pred.output_tps
    return {"cost_per_million_tokens": _r(cost, 4), "energy_joules_per_token": _r(energy, 4)}


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A candidate checked before any replay: its setup, KV figures, scales and workload."""

    cand: Candidate
    setup: Setup
    capacity: int
    share: float
    scales: Mapping[str, float]
    work: Workload


def _prepare(observed: Observed, primary: Point, base: Setup, cand: Candidate,
             cpu_cores: float | None) -> _Prepared:
    """Everything about a candidate that can be refused is refused here, before calibration replays
    anything: an unknown device, weights that do not fit, and traffic past the replay's bounds
    (limits.py) once its multipliers meet the observed workload."""
    scales = {"rate": cand.changes.get("rate", 1.0), "prompt": cand.changes.get("prompt", 1.0),
              "output": cand.changes.get("output", 1.0)}
    level = cand.changes.get("concurrency")
    if level is None and primary.mode == "concurrency" and scales["rate"] != 1.0:
        # The plan's one replay mode is the closed loop its point ran (replay_mode): k times the
        # traffic is k times the clients, each keeping the observed turnaround; a Poisson replay of
        # the same rate would answer another question (and gave 2x traffic a third of the TTFT).
        level = max(1, round(primary.level * scales["rate"]))
        if level > MAX_CONCURRENCY:
            raise PlanError(f"candidate {cand.name!r}: rate={scales['rate']:g} times the observed {primary.level:g} "
                            f"clients is {level} requests in flight: at most {MAX_CONCURRENCY}")
    setup = apply(base, cand, free_cores(observed, level or primary.level, cpu_cores))
    capacity, share = fit_check(setup)
    work = workload_for(primary, rate_scale=scales["rate"], prompt_scale=scales["prompt"],
                        output_scale=scales["output"], concurrency=level,
                        prefix_hit_rate=cand.changes.get("prefix", observed.prefix_hit_rate),
                        think_s=None if level is None else client_gap(observed.points, level))
    checks = ((work.rate_rps if work.arrival == "poisson" else None, MAX_RATE_RPS, "rate", "requests/s",
               primary.requests_per_s or primary.level),
              (work.prompt.mean, MAX_TOKENS_PER_REQUEST, "prompt", "prompt tokens per request", primary.prompt_tokens),
              (work.output.mean, MAX_TOKENS_PER_REQUEST, "output", "output tokens per request", primary.output_tokens))
    for value, most, key, what, observed_value in checks:
        if value is not None and value > most:
            raise PlanError(f"candidate {cand.name!r}: {key}={scales[key]:g} times the observed {observed_value:.6g} "
                            f"is {value:.6g} {what}: at most {most:g}")
    return _Prepared(cand, setup, capacity, share, scales, work)


def plan(observed: Observed, base: Setup, candidates: Sequence[Candidate], *, ttft_slo: float, tpot_slo: float,
         seed: int = 0, search_rate: bool = True, cpu_cores: float | None = None,
         cpu_budget_s: float = MAX_PLAN_CPU_S) -> dict[str, Any]:
    """The whole plan as the JSON document (schema llm-exporter-plan/1), within `cpu_budget_s` of CPU
    (a PlanError past it)."""
    token = PLAN_CPU_DEADLINE.set((time.process_time() + cpu_budget_s, cpu_budget_s))
    try:
        return _plan(observed, base, candidates, ttft_slo=ttft_slo, tpot_slo=tpot_slo, seed=seed,
                     search_rate=search_rate, cpu_cores=cpu_cores)
    finally:
        PLAN_CPU_DEADLINE.reset(token)


def _plan(observed: Observed, base: Setup, candidates: Sequence[Candidate], *, ttft_slo: float, tpot_slo: float,
          seed: int, search_rate: bool, cpu_cores: float | None) -> dict[str, Any]:
    primary = observed.points[-1]
    if base.device.kind == "cpu":
        base = dataclasses.replace(base, device=cpu_device(base.device.threads,
                                                           free_cores(observed, primary.level, cpu_cores)))
    kv_capacity, weight_share = fit_check(base)
    if len(candidates) > MAX_CANDIDATES:
        raise PlanError(f"{len(candidates)} candidates: at most {MAX_CANDIDATES} in one plan")
    prepared = [_prepare(observed, primary, base, cand, cpu_cores) for cand in candidates]
    cal = calibrate(base, observed.points, seed=seed, prefix_hit_rate=observed.prefix_hit_rate)
    current = []
    for p in observed.points:
        pred = replay(base, cal, p, seed=seed, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo,
                      workload=workload_for(p, prefix_hit_rate=observed.prefix_hit_rate))
        current.append({"point": p.label, "mode": p.mode, "level": p.level, "replay": REPLAY_MODES[p.mode],
                        "observed": observed_dict(p),
                        "predicted": prediction_dict(pred, p.tpot.mean_over),
                        # Each error compares the statistic the source gave (Stat.kind: the engine's
                        # mean where it has one, else the median) with the same one predicted.
                        "compared": {"ttft": p.ttft.kind, "tpot": p.tpot.kind, "tpot_mean_over": p.tpot.mean_over},
                        "error": {"ttft": _err(pred.centre("ttft", p.ttft.kind), p.ttft.centre),
                                  "tpot": _err(pred.centre("tpot", p.tpot.kind, p.tpot.mean_over), p.tpot.centre),
                                  "ttft_p50": _err(pred.ttft_p50, p.ttft.p50),
                                  "tpot_p50": _err(pred.tpot_p50, p.tpot.p50),
                                  "output_tokens_per_s": _err(pred.output_tps, p.output_tps)}})
    rows = []
    for prep in prepared:
        cand, setup, capacity, share, scales = prep.cand, prep.setup, prep.capacity, prep.share, prep.scales
        ccal = transfer(base, cal, setup)
        pred = replay(setup, ccal, primary, workload=prep.work, seed=seed, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo)
        context = primary.prompt_tokens * scales["prompt"] + primary.output_tokens * scales["output"]
        rows.append({
            "name": cand.name, "changes": dict(cand.changes), "device": setup.device.name, "tp": setup.tp,
            "weight_bytes_per_element": _r(setup.model.dtype_bytes, 4), "max_num_seqs": setup.max_num_seqs,
            "calibration": "observed" if ccal is cal else "prior (another kind of device)",
            "predicted": prediction_dict(pred, primary.tpot.mean_over),
            "max_rate_within_slo_rps": max_rate(setup, ccal, primary, scales, ttft_slo, tpot_slo, seed)
            if search_rate else None,
            "kv": {"capacity_tokens": capacity, "weights_share_of_memory": _r(share, 4),
                   "sequences_at_mean_context": int(capacity // max(1.0, context)),
                   "headroom_vs_max_num_seqs": _r(capacity / max(1.0, context) / setup.max_num_seqs, 3)},
            **economics(setup, pred)})
    return {
        "schema": SCHEMA_ID,
        "source": observed.source,
        "observed": {"engine": observed.engine, "model": observed.model, "gpu": observed.gpu_name,
                     "prefix_hit_rate": _r(observed.prefix_hit_rate, 4), "notes": list(observed.notes),
                     "points": [{"label": p.label, "mode": p.mode, "level": p.level, "in_flight": _r(p.in_flight, 3),
                                 "prompt_tokens": _r(p.prompt_tokens, 1), "output_tokens": _r(p.output_tokens, 1),
                                 "requests_per_s": _r(p.requests_per_s, 4), "client_gap_s": _r(p.client_gap_s)}
                                for p in observed.points]},
        "base": {"device": base.device.name, "tp": base.tp, "model": base.model.name,
                 "weight_bytes_per_element": _r(base.model.dtype_bytes, 4),
                 "kv_bytes_per_element": _r(base.model.kv_dtype_bytes, 4), "max_num_seqs": base.max_num_seqs,
                 "kv_capacity_tokens": kv_capacity, "weights_share_of_memory": _r(weight_share, 4)},
        "slo": {"ttft_s": ttft_slo, "tpot_s": tpot_slo},
        "replay_mode": REPLAY_MODES[primary.mode],
        "calibration": cal.as_dict(),
        "current": current,
        "candidates": rows,
        "assumptions": list(ASSUMPTIONS),
    }


ASSUMPTIONS = (
    "Step time is the twin's roofline (exporter/physics/costs.py): max(bytes / bandwidth, FLOPs / peak) plus a "
    "per-step overhead; the fractions of peak are fitted to the observed points and kept for every candidate on "
    "the same kind of device.",
    "A dtype not observed keeps the observed fractions of peak: its kernels are assumed as efficient as the "
    "observed one's. On CPUs (llama.cpp) quantized kernels differ from F16 ones by more than this allows.",
    "Each observed decode batch has its own factor on the roofline (kernels change with the batch); past the "
    "batches observed, the roofline's shape extrapolates from the nearest one.",
    "With one dtype and one thread count observed, the split of a step into memory, compute and per-step "
    "overhead comes from the priors; a CPU engine's cores are its threads up to the cores free for it.",
    "Requests replay with the observed mean prompt and output lengths: lognormal with the spread an exporter's "
    "length histograms show, fixed where the source has none (a load test sends one prompt and one max_tokens).",
    "MoE routing is uniform; prefill/decode disaggregation, speculative decoding and the network between "
    "servers are not calibrated (the twin models them from priors).",
    "Energy is a TDP-based estimate (a third of TDP idle, TDP when busy); cost is the GPU-hour price only.",
)
