"""What the deployment did: operating points read from a running exporter or a load-test JSON.

An operating point is one steady load (a concurrency or a request rate) with the workload it carried
(prompt and output tokens per request) and what it got (TTFT and TPOT percentiles, output tokens/s).
The planner calibrates on these and nothing else: it never sees a candidate's measured answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from exporter import jsonsafe
from exporter.planner.limits import (
    MAX_CONCURRENCY,
    MAX_COUNT,
    MAX_CPUS,
    MAX_DURATION_S,
    MAX_LATENCY_S,
    MAX_RATE_RPS,
    MAX_TOKENS_PER_REQUEST,
    MAX_TOKENS_PER_S,
)
from exporter.reach import exporter_base_url, failure_words, http_status_words, why_unreachable

MAX_POINTS = 32  # a load test has at most 32 steps (loadtest.MAX_STEPS)
MAX_JSON_BYTES = 64 << 20
MAX_METRICS_BYTES = 32 << 20
MAX_DIAGNOSIS_BYTES = 8 << 20
MAX_WINDOW_S = 3600.0
SAMPLE_EVERY_S = 1.0
MAX_QUOTED = 120  # characters of a parser's complaint quoted in an error line (it may quote the page)


class ObserveError(ValueError):
    """The source cannot give an operating point; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class Stat:
    """A latency as the source reports it: median, tail, mean, and how many values it came from.
    `centre` is what the planner calibrates on and scores against: the mean where the source has one
    (an engine's histogram _sum/_count, a load test's server-side means: exact, where buckets of a
    few milliseconds are too coarse for a median), else the median; a prediction is compared with
    the same statistic (`kind`), never a mean with a median."""

    p50: float | None
    p99: float | None = None
    count: int = 0
    spread: float | None = None  # relative spread (p95/p50 - 1) for the confidence intervals
    mean: float | None = None
    # A TPOT mean's weighting: "requests" from a per-request TPOT histogram (each request's TPOT counts
    # once: vLLM's and SGLang's request_time_per_output_token), "tokens" from inter-token latencies or
    # decode seconds per token (each token counts once). Long requests decode at other batches than
    # short ones, so the two differ (by 9% on the twin): the prediction is taken the same way.
    mean_over: str = "tokens"

    @property
    def centre(self) -> float | None:
        return self.mean if self.mean is not None else self.p50

    @property
    def kind(self) -> str:
        """Which statistic `centre` is: mean or p50."""
        return "mean" if self.mean is not None else "p50"

    def rse(self) -> float:
        """Relative standard error of the median: 1.2533 sigma / (sqrt(n) median), sigma from the
        p50-p95 spread of a lognormal-ish latency; 0 when unknown."""
        if not self.count or self.spread is None:
            return 0.0
        return 1.2533 * (self.spread / 1.645) / math.sqrt(self.count)


@dataclass(frozen=True, slots=True)
class Point:
    label: str
    mode: str  # concurrency (closed loop) | rate (open loop)
    level: float  # requests in flight (concurrency) or requests/s (rate)
    in_flight: float  # mean requests in flight
    requests_per_s: float
    prompt_tokens: float  # mean per request
    output_tokens: float
    ttft: Stat
    tpot: Stat
    output_tps: float
    duration_s: float
    # Closed loop: the client's turnaround per request outside the engine (cycle time from the
    # throughput, less the engine's TTFT and decode time): the load generator's own think time.
    client_gap_s: float = 0.0
    client_cores: float = 0.0  # CPUs the load generator kept busy over the step
    # The lengths' log-space spread where the source has their histograms (an exporter's
    # llm_request_prompt_tokens / llm_request_generation_tokens): replayed as lognormal lengths of the
    # observed means. 0: fixed lengths (a load test sends one prompt and one max_tokens).
    prompt_sigma: float = 0.0
    output_sigma: float = 0.0


@dataclass(frozen=True, slots=True)
class Observed:
    source: str  # what was read (URL or file), for the report
    points: tuple[Point, ...]
    engine: str | None = None
    model: str | None = None
    gpu_name: str | None = None
    gpu_count: int = 0
    power_w: float | None = None  # mean board power over the window, all GPUs
    price_per_gpu_hour: float | None = None
    prefix_hit_rate: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The load generator's machine when it was the engine's own (a loopback target): its CPUs.
    shared_host_cpus: int | None = None


