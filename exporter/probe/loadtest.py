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

This module is the driver: the workload, the steps (closed and open loop), the breaker for a
server that takes no connection, and the sweep that puts the report together. Beside it:
loadtest_stats.py (percentiles, reservoirs, a step's counters), loadtest_watch.py (the exporter's
side of each step) and loadtest_knee.py (the knee and the recommendation, from the step records).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter import jsonsafe
from exporter.jsonsafe import JsonTooDeep
from exporter.probe.loadtest_knee import KV_WATERMARK, NO_SUCCESS, dig, find_knee, no_recommendation, recommend
from exporter.probe.loadtest_stats import (
    MAX_RECORDED_GAPS,
    MAX_RECORDED_REQUESTS,
    InFlight,
    Outcome,
    StepStats,
    rounded,
    summarize,
)
from exporter.probe.loadtest_watch import ExporterWatch, clip
from exporter.slo import TBT, TTFT

# --- bounds -------------------------------------------------------------------------------------

MAX_STEPS = 32
MAX_CONCURRENCY = 2048
MAX_RATE = 10_000.0  # requests/s
MAX_STEP_DURATION_S = 600.0
MAX_WARMUP_S = 300.0
MAX_TOTAL_S = 4 * 3600.0  # warm-up plus duration over all steps; the drain after each is extra
DEFAULT_MAX_IN_FLIGHT = 256  # open loop: arrivals past this many in flight are dropped (counted)
MAX_DATASET_BYTES = 64 << 20
MAX_DATASET_LINES = 100_000
MAX_PROMPT_CHARS = 1 << 20
MAX_TOKENS_LIMIT = 1 << 17
MAX_PROMPT_WORDS = 1 << 17
SCHEMA_ID = "llm-exporter-loadtest/1"
# A server that accepts no connection: after this many requests in a row that never reached it
# (connection refused, no route, DNS, no connection in time, TLS refused), with a backoff between
# them doubling from BACKOFF_FIRST_S, the sweep stops and says why (exit 2, docs/cli.md).
UNREACHABLE_AFTER = 5
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0
CONNECT_TIMEOUT_S = 10.0  # a connection that takes longer is a server that is not there
NO_CONNECTION_REASONS = frozenset({"connection", "dns", "timeout", "tls"})


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


# --- the machine the load runs on ----------------------------------------------------------------

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
    record["client"] = {"cpu_cores": rounded((time.process_time() - cpu_start) / max(1e-9, clock() - start), 4)}
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
        "started_at": round(started_at, 3), "elapsed_s": rounded(elapsed, 3),
        "requests": {"ok": stats.ok, "failed": failed, "failed_by_reason": dict(stats.failed.most_common()),
                     "dropped": stats.dropped, "recorded": len(stats.ttft.values)},
        "in_flight": {"max": in_flight.max, "mean": rounded(in_flight.mean(), 2)},
        "latency_s": {"ttft": summarize(stats.ttft.values).as_dict(), "tpot": summarize(stats.tpot.values).as_dict(),
                      "itl": summarize(stats.itl.values).as_dict(), "e2e": summarize(stats.e2e.values).as_dict()},
        "throughput": {"requests_per_s": rounded(stats.window_done / span, 3),
                       "input_tokens_per_s": rounded(stats.window_input / span, 2),
                       "output_tokens_per_s": rounded(stats.window_output / span, 2),
                       "input_tokens": stats.input_tokens, "output_tokens": stats.output_tokens},
        "goodput": {"good": stats.good, "share": rounded(stats.good / total, 4) if total else None,
                    "requests_per_s": rounded(stats.window_good / span, 3)},
        "server": server,
        "notes": notes,
    }


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
            stopped = _stopped_in_step("error", f"{type(error).__name__}: {clip(str(error), 200)}", i, config)
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
