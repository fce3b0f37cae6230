"""`llm-exporter loadtest`: the source documents' load-test procedure, with the exporter's verdict attached.

A sweep of steps, each at one level: closed loop (`--concurrency 1,8,32`: that many requests always
in flight) or open loop (`--rate 1,5,10`: Poisson arrivals at that many requests/s). Each step runs
a warm-up (requests sent, not recorded) and then a measured window; the client measures TTFT, TPOT,
ITL, end-to-end latency, token and request throughput and goodput, while a poller reads the
exporter's /api/v1/diagnosis and /metrics about once a second for the KV usage watermark,
preemptions, the waiting queue and the verdict. After the sweep: the knee (the first step where a
latency tail crosses its SLO, or throughput stops rising while latency rises) and a max-concurrency
recommendation from the 80% KV watermark and from the knee. docs/loadtest.md has the JSON schema
and the rules.

Everything is bounded: per-request timeout, in-flight requests (the step's concurrency, or
`--max-in-flight` for a rate), step and total duration, the requests and token gaps kept per step
(a fixed-size reservoir; counts and sums stay exact), and every exporter poll (time and bytes).
Only the URLs given are contacted. The request itself is an abstract `Send` callable, so the sweep
runs against anything that returns a `CompletionTiming`-like outcome (tests use a fake).
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from exporter import jsonsafe
from exporter.jsonsafe import JsonTooDeep
from exporter.slo import TBT, TTFT

# --- bounds -------------------------------------------------------------------------------------

MAX_STEPS = 32
MAX_CONCURRENCY = 2048
MAX_RATE = 10_000.0  # requests/s
MAX_STEP_DURATION_S = 600.0
MAX_WARMUP_S = 300.0
MAX_TOTAL_S = 4 * 3600.0  # warm-up plus duration over all steps; the drain after each is extra
DEFAULT_MAX_IN_FLIGHT = 256  # open loop: arrivals past this many in flight are dropped (counted)
# Percentiles come from a uniform reservoir of this many requests (and token gaps) per step; above it
# they are estimates with a relative rank error of about 1/sqrt(size). Counts, tokens and goodput
# are exact counters whatever the step's size.
MAX_RECORDED_REQUESTS = 20_000
MAX_RECORDED_GAPS = 200_000
MAX_DATASET_BYTES = 64 << 20
MAX_DATASET_LINES = 100_000
MAX_PROMPT_CHARS = 1 << 20
MAX_TOKENS_LIMIT = 1 << 17
MAX_PROMPT_WORDS = 1 << 17
POLL_INTERVAL_S = 1.0
POLL_TIMEOUT_S = 2.0
MAX_DIAGNOSIS_BYTES = 8 << 20  # as `doctor`
MAX_METRICS_BYTES = 32 << 20
MAX_EVIDENCE_LINES = 12
MAX_EVIDENCE_CHARS = 400  # one evidence line is a sentence; a longer one is cut (the report keeps each)
MAX_VERDICT_CHARS = 64  # verdict names are identifiers (kv_capacity); a longer "verdict" is no verdict
MAX_SERVER_VALUE = 1e18  # the exporter's own domain for counts (catalog.base.MAX_VALUE): past it, garbage
KV_WATERMARK = 0.8  # size concurrency so the KV cache peaks below 80%: room for longer contexts
PLATEAU_GAIN = 0.10  # throughput that rises by less than this from one step to the next has stopped
LATENCY_RISE = 0.10  # ... while a latency median rose by more than this
FAILED_SHARE_KNEE = 0.10  # a step that fails this share of its requests is past the knee
SCHEMA_ID = "llm-exporter-loadtest/1"
# A server that accepts no connection: after this many requests in a row that never reached it
# (connection refused, no route, DNS, no connection in time, TLS refused), with a backoff between
# them doubling from BACKOFF_FIRST_S, the sweep stops and says why (exit 2, docs/cli.md).
UNREACHABLE_AFTER = 5
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0
CONNECT_TIMEOUT_S = 10.0  # a connection that takes longer is a server that is not there
NO_CONNECTION_REASONS = frozenset({"connection", "dns", "timeout", "tls"})
NO_SUCCESS = "no successful request: no knee"


class Outcome(Protocol):
    """What one request returns (exporter/probe/client.py's CompletionTiming has these fields).
    Read-only properties: the outcomes are frozen (a NamedTuple, a frozen dataclass)."""

    @property
    def ok(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def status(self) -> int | None: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def itl_s(self) -> Sequence[float]: ...
    @property
    def e2e_s(self) -> float | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: the prompt and exactly how many tokens to generate."""

    prompt: str
    max_tokens: int


Send = Callable[[RequestSpec], Awaitable[Outcome]]


@dataclass(frozen=True, slots=True)
class Failed:
    """An outcome for a request that raised instead of returning (a bug or a cancelled send)."""

    reason: str
    ok: bool = False
    status: int | None = None
    ttft_s: float | None = None
    itl_s: Sequence[float] = ()
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


# --- pure measures ------------------------------------------------------------------------------

def usable_cpus() -> int | None:
    """CPUs this process may run on (its affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def is_loopback(url: str) -> bool:
    """Whether `url` names this machine: the load generator then shares the engine's CPUs."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) with linear interpolation between closest ranks (numpy's default,
    what vllm bench serve reports); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class Percentiles(NamedTuple):
    count: int  # type: ignore[assignment]  # hides tuple.count, which is never called
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": _r(self.mean), "p50": _r(self.p50), "p95": _r(self.p95),
                "p99": _r(self.p99)}