def _kind(value: Any) -> str:
    """What a JSON value is, in the words of an error line (never the value itself: it may be huge)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) > 1e300:  # f"{:g}" of a 400-digit int overflows a float
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, int | float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    kinds: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


class Reader:
    """Typed reads of one JSON document from another party (a load-test file, an exporter's
    diagnosis): a missing key or null is absent, anything else of the wrong shape or out of range is
    an ObserveError naming the source, the path and what was allowed, in one line (exit 2)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, what: str) -> ObserveError:
        return ObserveError(f"{self.source}: {path}: {what}")

    def obj(self, parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = parent.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected an object, got {_kind(value)}")
        return value

    def num(self, parent: Mapping[str, Any], key: str, path: str, lo: float, hi: float,
            unit: str = "") -> float | None:
        value = parent.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, f"expected a number, got {_kind(value)}")
        if not lo <= value <= hi:  # NaN and the infinities too; an int compares exactly, whatever its size
            raise self.fail(path, f"{_kind(value)} is out of range: {lo:g}..{hi:g}{unit}")
        return float(value)

    def text(self, parent: Mapping[str, Any], key: str, path: str) -> str | None:
        value = parent.get(key)
        if value is None or isinstance(value, str):
            return value
        raise self.fail(path, f"expected a string, got {_kind(value)}")

    def flag(self, parent: Mapping[str, Any], key: str, path: str) -> bool | None:
        value = parent.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise self.fail(path, f"expected true or false, got {_kind(value)}")


# --- a load test's JSON ------------------------------------------------------------------------------

def from_loadtest(doc: Mapping[str, Any], source: str) -> Observed:
    """One point per step that recorded requests (docs/loadtest.md, schema llm-exporter-loadtest/1).
    Every value the planner reads is checked for its shape and range first (Reader)."""
    schema = doc.get("schema") if isinstance(doc, Mapping) else None
    if not isinstance(schema, str) or not schema.startswith("llm-exporter-loadtest/"):
        raise ObserveError(f"{source}: not a load-test report (no schema llm-exporter-loadtest/1)")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ObserveError(f"{source}: the report has no steps")
    read = Reader(source)
    points = []
    for i, step in enumerate(steps[:MAX_POINTS]):
        point = _loadtest_point(read, step, f"steps[{i}]")
        if point is not None:
            points.append(point)
    if not points:
        raise ObserveError(f"{source}: no step recorded a request with its TTFT and TPOT")
    config = read.obj(doc, "config", "config")
    model, gpu = read.text(config, "model", "config.model"), read.text(config, "gpu", "config.gpu")
    client = read.obj(config, "client", "config.client")
    cpus = read.num(client, "cpus", "config.client.cpus", 1, MAX_CPUS)
    loopback = read.flag(client, "loopback_target", "config.client.loopback_target")
    shared = int(cpus) if cpus and loopback is True else None
    return Observed(source=source, points=tuple(points), model=model, gpu_name=gpu, gpu_count=1 if gpu else 0,
                    shared_host_cpus=shared)


