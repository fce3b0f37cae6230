"""The load test's watch on the exporter: what the exporter said during each step.

ExporterWatch polls one exporter's /api/v1/diagnosis and /metrics about once a second through a
step's measured window, each GET bounded in time and bytes, reads only the numbers a step needs
(KV usage, queue, preemptions, TTFT and ITL sums, the verdict), each checked against the
exporter's own domains, and summarizes the readings into the step's `server` block.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from exporter import jsonsafe
from exporter.jsonsafe import JsonTooDeep
from exporter.probe.loadtest_stats import rounded

POLL_INTERVAL_S = 1.0
POLL_TIMEOUT_S = 2.0
MAX_DIAGNOSIS_BYTES = 8 << 20  # as `doctor`
MAX_METRICS_BYTES = 32 << 20
MAX_EVIDENCE_LINES = 12
MAX_EVIDENCE_CHARS = 400  # one evidence line is a sentence; a longer one is cut (the report keeps each)
MAX_VERDICT_CHARS = 64  # verdict names are identifiers (kv_capacity); a longer "verdict" is no verdict
MAX_SERVER_VALUE = 1e18  # the exporter's own domain for counts (catalog.base.MAX_VALUE): past it, garbage


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
        "kv_usage_max": rounded(max(kv)) if kv else None,
        "preemptions": rounded(preempt, 0) if preempt is not None else None,
        "waiting_mean": rounded(waiting_mean, 2), "waiting_max": rounded(waiting_max, 2),
        "running_mean": rounded(running_mean, 2), "running_max": rounded(running_max, 2),
        "ttft_mean_s": rounded(ttft_s / ttft_n) if ttft_n and ttft_s is not None else None,
        "itl_mean_s": rounded(itl_s / itl_n) if itl_n and itl_s is not None else None,
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


def clip(text: str, limit: int) -> str:
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
    evidence = tuple(clip(e, MAX_EVIDENCE_CHARS) for e in (raw_evidence if isinstance(raw_evidence, list) else ())
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
        from exporter.httpclient import HttpClient
        from exporter.reach import exporter_base_url

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