def summarize(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles(0, None, None, None, None)
    ordered = sorted(values)
    return Percentiles(len(ordered), sum(ordered) / len(ordered), percentile(ordered, 0.5),
                       percentile(ordered, 0.95), percentile(ordered, 0.99))


def tpot(ttft_s: float | None, e2e_s: float | None, completion_tokens: int | None) -> float | None:
    """Time per output token after the first: (e2e - ttft) / (tokens - 1); None with under 2 tokens."""
    if ttft_s is None or e2e_s is None or completion_tokens is None or completion_tokens < 2:
        return None
    return max(0.0, e2e_s - ttft_s) / (completion_tokens - 1)


def meets_slo(ttft_s: float | None, tpot_s: float | None, ttft_slo_s: float, tbt_slo_s: float) -> bool:
    """Goodput's test for one request, as vllm bench serve's --goodput: TTFT within its SLO and the
    mean gap after the first token (TPOT) within the TBT SLO. A one-token answer has no TPOT and is
    judged on TTFT alone."""
    if ttft_s is None or ttft_s > ttft_slo_s:
        return False
    return tpot_s is None or tpot_s <= tbt_slo_s


class Reservoir:
    """A uniform sample of at most `size` values (Vitter's algorithm R), seeded for repeatable runs."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size = size
        self.seen = 0
        self.values: list[float] = []
        self._rng = rng

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.size:
            self.values[slot] = value


# --- one step's client-side accounting -----------------------------------------------------------

class InFlight:
    """Requests in flight, with the max and the time-weighted mean inside the measured window."""

    def __init__(self, window_start: float, window_end: float) -> None:
        self.now = 0
        self.max = 0
        self.window = (window_start, window_end)
        self._area = 0.0
        self._since = window_start

    def _accumulate(self, t: float) -> None:
        start, end = self.window
        lo, hi = max(self._since, start), min(t, end)
        if hi > lo:
            self._area += self.now * (hi - lo)
        self._since = max(self._since, t)

    def change(self, t: float, delta: int) -> None:
        self._accumulate(t)
        self.now += delta
        if self.window[0] <= t <= self.window[1]:
            self.max = max(self.max, self.now)

    def mean(self) -> float:
        self._accumulate(self.window[1])
        span = self.window[1] - self.window[0]
        return self._area / span if span > 0 else 0.0


@dataclass(slots=True)
class StepStats:
    """Counters (exact) and reservoirs (bounded) of the requests started in one step's window."""

    ttft_slo_s: float
    tbt_slo_s: float
    rng: random.Random
    ok: int = 0
    good: int = 0
    dropped: int = 0
    failed: collections.Counter = field(default_factory=collections.Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    last_end: float = 0.0
    # Throughput is counted inside the measured window only, from every request's token times
    # (warm-up and drain requests included): the steady state, not diluted by a drain.
    window_output: float = 0.0
    window_input: float = 0.0
    window_done: int = 0
    window_good: int = 0
    requests_cap: int = MAX_RECORDED_REQUESTS
    gaps_cap: int = MAX_RECORDED_GAPS
    ttft: Reservoir = field(init=False)
    tpot: Reservoir = field(init=False)
    e2e: Reservoir = field(init=False)
    itl: Reservoir = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = Reservoir(self.requests_cap, self.rng)
        self.tpot = Reservoir(self.requests_cap, self.rng)
        self.e2e = Reservoir(self.requests_cap, self.rng)
        self.itl = Reservoir(self.gaps_cap, self.rng)

    def record_window(self, outcome: Outcome, sent: float, ended: float, start: float, end: float) -> None:
        """The part of any request's work that fell inside [start, end): its tokens by arrival time
        (prompt tokens when its first token came, the prefill being done), its completion."""
        if not outcome.ok or outcome.ttft_s is None:
            return
        arrival = sent + outcome.ttft_s
        chunks = 1 + len(outcome.itl_s)
        # A chunk may carry several tokens (usage says how many): each chunk weighs tokens/chunks.
        weight = (outcome.completion_tokens or chunks) / chunks
        inside = start <= arrival < end
        if inside:
            self.window_input += outcome.prompt_tokens or 0
        count = int(inside)
        for gap in outcome.itl_s:
            arrival += gap
            count += start <= arrival < end
        self.window_output += count * weight
        if start <= ended < end:
            self.window_done += 1
            per_token = tpot(outcome.ttft_s, outcome.e2e_s, outcome.completion_tokens)
            self.window_good += meets_slo(outcome.ttft_s, per_token, self.ttft_slo_s, self.tbt_slo_s)

    def record(self, outcome: Outcome, ended: float) -> None:
        self.last_end = max(self.last_end, ended)
        if not outcome.ok:
            self.failed[outcome.reason or "error"] += 1
            return
        self.ok += 1
        self.input_tokens += outcome.prompt_tokens or 0
        self.output_tokens += outcome.completion_tokens or 0
        per_token = tpot(outcome.ttft_s, outcome.e2e_s, outcome.completion_tokens)
        if outcome.ttft_s is not None:
            self.ttft.add(outcome.ttft_s)
        if per_token is not None:
            self.tpot.add(per_token)
        if outcome.e2e_s is not None:
            self.e2e.add(outcome.e2e_s)
        for gap in outcome.itl_s:
            self.itl.add(gap)
        if meets_slo(outcome.ttft_s, per_token, self.ttft_slo_s, self.tbt_slo_s):
            self.good += 1


# --- what the exporter said during a step --------------------------------------------------------

class Poll(NamedTuple):
    """One reading of the exporter: None where it did not say."""

    t: float
    verdict: str | None
    evidence: tuple[str, ...]
    kv_usage: float | None
    waiting: float | None
    running: float | None
    preemptions_total: float | None
    ttft_sum: float | None
    ttft_count: float | None
    itl_sum: float | None
    itl_count: float | None


def _counter_increase(values: Sequence[float | None]) -> float | None:
    """Increase of a counter over readings, a drop read as a restart (the new value is all new)."""
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return None
    total = 0.0
    for before, after in zip(known, known[1:], strict=False):
        total += after - before if after >= before else after
    return total


def _mean_and_max(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    known = [v for v in values if v is not None]
    return (sum(known) / len(known), max(known)) if known else (None, None)


def server_summary(polls: Sequence[Poll], errors: int, target: str | None, error: str | None) -> dict[str, Any]:
    """The exporter's view of one step: watermarks, means, counter increases and verdicts."""
    verdicts = collections.Counter(p.verdict for p in polls if p.verdict)
    # Most frequent over the step; a tie goes to the later one (closer to the step's steady state).
    mode = None
    if verdicts:
        order = {v: i for i, p in enumerate(polls) for v in (p.verdict,) if v}
        mode = max(verdicts, key=lambda v: (verdicts[v], order[v]))
    last = next((p for p in reversed(polls) if p.verdict), None)
    waiting_mean, waiting_max = _mean_and_max([p.waiting for p in polls])
    running_mean, running_max = _mean_and_max([p.running for p in polls])
    kv = [p.kv_usage for p in polls if p.kv_usage is not None]
    ttft_n = _counter_increase([p.ttft_count for p in polls])
    ttft_s = _counter_increase([p.ttft_sum for p in polls])
    itl_n = _counter_increase([p.itl_count for p in polls])
    itl_s = _counter_increase([p.itl_sum for p in polls])
    preempt = _counter_increase([p.preemptions_total for p in polls])
    return {
        "target": target, "polls": len(polls), "poll_errors": errors, "error": error,
        "kv_usage_max": _r(max(kv)) if kv else None,
        "preemptions": _r(preempt, 0) if preempt is not None else None,
        "waiting_mean": _r(waiting_mean, 2), "waiting_max": _r(waiting_max, 2),
        "running_mean": _r(running_mean, 2), "running_max": _r(running_max, 2),
        "ttft_mean_s": _r(ttft_s / ttft_n) if ttft_n and ttft_s is not None else None,
        "itl_mean_s": _r(itl_s / itl_n) if itl_n and itl_s is not None else None,
        "verdict": mode, "verdict_last": last.verdict if last else None,
        "verdicts": dict(verdicts.most_common()),
        "evidence": list(last.evidence[:MAX_EVIDENCE_LINES]) if last else [],
    }


_WANTED = {"llm_kv_cache_usage_ratio": "kv_usage", "llm_requests_waiting": "waiting",
           "llm_requests_running": "running", "llm_preemptions_total": "preemptions_total",
           "llm_time_to_first_token_seconds_sum": "ttft_sum", "llm_time_to_first_token_seconds_count": "ttft_count",
           "llm_inter_token_latency_seconds_sum": "itl_sum", "llm_inter_token_latency_seconds_count": "itl_count"}


def read_metrics(text: str, target: str | None) -> dict[str, float]:
    """The few exporter families a step needs, summed over the target's series (ranks, reasons)."""
    from exporter.sources.engines.exposition import parse

    out: dict[str, float] = {}
    for name, labels, value, _ in parse(text, keep=frozenset(_WANTED).__contains__).samples:
        if target is not None and dict(labels).get("target") != target:
            continue
        key = _WANTED[name]
        # The exporter's own domains (a ratio in [0, 1], counts in [0, 1e18]); past them an answer is
        # garbage, and an infinite or huge number would overflow the recommendation's arithmetic.
        if 0.0 <= value <= (1.0 if key == "kv_usage" else MAX_SERVER_VALUE):
            # A gauge per rank (TP) is the same engine's: KV usage is its max, the queue its sum.
            out[key] = max(out.get(key, value), value) if key == "kv_usage" else out.get(key, 0.0) + value
    return out


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def check_diagnosis(doc: object) -> Mapping[str, Any]:
    """`doc` when the parts of /api/v1/diagnosis the load test reads have the shapes it reads them
    as (exporter/shapes.py DIAGNOSIS); else RuntimeError naming the first part that does not, which
    fails that poll in one line (a list where an object belongs made the sweep die with a traceback
    and lose every step)."""
    from exporter.shapes import DIAGNOSIS, ShapeError, check, kind

    if not isinstance(doc, dict):
        raise RuntimeError(f"exporter: /api/v1/diagnosis is {kind(doc)}, not a JSON object")
    try:
        check(doc, DIAGNOSIS)
    except ShapeError as error:
        raise RuntimeError(f"exporter: /api/v1/diagnosis: {error}") from None
    return doc


def server_number(value: object, ceiling: float = MAX_SERVER_VALUE) -> float | None:
    """A number the exporter sent, when it is one in [0, ceiling]; else None (JSON's NaN and
    Infinity, 1e999, a negative count, a boolean, a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of 400 digits
        return None
    return number if 0.0 <= number <= ceiling else None


def pick_target(diagnosis: Mapping[str, Any], wanted: str | None) -> str | None:
    """The --target name, else the only target, else the busiest (most running) then the first by name."""
    targets = diagnosis.get("targets") or {}
    if not isinstance(targets, dict) or not targets:
        return None
    if wanted is not None:
        return wanted if wanted in targets else None

    def running(name: str) -> float:
        entry = targets[name]
        numbers = entry.get("numbers") if isinstance(entry, dict) else None
        value = server_number(numbers.get("running")) if isinstance(numbers, dict) else None
        return value or 0.0
    return sorted(targets, key=lambda n: (-running(n), n))[0]


def poll_from(diagnosis: Mapping[str, Any] | None, metrics: Mapping[str, float], target: str | None,
              t: float) -> Poll:
    targets = (diagnosis or {}).get("targets")
    entry = targets.get(target or "") if isinstance(targets, dict) else None
    entry = entry if isinstance(entry, dict) else {}
    raw_numbers = entry.get("numbers")
    numbers = raw_numbers if isinstance(raw_numbers, dict) else {}

    def number(key: str, fallback: str, ceiling: float = MAX_SERVER_VALUE) -> float | None:
        value = metrics.get(key)
        return server_number(numbers.get(fallback), ceiling) if value is None else value
    raw_evidence = entry.get("evidence")
    evidence = tuple(_clip(e, MAX_EVIDENCE_CHARS) for e in (raw_evidence if isinstance(raw_evidence, list) else ())
                     if isinstance(e, str))[:MAX_EVIDENCE_LINES]
    verdict = entry.get("verdict")
    return Poll(t, verdict if isinstance(verdict, str) and len(verdict) <= MAX_VERDICT_CHARS else None, evidence,
                number("kv_usage", "kv_usage_ratio", 1.0), number("waiting", "waiting"),
                number("running", "running"), metrics.get("preemptions_total"), metrics.get("ttft_sum"),
                metrics.get("ttft_count"), metrics.get("itl_sum"), metrics.get("itl_count"))


class ExporterWatch:
    """Polls one exporter's /api/v1/diagnosis and /metrics, each GET bounded in time and bytes, with
    the engine scrapes' HTTP client (only these two URLs, no redirects)."""

    def __init__(self, base_url: str, target: str | None = None, *, timeout_s: float = POLL_TIMEOUT_S,
                 interval_s: float = POLL_INTERVAL_S) -> None:
        from exporter.reach import exporter_base_url
        from exporter.sources.engines.http import HttpClient

        base = exporter_base_url(base_url)  # http://HOST:9480/metrics is taken as http://HOST:9480
        self.base_url = base
        self.target: str | None = target
        self.interval_s = interval_s
        self.headers = {"Accept": "application/json"}
        self._diagnosis = HttpClient(base + "/api/v1/diagnosis", timeout_s=timeout_s)
        self._metrics = HttpClient(base + "/metrics", timeout_s=timeout_s, headers={"Accept": "text/plain"})

    async def poll(self, t: float) -> Poll:
        """One reading; raises RuntimeError with a readable reason when the exporter did not answer
        (an HTTP status as its code and phrase, never the body that came with it)."""
        from exporter.reach import failure_words
        from exporter.sources.base import SourceError

        try:
            body = await self._diagnosis.get(max_body=MAX_DIAGNOSIS_BYTES)
            diagnosis = jsonsafe.loads(body)
            text = (await self._metrics.get(max_body=MAX_METRICS_BYTES)).decode("utf-8", "replace")
        except SourceError as error:
            raise RuntimeError(f"exporter: {failure_words(error.reason, error.message, error.status)}") from None
        except JsonTooDeep as error:
            raise RuntimeError(f"exporter: /api/v1/diagnosis: {error}") from None
        except ValueError:
            raise RuntimeError("exporter: /api/v1/diagnosis is not JSON") from None
        check_diagnosis(diagnosis)
        if self.target is None:  # chosen once, so a step never mixes two targets' readings
            self.target = pick_target(diagnosis, None)
        return poll_from(diagnosis, read_metrics(text, self.target), self.target, t)

    async def watch(self, start: float, end: float, clock: Callable[[], float]) -> dict[str, Any]:
        """Poll from `start` to `end` (monotonic times of `clock`), one reading at each end; summarize."""
        polls: list[Poll] = []
        errors, last_error = 0, None
        await asyncio.sleep(max(0.0, start - clock()))
        next_at = start
        while True:
            now = clock()
            try:
                polls.append(await self.poll(now))
            except RuntimeError as error:
                errors, last_error = errors + 1, str(error)
            except Exception as error:  # noqa: BLE001 - an answer no check foresaw fails this poll, not the sweep
                errors, last_error = errors + 1, f"exporter: an answer that could not be read ({type(error).__name__})"
            if now >= end:
                break
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, min(next_at, end) - clock()))
        summary = server_summary(polls, errors, self.target, last_error if not polls else None)
        summary["last_poll_error"] = last_error
        return summary

    async def aclose(self) -> None:
        await self._diagnosis.aclose()
        await self._metrics.aclose()


# --- the workload --------------------------------------------------------------------------------

# Short, common English words: most tokenizers read each as one token, so N words is close to N
# prompt tokens (the engine's own count, from usage, is what the report uses).
_WORDS = ("the", "of", "and", "to", "in", "is", "it", "you", "that", "was", "for", "on", "are", "with", "as",
          "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what",
          "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said",
          "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then",
          "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two",
          "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people",
          "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now",
          "find")


def words_prompt(words: int, index: int, run: int = 0) -> str:
    """A prompt of `words` words. Each request's starts with its run's and its own number, and its
    offset into the words, so an engine's prefix cache cannot serve one request from another's blocks,
    nor from an earlier load test's (a second run's TTFT read 37-57 ms where the first read 510)."""
    if words <= 0:
        return ""
    body = [_WORDS[(index * 7 + i) % len(_WORDS)] for i in range(words - 1)]
    return " ".join([f"r{run}x{index}" if run else f"r{index}", *body])


class Workload:
    """The requests a sweep sends, in order: fixed lengths, or a dataset cycled (shuffled, seeded)."""

    def __init__(self, *, prompt_words: int | None = None, max_tokens: int | None = None,
                 dataset: Sequence[RequestSpec] | None = None, seed: int = 0, run: int | None = None) -> None:
        if dataset is None and (prompt_words is None or max_tokens is None):
            raise ValueError("a workload needs a dataset or both prompt words and max tokens")
        self.prompt_words = prompt_words
        self.max_tokens = max_tokens
        # Generated prompts carry a number of this run's (random unless given), so a load test repeated
        # against one server finds none of its prompts in the prefix cache.
        self.run = run if run is not None else random.SystemRandom().randrange(1, 10**6)
        self.dataset = list(dataset) if dataset is not None else None
        if self.dataset is not None:
            random.Random(seed).shuffle(self.dataset)
        self._index = 0

    def __iter__(self) -> Iterator[RequestSpec]:
        return self

    def __next__(self) -> RequestSpec:
        index, self._index = self._index, self._index + 1
        if self.dataset is not None:
            return self.dataset[index % len(self.dataset)]
        return RequestSpec(words_prompt(self.prompt_words or 0, index, self.run), self.max_tokens or 1)


class DatasetError(ValueError):
    """The --dataset file is unreadable, too large or malformed (the message says where)."""


def load_dataset(path: str, *, max_bytes: int = MAX_DATASET_BYTES, max_lines: int = MAX_DATASET_LINES,
                 default_max_tokens: int | None = None) -> list[RequestSpec]:
    """JSONL of {"prompt": str, "max_tokens": int}; blank lines skipped; bounded in bytes and lines."""
    from exporter.safefile import read_regular_file

    if "\0" in path:
        raise DatasetError(f"{path!r}: not a file name")
    try:
        size = os.stat(path).st_size
        if size > max_bytes:
            raise DatasetError(f"{path}: {size} bytes, over the {max_bytes >> 20} MiB cap")
        # A regular file only: a FIFO given as --dataset waited for a writer for ever.
        raw = read_regular_file(path, max_bytes)
    except OSError as error:
        raise DatasetError(f"{path}: {error.strerror or error}") from None
    specs: list[RequestSpec] = []
    for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        if len(specs) >= max_lines:
            raise DatasetError(f"{path}: more than {max_lines} requests")
        try:
            item = jsonsafe.loads(line)
        except JsonTooDeep as error:
            raise DatasetError(f"{path}:{number}: {error}") from None
        except ValueError:
            raise DatasetError(f"{path}:{number}: not JSON") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise DatasetError(f"{path}:{number}: expected an object with a string \"prompt\"")
        prompt, tokens = item["prompt"], item.get("max_tokens", default_max_tokens)
        if len(prompt) > MAX_PROMPT_CHARS:
            raise DatasetError(f"{path}:{number}: prompt over {MAX_PROMPT_CHARS} characters")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS_LIMIT:
            raise DatasetError(f"{path}:{number}: \"max_tokens\" must be an integer 1..{MAX_TOKENS_LIMIT}")
        specs.append(RequestSpec(prompt, tokens))
    if not specs:
        raise DatasetError(f"{path}: no requests")
    return specs


# --- a server that does not answer ---------------------------------------------------------------

def never_connected(outcome: Outcome) -> bool:
    """The request never reached the server: it failed before it was sent (no connection, a name
    that does not resolve, TLS refused). An outcome that does not say when it was sent (a test's
    fake, a send that raised) is not taken for one."""
    return (not outcome.ok and outcome.reason in NO_CONNECTION_REASONS and outcome.status is None
            and getattr(outcome, "sent_at", 0.0) is None)


def unreachable_cause(reason: str, message: str) -> str:
    """The words of a never_connected failure, from exporter/probe/client.py's message:
    "connection refused", "cannot resolve HOST: ...", "no connection within 10s"."""
    if reason == "connection" and message.startswith("cannot connect to "):
        return message.rpartition(": ")[2] or "cannot connect"
    return message or reason


class Breaker:
    """Consecutive requests that never reached the server, over the whole sweep. Each one delays
    the next request (BACKOFF_FIRST_S, doubling, at most BACKOFF_MAX_S); UNREACHABLE_AFTER in a row
    trip it, and the sweep stops. Any request that reached the server (answered, even with an
    error) starts the count again."""

    def __init__(self, after: int = UNREACHABLE_AFTER, first_s: float = BACKOFF_FIRST_S,
                 max_s: float = BACKOFF_MAX_S) -> None:
        self.after, self.first_s, self.max_s = after, first_s, max_s
        self.in_a_row = 0
        self.resume_at = 0.0  # clock time before which no request is sent
        self.tripped = False
        self.cause: tuple[str, str] | None = None  # (reason, message) of the last request that never connected
        self.last_failure: tuple[str, int | None] | None = None  # (reason, HTTP status) of the last failure

    def record(self, outcome: Outcome, now: float) -> None:
        if not outcome.ok:
            self.last_failure = (outcome.reason, outcome.status)
        if not never_connected(outcome):
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.cause = (outcome.reason, str(getattr(outcome, "message", "") or ""))
        if self.in_a_row >= self.after:
            self.tripped = True
        self.resume_at = max(self.resume_at, now + min(self.max_s, self.first_s * 2 ** (self.in_a_row - 1)))

    def stopped(self, url: str | None) -> dict[str, Any] | None:
        """The report's `stopped` block once tripped: why, in one line."""
        if not self.tripped or self.cause is None:
            return None
        cause = unreachable_cause(*self.cause)
        return {"reason": self.cause[0], "cause": cause, "after": self.in_a_row,
                "text": f"cannot reach {url or 'the server'}: {cause}"}


# --- running a step ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SweepConfig:
    """What to run. `mode` is "concurrency" (closed loop) or "rate" (open loop, requests/s)."""

    mode: str
    levels: tuple[float, ...]
    warmup_s: float
    duration_s: float
    request_timeout_s: float = 120.0
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ttft_slo_s: float = TTFT.threshold_seconds
    tbt_slo_s: float = TBT.threshold_seconds
    seed: int = 0
    requests_cap: int = MAX_RECORDED_REQUESTS
    gaps_cap: int = MAX_RECORDED_GAPS

    def check(self) -> None:
        """Raise ValueError naming the bound a config breaks."""
        if self.mode not in ("concurrency", "rate"):
            raise ValueError(f"mode must be concurrency or rate, not {self.mode!r}")
        if not 1 <= len(self.levels) <= MAX_STEPS:
            raise ValueError(f"between 1 and {MAX_STEPS} steps")
        for level in self.levels:
            if not math.isfinite(level):
                raise ValueError(f"{self.mode} {level:g}: not a number")
            if self.mode == "concurrency" and (level != int(level) or not 1 <= level <= MAX_CONCURRENCY):
                raise ValueError(f"concurrency {level:g}: an integer 1..{MAX_CONCURRENCY}")
            if self.mode == "rate" and not 0 < level <= MAX_RATE:
                raise ValueError(f"rate {level:g}: over 0 and at most {MAX_RATE:g} requests/s")
        if not 0 < self.duration_s <= MAX_STEP_DURATION_S:
            raise ValueError(f"duration: over 0 and at most {MAX_STEP_DURATION_S:g}s per step")
        if not 0 <= self.warmup_s <= MAX_WARMUP_S:
            raise ValueError(f"warmup: at most {MAX_WARMUP_S:g}s")
        total = len(self.levels) * (self.warmup_s + self.duration_s)
        if total > MAX_TOTAL_S:
            raise ValueError(f"the sweep would run {total:g}s, over the {MAX_TOTAL_S:g}s cap")
        if not 1 <= self.max_in_flight <= MAX_CONCURRENCY:
            raise ValueError(f"max in flight: 1..{MAX_CONCURRENCY}")


Progress = Callable[[int, int, float, "StepStats | None", float], None]
"""(step index, steps, level, the step's stats so far, fraction of the step done 0..1)."""


async def _send_bounded(send: Send, spec: RequestSpec, timeout_s: float) -> Outcome:
    # The client has its own timeout; this one (a little longer) is the backstop that keeps a stuck
    # send from holding its slot, and a raising send counts as a failed request, never a crash.
    try:
        async with asyncio.timeout(timeout_s + 5.0):
            return await send(spec)
    except TimeoutError:
        return Failed("timeout")
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - one request's bug must not end the sweep
        return Failed(f"client_error:{type(error).__name__}")


async def run_step(send: Send, workload: Workload, config: SweepConfig, level: float, *,
                   watch: ExporterWatch | None = None, progress: Callable[[StepStats, float], None] | None = None,
                   clock: Callable[[], float] = time.monotonic, breaker: Breaker | None = None) -> dict[str, Any]:
    """Run one step and return its record (see docs/loadtest.md: steps[]). `breaker` (the sweep's)
    spaces out requests that do not reach the server and ends the step once it trips."""
    breaker = breaker if breaker is not None else Breaker()
    stats = StepStats(config.ttft_slo_s, config.tbt_slo_s, random.Random(config.seed),
                      requests_cap=config.requests_cap, gaps_cap=config.gaps_cap)
    started_at = time.time()
    cpu_start = time.process_time()
    start = clock()
    window_start = start + config.warmup_s
    deadline = window_start + config.duration_s
    in_flight = InFlight(window_start, deadline)
    cap = int(level) if config.mode == "concurrency" else config.max_in_flight
    watch_task = asyncio.create_task(watch.watch(window_start, deadline, clock)) if watch else None

    async def one(spec: RequestSpec) -> None:
        sent = clock()
        in_flight.change(sent, +1)
        try:
            outcome = await _send_bounded(send, spec, config.request_timeout_s)
        finally:
            ended = clock()
            in_flight.change(ended, -1)
        breaker.record(outcome, ended)
        stats.record_window(outcome, sent, ended, window_start, deadline)
        if window_start <= sent < deadline:
            stats.record(outcome, ended)

    async def closed_worker() -> None:
        while clock() < deadline and not breaker.tripped:
            if clock() < breaker.resume_at:  # backing off a server that took no connection
                await asyncio.sleep(min(breaker.resume_at, deadline) - clock())
                continue
            await one(next(workload))

    async def open_arrivals() -> None:
        rng = random.Random(config.seed + 1)
        tasks: set[asyncio.Task] = set()
        at = start
        while True:
            at += rng.expovariate(level)
            if at >= deadline:
                break
            await asyncio.sleep(max(0.0, at - clock()))
            if breaker.tripped:
                break
            if at < breaker.resume_at:  # backing off: this arrival is not sent (nor counted as dropped)
                continue
            if in_flight.now >= cap:
                if window_start <= at:
                    stats.dropped += 1
                continue
            task = asyncio.create_task(one(next(workload)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def ticker() -> None:
        while progress is not None:
            # Under 1 until the drain is over: the final call (1.0) has the step's last counts.
            progress(stats, min(0.99, (clock() - start) / max(1e-9, deadline - start)))
            await asyncio.sleep(0.5)

    tick = asyncio.create_task(ticker())
    try:
        if config.mode == "concurrency":
            await asyncio.gather(*(closed_worker() for _ in range(cap)))
        else:
            await open_arrivals()
        server = await watch_task if watch_task else None
    finally:
        tick.cancel()
        if watch_task and not watch_task.done():
            watch_task.cancel()
    if progress is not None and not breaker.tripped:
        progress(stats, 1.0)
    record = step_record(stats, config, level, in_flight, window_start, deadline, started_at, server)
    if server and server.get("poll_errors"):  # where the exporter's side of the sweep went, in the table too
        record["notes"].append(f"{server['poll_errors']} of {server['polls'] + server['poll_errors']} exporter "
                               f"polls failed, the last: {server.get('last_poll_error')}")
    # The load generator's own CPU (cores busy over the step): on the engine's host it is CPU the engine
    # did not have, which the planner needs to scale a CPU engine's threads (docs/planner.md).
    record["client"] = {"cpu_cores": _r((time.process_time() - cpu_start) / max(1e-9, clock() - start), 4)}
    return record


def step_record(stats: StepStats, config: SweepConfig, level: float, in_flight: InFlight, window_start: float,
                deadline: float, started_at: float, server: dict[str, Any] | None) -> dict[str, Any]:
    # Latency and counts are of the requests started in the window (drained to their end); rates are
    # of the work done inside the window (StepStats.record_window).
    elapsed = max(deadline, stats.last_end) - window_start
    span = deadline - window_start
    failed = sum(stats.failed.values())
    total = stats.ok + failed
    notes = []
    if total == 0:
        # Closed loop: a request that outlasts warm-up plus duration leaves no request starting in the window.
        notes.append("no request started in the measured window: requests take longer than the step "
                     "(raise --duration, lower --max-tokens)" if not stats.dropped else
                     "every arrival in the measured window was dropped at the in-flight cap")
    return {
        "mode": config.mode, "level": level,
        "concurrency": int(level) if config.mode == "concurrency" else None,
        "rate": level if config.mode == "rate" else None,
        "started_at": round(started_at, 3), "elapsed_s": _r(elapsed, 3),
        "requests": {"ok": stats.ok, "failed": failed, "failed_by_reason": dict(stats.failed.most_common()),
                     "dropped": stats.dropped, "recorded": len(stats.ttft.values)},
        "in_flight": {"max": in_flight.max, "mean": _r(in_flight.mean(), 2)},
        "latency_s": {"ttft": summarize(stats.ttft.values).as_dict(), "tpot": summarize(stats.tpot.values).as_dict(),
                      "itl": summarize(stats.itl.values).as_dict(), "e2e": summarize(stats.e2e.values).as_dict()},
        "throughput": {"requests_per_s": _r(stats.window_done / span, 3),
                       "input_tokens_per_s": _r(stats.window_input / span, 2),
                       "output_tokens_per_s": _r(stats.window_output / span, 2),
                       "input_tokens": stats.input_tokens, "output_tokens": stats.output_tokens},
        "goodput": {"good": stats.good, "share": _r(stats.good / total, 4) if total else None,
                    "requests_per_s": _r(stats.window_good / span, 3)},
        "server": server,
        "notes": notes,
    }


# --- after the sweep: knee and recommendation ----------------------------------------------------

def dig(step: Mapping[str, Any], *path: str) -> Any:
    """step[path[0]][path[1]]..., None where a level is missing (a step's JSON may lack a part)."""
    value: Any = step
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def step_verdict(step: Mapping[str, Any]) -> str | None:
    return dig(step, "server", "verdict")


def level_words(step: Mapping[str, Any]) -> str:
    if step.get("mode") == "rate":
        return f"rate {step['level']:g}/s"
    return f"concurrency {step['level']:g}"


def tbt_p95(step: Mapping[str, Any]) -> tuple[float | None, str]:
    """The step's time-between-tokens tail: ITL p95 (token gaps), else TPOT p95 (per request)."""
    itl = dig(step, "latency_s", "itl", "p95")
    if itl is not None:
        return itl, "ITL"
    return dig(step, "latency_s", "tpot", "p95"), "TPOT"


def _rose(before: float | None, after: float | None, by: float) -> bool:
    return before is not None and after is not None and after > before * (1 + by)


def knee_reasons(prev: Mapping[str, Any] | None, step: Mapping[str, Any], ttft_slo_s: float,
                 tbt_slo_s: float) -> list[str]:
    """Why `step` is past the knee (empty: it is not)."""
    reasons = []
    tbt, what = tbt_p95(step)
    if tbt is not None and tbt > tbt_slo_s:
        reasons.append(f"TBT ({what}) p95 crossed {tbt_slo_s * 1000:g} ms ({tbt * 1000:.0f} ms)")
    ttft = dig(step, "latency_s", "ttft", "p95")
    if ttft is not None and ttft > ttft_slo_s:
        reasons.append(f"TTFT p95 crossed {ttft_slo_s * 1000:g} ms ({ttft * 1000:.0f} ms)")
    ok, failed = dig(step, "requests", "ok") or 0, dig(step, "requests", "failed") or 0
    if ok + failed and failed / (ok + failed) > FAILED_SHARE_KNEE:
        reasons.append(f"{failed} of {ok + failed} requests failed")
    if prev is not None:
        before = dig(prev, "throughput", "output_tokens_per_s")
        after = dig(step, "throughput", "output_tokens_per_s")
        slower = [name for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"))
                  if _rose(dig(prev, "latency_s", key, "p50"), dig(step, "latency_s", key, "p50"), LATENCY_RISE)]
        if before and after is not None and after < before * (1 + PLATEAU_GAIN) and slower:
            reasons.append(f"output throughput rose only {(after / before - 1) * 100:+.0f}% "
                           f"({before:.0f} -> {after:.0f} tok/s) while {' and '.join(slower)} p50 rose")
    return reasons


def find_knee(steps: Sequence[Mapping[str, Any]], ttft_slo_s: float, tbt_slo_s: float) -> dict[str, Any] | None:
    """The first step past the knee, with why, and how the verdict moved across it."""
    measured = [s for s in steps if _recorded(s)]
    for i, step in enumerate(measured):
        prev = measured[i - 1] if i else None
        reasons = knee_reasons(prev, step, ttft_slo_s, tbt_slo_s)
        if not reasons:
            continue
        before, at = (step_verdict(prev) if prev else None), step_verdict(step)
        if prev is None:
            moved = f"verdict {at}" if at else "no verdict from the exporter"
        elif before == at:
            moved = f"verdict stayed {at}" if at else "no verdict from the exporter"
        else:
            moved = f"verdict moved {before or 'unknown'} -> {at or 'unknown'}"
        text = f"at {level_words(step)} {'; '.join(reasons)}; {moved}"
        return {"index": steps.index(step), "level": step["level"], "reasons": reasons, "verdict_before": before,
                "verdict_at": at, "text": text}
    return None


def _recorded(step: Mapping[str, Any]) -> bool:
    """The step has requests to judge (ok or failed); one without says nothing about the knee."""
    return bool((dig(step, "requests", "ok") or 0) + (dig(step, "requests", "failed") or 0))


def _sequences(step: Mapping[str, Any]) -> float | None:
    """Concurrent sequences the engine held in a step: its running max from the exporter, else
    the client's in-flight max."""
    running = dig(step, "server", "running_max")
    if running:
        return float(running)
    flight = dig(step, "in_flight", "max")
    return float(flight) if flight else None


def _step_capacity(step: Mapping[str, Any]) -> int | None:
    """A step as a max-concurrency figure: its concurrency (closed loop), else its sequences."""
    if step.get("mode") == "concurrency":
        return int(step["level"])
    seqs = _sequences(step)
    return int(seqs) if seqs else None


def kv_recommendation(steps: Sequence[Mapping[str, Any]], watermark: float = KV_WATERMARK) -> dict[str, Any]:
    """Max concurrency that keeps the KV cache under `watermark`: measured (the largest step whose
    KV watermark stayed under it) when some step reached it, else extrapolated linearly from KV
    usage per running sequence (least squares through the origin over the steps)."""
    known = [s for s in steps if dig(s, "server", "kv_usage_max") is not None]
    if not known:
        return {"method": None, "max_concurrency": None, "kv_per_sequence": None,
                "text": "no KV usage from the exporter: no KV-based limit"}
    reached = [s for s in known if s["server"]["kv_usage_max"] >= watermark]
    under = [s for s in known if s["server"]["kv_usage_max"] < watermark]
    if reached:
        if not under:
            return {"method": "measured", "max_concurrency": None, "kv_per_sequence": None,
                    "text": f"every step reached {watermark:.0%} KV usage: below the first step tested"}
        best = max(under, key=lambda s: s["level"])
        limit = _step_capacity(best)
        return {"method": "measured", "max_concurrency": limit, "kv_per_sequence": None,
                "text": f"{level_words(best)} is the largest step whose KV usage watermark stayed under "
                        f"{watermark:.0%} ({best['server']['kv_usage_max']:.0%})"}
    points = [(seqs, s["server"]["kv_usage_max"]) for s in known if (seqs := _sequences(s))]
    sxx = sum(x * x for x, _ in points)
    slope = sum(x * y for x, y in points) / sxx if sxx else 0.0
    if slope <= 0:
        return {"method": "extrapolated", "max_concurrency": None, "kv_per_sequence": 0.0,
                "text": "KV usage did not grow with running sequences: no KV-based limit"}
    limit = int(watermark / slope)
    peak = max(known, key=lambda s: s["server"]["kv_usage_max"])
    return {"method": "extrapolated", "max_concurrency": limit, "kv_per_sequence": _r(slope, 6),
            "text": f"no step reached {watermark:.0%} KV usage (peak {peak['server']['kv_usage_max']:.0%}); "
                    f"at {slope:.2%} of the cache per running sequence, {watermark:.0%} is about {limit} "
                    "sequences (linear extrapolation)"}


def slo_recommendation(steps: Sequence[Mapping[str, Any]], knee: Mapping[str, Any] | None) -> dict[str, Any]:
    """Max concurrency from the knee: the last step before it."""
    steps = [s for s in steps if _recorded(s)]
    if not steps:
        return {"max_concurrency": None, "bounded": False, "text": "no step recorded a request"}
    if knee is None:
        top = max(steps, key=lambda s: s["level"])
        return {"max_concurrency": _step_capacity(top), "bounded": False,
                "text": f"no knee up to {level_words(top)}: at least that much meets the SLOs"}
    at = next(i for i, s in enumerate(steps) if s["level"] == knee["level"])
    if at == 0:
        return {"max_concurrency": None, "bounded": True,
                "text": f"the first step ({level_words(steps[0])}) is already past the knee: test lower"}
    prev = steps[at - 1]
    return {"max_concurrency": _step_capacity(prev), "bounded": True,
            "text": f"{level_words(prev)}, the last step before the knee"}


def recommend(steps: Sequence[Mapping[str, Any]], knee: Mapping[str, Any] | None,
              watermark: float = KV_WATERMARK) -> dict[str, Any]:
    """The max concurrency that follows from what was measured: a knee (the last step before it), or
    a step whose KV usage reached the watermark (the largest one under it); the smaller when both.
    An extrapolated KV figure alone is no limit: no step ran there. Without a measured limit there is
    no number, only what the sweep showed and which levels to test next."""
    kv = kv_recommendation(steps, watermark)
    slo = slo_recommendation(steps, knee)
    measured = [(kv["max_concurrency"], "KV watermark")] if kv["method"] == "measured" and kv["max_concurrency"] \
        else []
    if slo["bounded"] and slo["max_concurrency"]:
        measured.append((slo["max_concurrency"], "SLO knee"))
    next_levels = _next_levels(steps, slo, kv)
    if measured:
        best = min(limit for limit, _ in measured)
        which = " and ".join(name for limit, name in measured if limit == best)
        text = (f"max concurrency {best} per replica (vLLM --max-num-seqs {best}, SGLang --max-running-requests "
                f"{best}), set by the {which}. KV: {kv['text']}. SLO: {slo['text']}.")
        return {"max_concurrency": best, "max_num_seqs": best, "kv": kv, "slo": slo, "next_levels": [],
                "text": text}
    if slo["max_concurrency"] and not slo["bounded"]:
        text = (f"none yet: every step up to {slo['max_concurrency']} met the SLOs and no step reached "
                f"{watermark:.0%} KV usage, so the limit is above what was tested. KV: {kv['text']}. "
                + (f"Test higher: --concurrency {','.join(str(level) for level in next_levels)}." if next_levels
                   else "Test higher levels."))
    else:
        text = "no recommendation: " + "; ".join((kv["text"], slo["text"]))
    return {"max_concurrency": None, "max_num_seqs": None, "kv": kv, "slo": slo, "next_levels": next_levels,
            "text": text}


def _next_levels(steps: Sequence[Mapping[str, Any]], slo: Mapping[str, Any], kv: Mapping[str, Any]) -> list[int]:
    """Levels to test after a sweep that found no limit: doubling from the highest step tested, up to
    the KV estimate (at most four; a first step past the knee asks for lower ones instead)."""
    tested = slo.get("max_concurrency")
    if not tested or slo.get("bounded"):
        return []
    ceiling = kv["max_concurrency"] if kv["method"] == "extrapolated" and kv["max_concurrency"] else tested * 16
    levels: list[int] = []
    level = tested
    while len(levels) < 4 and level < ceiling:
        level = min(level * 2, ceiling)
        levels.append(int(level))
    return levels


# --- the sweep -----------------------------------------------------------------------------------

async def run_sweep(send: Send, workload: Workload, config: SweepConfig, *, watch: ExporterWatch | None = None,
                    progress: Progress | None = None, meta: Mapping[str, Any] | None = None,
                    keep_on_interrupt: bool = False) -> dict[str, Any]:
    """Every step in order, then the knee and the recommendation: the report (docs/loadtest.md).

    A sweep that cannot go on keeps what it finished: a server that takes no connection (the
    Breaker), a step that raised (an answer no check foresaw: `stopped.reason` "error"), or, with
    `keep_on_interrupt`, Ctrl-C (asyncio.run cancels this task: "interrupted"). The report then has
    the steps completed, `stopped` says where and why, and the knee and the recommendation are
    judged on the completed steps alone."""
    config.check()
    steps: list[dict[str, Any]] = []
    breaker = Breaker()
    stopped = None
    for i, level in enumerate(config.levels):
        def step_progress(stats: StepStats, done: float, i: int = i, level: float = level) -> None:
            if progress is not None:
                progress(i, len(config.levels), level, stats, done)
        try:
            step = await run_step(send, workload, config, level, watch=watch, progress=step_progress,
                                  breaker=breaker)
        except asyncio.CancelledError:
            if not keep_on_interrupt:
                raise
            stopped = _stopped_in_step("interrupted", "interrupted", i, config)
            break
        except Exception as error:  # noqa: BLE001 - the steps done are kept and the reason said in one line
            stopped = _stopped_in_step("error", f"{type(error).__name__}: {_clip(str(error), 200)}", i, config)
            break
        step["index"] = i
        steps.append(step)
        stopped = breaker.stopped((meta or {}).get("url"))
        if stopped is not None:
            step["notes"].append(f"stopped: {stopped['text']}")
            break
    # The step the server went away in says nothing about the knee: judged are the steps completed.
    judged = steps[:-1] if stopped is not None and stopped["reason"] not in STOPPED_BETWEEN_STEPS else steps
    knee, recommendation = conclude(judged, config)
    return {
        "schema": SCHEMA_ID,
        "config": {**(meta or {}), "mode": config.mode, "levels": list(config.levels), "warmup_s": config.warmup_s,
                   "duration_s": config.duration_s, "request_timeout_s": config.request_timeout_s,
                   "max_in_flight": config.max_in_flight if config.mode == "rate" else None,
                   "slo": {"ttft_s": config.ttft_slo_s, "tbt_s": config.tbt_slo_s}, "kv_watermark": KV_WATERMARK,
                   "requests_cap": config.requests_cap, "gaps_cap": config.gaps_cap},
        "steps": steps,
        "knee": knee,
        "recommendation": recommendation,
        "stopped": stopped,
        "last_failure": None if breaker.last_failure is None else
        {"reason": breaker.last_failure[0], "status": breaker.last_failure[1]},
    }


# Stops that leave no partial step in `steps` (the step they interrupted is not recorded at all).
STOPPED_BETWEEN_STEPS = frozenset({"error", "interrupted"})


def _stopped_in_step(reason: str, cause: str, index: int, config: SweepConfig) -> dict[str, Any]:
    """The report's `stopped` block for a sweep that stopped inside step `index` (not recorded)."""
    level = config.levels[index]
    where = f"in step {index + 1} of {len(config.levels)} ({config.mode} {level:g})"
    done = f"{index} step{'s' if index != 1 else ''} finished and kept"
    what = f"interrupted {where}" if reason == "interrupted" else f"an error {where}, {cause}"
    return {"reason": reason, "cause": cause, "after": index, "text": f"{what}; {done}"}


def conclude(steps: Sequence[Mapping[str, Any]], config: SweepConfig) -> tuple[dict[str, Any] | None,
                                                                               dict[str, Any]]:
    """The knee and the recommendation from `steps`, or none of either when no request succeeded. An
    error here (a figure no check foresaw) costs the conclusion, never the steps measured."""
    if not any(dig(s, "requests", "ok") for s in steps):  # nothing succeeded: no knee, no number
        return None, no_recommendation(NO_SUCCESS)
    try:
        knee = find_knee(steps, config.ttft_slo_s, config.tbt_slo_s)
        return knee, recommend(steps, knee)
    except (ArithmeticError, ValueError, TypeError, KeyError) as error:
        return None, no_recommendation(f"no recommendation: it could not be computed ({type(error).__name__})")


def no_recommendation(why: str) -> dict[str, Any]:
    """The recommendation block of a sweep that measured nothing to recommend from."""
    return {"max_concurrency": None, "max_num_seqs": None, "next_levels": [], "text": why,
            "kv": {"method": None, "max_concurrency": None, "kv_per_sequence": None, "text": why},
            "slo": {"max_concurrency": None, "bounded": False, "text": why}}


def succeeded(report: Mapping[str, Any]) -> bool:
    """Whether any request of the sweep succeeded."""
    return any(dig(s, "requests", "ok") for s in report.get("steps") or ())


def _r(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


# --- sending through the probe's client ----------------------------------------------------------

def make_sender(url: str, *, api: str, model: str | None, timeout_s: float,
                headers: Mapping[str, str] | None = None) -> tuple[Send, Callable[[], None]]:
    """A Send that streams one completion with exporter/probe/client.py (ignore_eos, so an engine
    generates exactly max_tokens), and the close of its resolver thread."""
    from exporter.probe.client import Resolver, StreamLimits, stream_completion

    resolver = Resolver()

    async def send(spec: RequestSpec) -> Outcome:
        return await stream_completion(url, api=api, model=model, prompt=spec.prompt, max_tokens=spec.max_tokens,
                                       timeout_s=timeout_s, headers=headers, resolver=resolver,
                                       limits=StreamLimits.for_tokens(
                                           spec.max_tokens, connect_timeout_s=min(timeout_s, CONNECT_TIMEOUT_S)))
    return send, resolver.close