def _loadtest_point(read: Reader, step: Any, at: str) -> Point | None:
    """One step as a point; None for a step that recorded no request with its TTFT and TPOT."""
    if not isinstance(step, Mapping):
        raise read.fail(at, f"expected an object, got {_kind(step)}")
    mode = read.text(step, "mode", f"{at}.mode") or "concurrency"
    if mode not in ("concurrency", "rate"):
        raise read.fail(f"{at}.mode", "expected concurrency or rate")
    if mode == "concurrency":
        level = read.num(step, "level", f"{at}.level", 1, MAX_CONCURRENCY, " requests in flight")
    else:
        level = read.num(step, "level", f"{at}.level", 0, MAX_RATE_RPS, " requests/s")
    ok = read.num(read.obj(step, "requests", f"{at}.requests"), "ok", f"{at}.requests.ok", 0, MAX_COUNT) or 0
    lat = read.obj(step, "latency_s", f"{at}.latency_s")
    ttft_stat = _stat(read, read.obj(lat, "ttft", f"{at}.latency_s.ttft"), f"{at}.latency_s.ttft")
    tpot_stat = _stat(read, read.obj(lat, "tpot", f"{at}.latency_s.tpot"), f"{at}.latency_s.tpot")
    thr = read.obj(step, "throughput", f"{at}.throughput")
    rps = read.num(thr, "requests_per_s", f"{at}.throughput.requests_per_s", 0, MAX_RATE_RPS) or 0.0
    input_tokens = read.num(thr, "input_tokens", f"{at}.throughput.input_tokens", 0, MAX_COUNT) or 0.0
    output_total = read.num(thr, "output_tokens", f"{at}.throughput.output_tokens", 0, MAX_COUNT) or 0.0
    output_tps = read.num(thr, "output_tokens_per_s", f"{at}.throughput.output_tokens_per_s", 0,
                          MAX_TOKENS_PER_S) or 0.0
    server = read.obj(step, "server", f"{at}.server")
    engine_ttft = read.num(server, "ttft_mean_s", f"{at}.server.ttft_mean_s", 0, MAX_LATENCY_S, " s")
    engine_itl = read.num(server, "itl_mean_s", f"{at}.server.itl_mean_s", 0, MAX_LATENCY_S, " s")
    mean_in_flight = read.num(read.obj(step, "in_flight", f"{at}.in_flight"), "mean", f"{at}.in_flight.mean", 0,
                              MAX_CONCURRENCY)
    elapsed = read.num(step, "elapsed_s", f"{at}.elapsed_s", 0, MAX_DURATION_S, " s") or 0.0
    cores = read.num(read.obj(step, "client", f"{at}.client"), "cpu_cores", f"{at}.client.cpu_cores", 0,
                     MAX_CPUS) or 0.0
    if ok < 1 or tpot_stat.p50 is None or ttft_stat.p50 is None:
        return None
    for name, total in (("input_tokens", input_tokens), ("output_tokens", output_total)):
        if total / ok > MAX_TOKENS_PER_REQUEST:
            raise read.fail(f"{at}.throughput.{name}", f"{total / ok:.6g} tokens per request (over requests.ok) "
                                                       f"is out of range: 0..{MAX_TOKENS_PER_REQUEST:g}")
    if engine_ttft and engine_itl:
        # The engine's own TTFT and inter-token means over the step (the exporter's histograms):
        # they time the engine's steps, which the client cannot when the API server coalesces a
        # stream's tokens into a few chunks (vLLM under load sends most of a short answer at once).
        # The calibration fits these means (Stat.centre); the load test's own percentiles stay
        # beside them, for the report.
        ttft_stat = dataclasses.replace(ttft_stat, mean=engine_ttft)
        tpot_stat = dataclasses.replace(tpot_stat, mean=engine_itl)
    level = level or 0.0
    output_tokens = output_total / ok
    gap = 0.0
    if mode == "concurrency" and output_tps > 0 and ttft_stat.centre and tpot_stat.centre:
        cycle = level * output_tokens / output_tps
        gap = max(0.0, cycle - ttft_stat.centre - max(0.0, output_tokens - 1) * tpot_stat.centre)
    return Point(label=f"{'c' if mode == 'concurrency' else 'r'}={level:g}", mode=mode, level=level,
                 in_flight=mean_in_flight or level, requests_per_s=rps, prompt_tokens=input_tokens / ok,
                 output_tokens=output_tokens, ttft=ttft_stat, tpot=tpot_stat, output_tps=output_tps,
                 duration_s=elapsed, client_gap_s=min(gap, 600.0), client_cores=min(4096.0, cores))


def _stat(read: Reader, d: Mapping[str, Any], at: str) -> Stat:
    p50, p95, p99 = (read.num(d, q, f"{at}.{q}", 0, MAX_LATENCY_S, " s") for q in ("p50", "p95", "p99"))
    count = read.num(d, "count", f"{at}.count", 0, MAX_COUNT)
    spread = (p95 / p50 - 1.0) if p50 and p95 is not None else None
    return Stat(p50, p99, int(count or 0), spread)


def read_loadtest(path: str) -> Observed:
    from exporter.safefile import read_regular_file

    try:  # regular files only (a FIFO would block), at most MAX_JSON_BYTES
        raw = read_regular_file(path, MAX_JSON_BYTES)
    except OSError as error:
        raise ObserveError(f"{path}: {error.strerror or error}") from None
    try:
        doc = jsonsafe.loads(raw)
    except (ValueError, jsonsafe.JsonTooDeep) as error:
        raise ObserveError(f"{path}: not JSON ({error})") from None
    return from_loadtest(doc, path)


# --- a running exporter ------------------------------------------------------------------------------

COUNTERS = ("llm_requests_finished_total", "llm_prompt_tokens_total", "llm_generation_tokens_total",
            "llm_prefill_seconds_total", "llm_decode_seconds_total", "llm_prefix_cache_hits_total",
            "llm_prefix_cache_queries_total")
HISTOGRAMS = {"ttft": "llm_time_to_first_token_seconds", "tpot": "llm_time_per_output_token_seconds",
              "itl": "llm_inter_token_latency_seconds"}
LENGTHS = {"prompt": "llm_request_prompt_tokens", "output": "llm_request_generation_tokens"}
GAUGES = ("llm_requests_running", "llm_requests_waiting", "llm_gpu_power_watts")
# A window whose requests in flight (running + waiting, sampled once a second) sit at their highest
# value in at least this share of the samples is a closed loop: clients that each send their next
# request when the last one ends (a load test) hold the count at their number, dipping only while a
# request is between the client and the engine. Independent arrivals reach their highest count about
# once (Poisson), a growing queue at the end. Replayed as Poisson arrivals, a closed loop's lockstep
# reads as other physics: the same run planned from a load test's JSON and from the exporter's window
# disagreed by 85% on the TTFT of the same question (tests/planner_twin.py).
CLOSED_LOOP_AT_TOP = 0.5
MIN_CLOSED_LOOP_SAMPLES = 5
# The widest log-space spread read from a length histogram: chat traffic is 0.5-1; past 1.5 the
# buckets (1-2-5 per decade) no longer tell a spread from a mixture.
MAX_LENGTH_SIGMA = 1.5
SIGMA_STEPS = 150  # the spread fitted to the buckets in steps of 0.01


@dataclass(slots=True)
class Scrape:
    """The families the planner reads, summed over the chosen target's series."""

    counters: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # family -> le -> cumulative
    sums: dict[str, float] = field(default_factory=dict)  # histogram family -> _sum (and family_count)
    gauges: dict[str, float] = field(default_factory=dict)
    gpus: int = 0


def parse_scrape(text: str, target: str | None) -> Scrape:
    from exporter.sources.engines.exposition import parse

    wanted = set(COUNTERS) | set(GAUGES) | {f"{h}_{part}" for h in (*HISTOGRAMS.values(), *LENGTHS.values())
                                            for part in ("bucket", "sum", "count")}
    out = Scrape()
    gpus: set[str] = set()
    for name, labels, value, _ in parse(text, keep=wanted.__contains__).samples:
        lab = dict(labels)
        if not math.isfinite(value):
            continue
        if name == "llm_gpu_power_watts":
            gpus.add(lab.get("gpu", ""))
            out.gauges[name] = out.gauges.get(name, 0.0) + value
        elif target is not None and lab.get("target") != target:
            continue
        elif name.endswith("_bucket"):
            try:
                le = float(lab.get("le", "nan").replace("+Inf", "inf"))
            except ValueError:
                continue
            fam = out.buckets.setdefault(name[: -len("_bucket")], {})
            fam[le] = fam.get(le, 0.0) + value
        elif name in COUNTERS:
            out.counters[name] = out.counters.get(name, 0.0) + value
        elif name.endswith(("_sum", "_count")):
            out.sums[name] = out.sums.get(name, 0.0) + value
        else:
            out.gauges[name] = out.gauges.get(name, 0.0) + value
    out.gpus = len(gpus)
    return out


def _delta_quantile(q: float, before: Mapping[float, float], after: Mapping[float, float]) -> tuple[float | None, int]:
    from exporter.derive.quantiles import histogram_quantile

    bounds = sorted(after)
    cumulative = [max(0.0, after[b] - before.get(b, 0.0)) for b in bounds]
    count = int(cumulative[-1]) if cumulative else 0
    if count == 0:
        return None, 0
    return histogram_quantile(q, bounds, cumulative), count


def point_from_scrapes(first: Scrape, last: Scrape, running: Sequence[float], window_s: float,
                       label: str, output_tokens: float | None = None,
                       waiting: Sequence[float] = ()) -> tuple[Point, float]:
    """The window between two scrapes as one open-loop point, and its prefix-cache hit share.
    `output_tokens` per request, when given, counts requests for an engine that counts none (llama.cpp)."""
    def inc(name: str) -> float:
        return max(0.0, last.counters.get(name, 0.0) - first.counters.get(name, 0.0))

    gen = inc("llm_generation_tokens_total")
    done = inc("llm_requests_finished_total")
    if "llm_requests_finished_total" not in last.counters and output_tokens:
        done = gen / output_tokens
    if done < 1:
        why = ("the engine counts no finished requests (llama.cpp): give --output-tokens N, the tokens its "
               "requests generate" if "llm_requests_finished_total" not in last.counters and not output_tokens
               else "no request finished in the window: nothing to calibrate on (send traffic or widen --window)")
        raise ObserveError(why)
    stats: dict[str, Stat] = {}
    for key, fam in HISTOGRAMS.items():
        if fam in last.buckets:
            p50, n = _delta_quantile(0.5, first.buckets.get(fam, {}), last.buckets[fam])
            p95, _ = _delta_quantile(0.95, first.buckets.get(fam, {}), last.buckets[fam])
            p99, _ = _delta_quantile(0.99, first.buckets.get(fam, {}), last.buckets[fam])
            total = last.sums.get(f"{fam}_sum", 0.0) - first.sums.get(f"{fam}_sum", 0.0)
            count = last.sums.get(f"{fam}_count", 0.0) - first.sums.get(f"{fam}_count", 0.0)
            # The window's mean where the histogram has _sum and _count is what the planner fits
            # (Stat.centre): engines' buckets are too coarse for a median of a few milliseconds (vLLM's
            # ITL buckets start at 10 ms, so any p50 below reads 5 ms). The buckets' p50 and p99 are
            # reported beside it as what they are.
            mean = total / count if count >= 1 and total > 0 else None
            if mean is not None or p50 is not None:
                stats[key] = Stat(p50, p99, n, (p95 / p50 - 1.0) if p95 and p50 else None, mean,
                                  mean_over="requests" if key == "tpot" else "tokens")
    sigmas = {key: _length_sigma(first, last, fam) for key, fam in LENGTHS.items()}
    tpot = stats.get("tpot") or stats.get("itl")
    if tpot is None and gen > done and inc("llm_decode_seconds_total") > 0:
        # llama.cpp: no latency histograms, but decode seconds summed over slots per generated token.
        tpot = Stat(None, None, int(gen), mean=inc("llm_decode_seconds_total") / max(1.0, gen - done))
    ttft = stats.get("ttft")
    if ttft is None and inc("llm_prefill_seconds_total") > 0:
        ttft = Stat(None, None, int(done), mean=inc("llm_prefill_seconds_total") / done)
    # (A Stat with neither a mean nor a median has no centre: no latency either.)
    if tpot is None or ttft is None or tpot.centre is None or ttft.centre is None:
        raise ObserveError("the exporter has no TTFT or TPOT for this target (no latency histograms and no "
                           "prefill/decode seconds): calibrate from a load test (--from loadtest.json)")
    queries = inc("llm_prefix_cache_queries_total")
    hit = inc("llm_prefix_cache_hits_total") / queries if queries else 0.0
    _check_window(done, window_s, gen, inc("llm_prompt_tokens_total"), ttft, tpot)
    gauge = sum(running) / len(running) if running else 0.0
    # Little's law over the whole window (requests/s x time each spends in the engine) against the
    # gauge sampled once a second, which misses requests that start and end between samples.
    little = done / window_s * (ttft.centre + max(0.0, gen / done - 1.0) * tpot.centre)
    in_flight = max(gauge, little)
    if not 0.0 <= in_flight <= MAX_CONCURRENCY:  # NaN too: the replay's level comes from this
        raise ObserveError(f"{in_flight:.6g} requests in flight over the window (llm_requests_running sampled "
                           f"{gauge:.6g}, Little's law {little:.6g}) is out of range: 0..{MAX_CONCURRENCY}")
    # Replayed as an open loop: Poisson arrivals at the window's rate. A deployment's traffic comes
    # from clients that do not wait for each other; a closed loop of fixed lengths at the window's mean
    # in flight runs in lockstep (every request arrives in the same step, and each TTFT waits behind
    # all the prompts: +455% on the demo's decode-heavy window). The candidates scale this rate.
    # Engines count a request's prompt tokens once its prefill is done (its first token), and its
    # finish at its last: prompt tokens per first token is the prompt of the requests the window
    # admitted. Per finished request it read 19,600 tokens where kv-pressure draws 10,000: while a
    # queue builds, more prefills end than requests do.
    first_tokens = (last.sums.get(f"{HISTOGRAMS['ttft']}_count", 0.0)
                    - first.sums.get(f"{HISTOGRAMS['ttft']}_count", 0.0))
    prompt = inc("llm_prompt_tokens_total") / (first_tokens if first_tokens >= 1 else done)
    point = Point(label=label, mode="rate", level=done / window_s, in_flight=in_flight,
                  requests_per_s=done / window_s, prompt_tokens=prompt,
                  output_tokens=gen / done, ttft=ttft, tpot=tpot, output_tps=gen / window_s, duration_s=window_s,
                  prompt_sigma=sigmas["prompt"], output_sigma=sigmas["output"])
    level = closed_loop_level(running, waiting)
    if level is not None:
        # Each client's turnaround outside the engine, as for a load test's step (_loadtest_point).
        cycle = level * point.output_tokens / point.output_tps if point.output_tps > 0 else 0.0
        gap = max(0.0, cycle - ttft.centre - max(0.0, point.output_tokens - 1) * tpot.centre)
        point = dataclasses.replace(point, mode="concurrency", level=float(level), in_flight=float(level),
                                    label=f"{label} (closed loop: {level} in flight)", client_gap_s=min(gap, 600.0))
    return point, min(0.95, max(0.0, hit))


# A queue that grew over the window by more than this share of the requests it finished is one the
# device does not keep up with: its TTFTs grow for as long as the overload lasts.
QUEUE_GROWTH_SHARE = 0.2


def queue_growth(first: Scrape, last: Scrape, window_s: float) -> str | None:
    """What the plan must say of a window whose queue grew (requests in flight at its end over its
    start, against those it finished); None where the queue held or there is no waiting gauge. A
    steady replay serves the window's finished rate, which is the device's capacity, not the offered
    load: it cannot give the TTFT of a queue still growing, and the current row's error says nothing
    about the model (the demo's kv-pressure: 2 requests/s offered, 0.35 finished)."""
    if "llm_requests_waiting" not in first.gauges or "llm_requests_waiting" not in last.gauges:
        return None
    def held(s: Scrape) -> float:
        return s.gauges.get("llm_requests_running", 0.0) + s.gauges["llm_requests_waiting"]
    done = max(0.0, last.counters.get("llm_requests_finished_total", 0.0)
               - first.counters.get("llm_requests_finished_total", 0.0))
    grew = held(last) - held(first)
    if grew <= max(1.0, QUEUE_GROWTH_SHARE * done) or last.gauges["llm_requests_waiting"] < 1:
        return None
    offered = (done + grew) / window_s
    finished = done / window_s
    ratio = f"{offered / finished:.2g} times" if finished > 0 else "more than"
    return (f"the queue grew by {grew:g} requests in the {window_s:.0f} s window: about {offered:.3g} requests/s "
            f"arrived and {finished:.3g}/s finished, so the offered load is {ratio} what the device serves. "
            "Its TTFT grows for as long as that lasts; a steady replay at the finished rate (the device's "
            "capacity) cannot give it, so read the current row's TTFT error as no test of the model. A "
            "candidate keeps up where it serves the offered rate")


def closed_loop_level(running: Sequence[float], waiting: Sequence[float] = ()) -> int | None:
    """The clients of a closed loop, where the requests in flight over the window say it is one
    (CLOSED_LOOP_AT_TOP); None for independent arrivals, and without the waiting gauge: a slot
    pool that open-loop traffic keeps full holds its running count as still as a closed loop does."""
    if not waiting or len(waiting) != len(running):
        return None
    counts = [r + w for r, w in zip(running, waiting, strict=True)]
    if len(counts) < MIN_CLOSED_LOOP_SAMPLES:
        return None
    top = max(counts)
    if top < 2 or sum(1 for c in counts if c == top) < CLOSED_LOOP_AT_TOP * len(counts):
        return None
    return round(top)


def _length_sigma(first: Scrape, last: Scrape, fam: str) -> float:
    """The log-space spread of the window's lengths from their histogram: the lognormal of the window's
    mean (`_sum` / `_count`) whose CDF is nearest the buckets' cumulative shares. 0 (fixed lengths)
    without the histogram or enough requests. A real spread lengthens the TTFT's tail and mean (a long
    prompt holds the prefills behind it). Mean over the interpolated median read 0.23, or nothing
    (a median past the mean), where the demo draws 0.4: engines' 1-2-5 buckets (5000, 10000) put
    most prompts of 6000 in one bucket, and a linear interpolation inside it is not a lognormal's."""
    if fam not in last.buckets:
        return 0.0
    before, after = first.buckets.get(fam, {}), last.buckets[fam]
    bounds = sorted(after)
    cumulative = [max(0.0, after[b] - before.get(b, 0.0)) for b in bounds]
    n = cumulative[-1] if cumulative else 0.0
    total = last.sums.get(f"{fam}_sum", 0.0) - first.sums.get(f"{fam}_sum", 0.0)
    if n < 10 or total <= 0:
        return 0.0
    mean = total / n
    shares = [(b, c / n) for b, c in zip(bounds, cumulative, strict=True) if 0 < b < math.inf]
    if not any(0.0 < share < 1.0 for _, share in shares):
        return 0.0  # every length in one bucket: no spread the buckets can tell

    def misfit(sigma: float) -> float:
        mu = math.log(mean) - sigma * sigma / 2
        return sum((share - _normal_cdf((math.log(b) - mu) / sigma)) ** 2 for b, share in shares)

    grid = [MAX_LENGTH_SIGMA * i / SIGMA_STEPS for i in range(1, SIGMA_STEPS + 1)]
    return min(grid, key=misfit)


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def _check_window(done: float, window_s: float, gen: float, prompt: float, ttft: Stat, tpot: Stat) -> None:
    """The window's rates, lengths and latencies within the planner's bounds (limits.py), each
    refused in one line that names the family it came from: the replay is sized by them."""
    checks = ((done / window_s, MAX_RATE_RPS, "requests/s finished (llm_requests_finished_total)"),
              (prompt / done, MAX_TOKENS_PER_REQUEST, "prompt tokens per request (llm_prompt_tokens_total)"),
              (gen / done, MAX_TOKENS_PER_REQUEST, "tokens generated per request (llm_generation_tokens_total)"),
              (ttft.centre, MAX_LATENCY_S, "s TTFT"), (tpot.centre, MAX_LATENCY_S, "s TPOT"))
    for value, hi, what in checks:
        if value is None or not 0.0 <= value <= hi:
            raise ObserveError(f"{value if value is not None else float('nan'):.6g} {what} over the window is "
                               f"out of range: 0..{hi:g}")


async def _failure(base: str, path: str, error: Any) -> str:
    """One line for a failed GET of base + path (a SourceError): a status as its code and phrase,
    never the body that came with it (a web server's 404 page); a server that accepts no connection
    as `cannot reach BASE: why` (docs/cli.md)."""
    from exporter.redact import redact_url

    shown = redact_url(base + path)
    if error.status is not None:
        hint = " (is it an llm-exporter?)" if error.status == 404 else ""
        return f"{shown} answered {http_status_words(error.status)}{hint}"
    if error.reason in ("connection", "dns", "timeout"):
        why = await asyncio.to_thread(why_unreachable, base)
        if why is not None:
            return f"cannot reach {redact_url(base)}: {why}"
    return f"cannot reach {shown}: {failure_words(error.reason, error.message)}"


class TargetInfo(NamedTuple):
    engine: str | None
    model: str | None
    gpu_name: str | None
    gpu_count: int


def _diagnosis_target(read: Reader, diagnosis: Any, wanted: str | None) -> tuple[str | None, TargetInfo]:
    """The target to observe (loadtest.pick_target's rule: --target, else the busiest) and what the
    diagnosis says of it, every value read through `read`: an answer of the wrong shape at any depth
    is one line naming the path, never a traceback."""
    from exporter.catalog.base import MAX_VALUE
    from exporter.probe.loadtest_watch import pick_target

    none = TargetInfo(None, None, None, 0)
    if not isinstance(diagnosis, Mapping):
        raise read.fail("the document", f"expected an object, got {_kind(diagnosis)}")
    targets = read.obj(diagnosis, "targets", "targets")
    # pick_target reads targets.NAME.numbers.running: give it only checked values.
    view: dict[str, Any] = {}
    for name, entry in targets.items():
        at = f"targets[{json.dumps(name)[:80]}]"
        entry = {} if entry is None else entry
        if not isinstance(entry, Mapping):
            raise read.fail(at, f"expected an object, got {_kind(entry)}")
        running = read.num(read.obj(entry, "numbers", f"{at}.numbers"), "running", f"{at}.numbers.running", 0,
                           MAX_VALUE)  # an exporter's own domain for every engine value
        view[name] = {"numbers": {"running": running}}
    chosen = pick_target({"targets": view}, wanted)
    if chosen is None:
        return None, none
    entry = targets[chosen] or {}
    at = f"targets[{json.dumps(chosen)[:80]}]"
    gpus = entry.get("gpus")
    if gpus is not None and not isinstance(gpus, list):
        raise read.fail(f"{at}.gpus", f"expected a list, got {_kind(gpus)}")
    gpus = gpus or []
    first = gpus[0] if gpus else None
    if first is not None and not isinstance(first, Mapping):
        raise read.fail(f"{at}.gpus[0]", f"expected an object, got {_kind(first)}")
    gpu_name = read.text(first, "name", f"{at}.gpus[0].name") if first else None
    return chosen, TargetInfo(read.text(entry, "engine", f"{at}.engine"), read.text(entry, "model", f"{at}.model"),
                              gpu_name, len(gpus))


async def observe_exporter(base_url: str, window_s: float, *, target: str | None = None,
                           output_tokens: float | None = None,
                           clock: Callable[[], float] = time.monotonic) -> Observed:
    """Scrape the exporter's /metrics at the start and end of `window_s` (and its running gauge about
    once a second between), read /api/v1/diagnosis for the target, model and GPUs. Only these two
    URLs are fetched, each bounded in time and bytes (the engine scrapes' HTTP client)."""
    from exporter.httpclient import HttpClient
    from exporter.sources.base import SourceError

    if not 1.0 <= window_s <= MAX_WINDOW_S:
        raise ObserveError(f"--window must be between 1s and {MAX_WINDOW_S:g}s")
    base = exporter_base_url(base_url)  # http://HOST:9480/metrics is taken as http://HOST:9480
    diag_client = HttpClient(base + "/api/v1/diagnosis", timeout_s=5.0)
    metrics_client = HttpClient(base + "/metrics", timeout_s=5.0, headers={"Accept": "text/plain"})
    try:
        try:
            diagnosis = jsonsafe.loads(await diag_client.get(max_body=MAX_DIAGNOSIS_BYTES))
        except SourceError as error:
            raise ObserveError(await _failure(base, "/api/v1/diagnosis", error)) from None
        except (ValueError, jsonsafe.JsonTooDeep):
            raise ObserveError(f"{base}/api/v1/diagnosis is not JSON: is this an llm-exporter?") from None
        chosen, about = _diagnosis_target(Reader(f"{base}/api/v1/diagnosis"), diagnosis, target)
        if chosen is None:
            raise ObserveError(f"{base}: no engine target{f' named {target!r}' if target else ''} in its diagnosis")

        async def scrape() -> Scrape:
            try:
                body = await metrics_client.get(max_body=MAX_METRICS_BYTES)
            except SourceError as error:
                raise ObserveError(await _failure(base, "/metrics", error)) from None
            try:
                return parse_scrape(body.decode("utf-8", "replace"), chosen)
            except ValueError as error:  # ExpositionError: an HTML page, JSON, garbage
                raise ObserveError(f"{base}/metrics is not a Prometheus exposition ({str(error)[:MAX_QUOTED]}): "
                                   "is this an llm-exporter?") from None

        first = await scrape()
        start = clock()
        running: list[float] = []
        waiting: list[float] = []
        powers: list[float] = []
        last = first
        while clock() - start < window_s:
            await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, window_s - (clock() - start))))
            last = await scrape()
            running.append(last.gauges.get("llm_requests_running", 0.0))
            if "llm_requests_waiting" in last.gauges:
                waiting.append(last.gauges["llm_requests_waiting"])
            if "llm_gpu_power_watts" in last.gauges:
                powers.append(last.gauges["llm_gpu_power_watts"])
    finally:
        await diag_client.aclose()
        await metrics_client.aclose()
    window = clock() - start
    point, hit = point_from_scrapes(first, last, running, window, f"window {window_s:g}s", output_tokens, waiting)
    growth = queue_growth(first, last, window)
    return Observed(source=base, points=(point,), engine=about.engine, model=about.model, gpu_name=about.gpu_name,
                    gpu_count=about.gpu_count or last.gpus,
                    power_w=sum(powers) / len(powers) if powers else None,
                    prefix_hit_rate=hit, notes=(growth,) if growth else ())
