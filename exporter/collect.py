"""The collection loop: gather every source concurrently into one immutable Snapshot, derive,
and swap the result in. /metrics only ever reads the latest finished result, rendered at most
once: by the first scrape that asks for it.

A source that overruns its timeout is reported as failed for that cycle. Its call is not
cancelled (a blocking NVML call in a thread cannot be), but no second call is started while it is
still running, so a hung driver costs one thread, never a pile of them (nvidia_gpu_exporter's
Cached source)."""

from __future__ import annotations

import asyncio
import logging
import platform
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from exporter import __version__, catalog
from exporter.buckets import Rebucketer
from exporter.clock import Clocks
from exporter.expose import Renderer
from exporter.logstate import StateLog
from exporter.snapshot import Sample, Snapshot, SourceKind, SourceResult, labels_of
from exporter.sources.base import Source, SourceData, SourceError

log = logging.getLogger("llm_exporter.collect")

# Engine scrapes in flight at once. Each one in flight adds its callbacks to every turn of the event
# loop: 10,000 targets started together made each turn so long that a healthy target's scrape ran
# past its 0.8 s timeout and read down. A sidecar's 1-8 targets never wait for a slot, and a
# scrape's timeout starts when it has one, so waiting for a slot never marks a target down.
# 256: a node-level exporter's targets all in flight; 10,000 refused targets then take about 1.5 s of
# CPU a cycle on one core, the healthy one among them scraped in time. The cost of the cap: targets
# that hang run their timeouts 256 at a time.
MAX_SCRAPES_IN_FLIGHT = 256
# An exporter is meant for one node's engines: past this many targets, start says what it costs.
MANY_TARGETS = MAX_SCRAPES_IN_FLIGHT
# The `reason` of llm_exporter_log_lines_suppressed_total for a source's failing/recovered lines.
LOG_SOURCE_STATE = "source_state"
# State-change lines one cycle may log (a thousand targets failing at once is one summary).
MAX_STATE_LINES_PER_CYCLE = 10

DeriveFn = Callable[[Snapshot, "Snapshot | None"], tuple[Sample, ...]]


@dataclass(slots=True)
class SourceHealth:
    """Mutable per-source bookkeeping, owned by the Collector only."""

    last_success_ts: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    last_state: str = ""  # "ok" or the last error reason, for one log line per change
    ever_failed: bool = False  # a success after this is a recovery, worth a line
    log: StateLog = field(default_factory=lambda: StateLog(reasons=(LOG_SOURCE_STATE,)))
    in_flight: asyncio.Task | None = None


class HealthView(NamedTuple):
    """A copy of one source's SourceHealth that a reader off the event loop may keep."""

    last_success_ts: float | None
    errors: dict[str, int]


@dataclass(frozen=True, slots=True)
class Published:
    """A finished cycle: the snapshot and its samples, rendered on first request per format.

    Collection runs every second, Prometheus usually scrapes every 15-60 s: rendering every cycle
    would format pages nobody reads. The first scrape of a cycle pays the render (a few ms, on the
    event loop, so two scrapes never render the same page twice); the rest get the bytes."""

    snapshot: Snapshot
    samples: tuple[Sample, ...]
    renderer: Renderer = field(default_factory=Renderer)
    _rendered: dict[bool, bytes] = field(default_factory=dict)

    @property
    def text(self) -> bytes:
        return self._render(openmetrics=False)

    def openmetrics(self) -> bytes:
        return self._render(openmetrics=True)

    def _render(self, *, openmetrics: bool) -> bytes:
        body = self._rendered.get(openmetrics)
        if body is None:
            body = self._rendered[openmetrics] = self.renderer.render(self.samples, openmetrics=openmetrics)
        return body


_ABSENT: tuple[str, frozenset[str]] = ("", frozenset())


def written_only(samples: Iterable[Sample], written: Mapping[str, tuple[str, frozenset[str]] | None]) -> tuple:
    """The samples a profile writes: of a family it lists, every series or those whose label has one
    of the listed values."""
    out = []
    for sample in samples:
        only = written.get(sample.name, _ABSENT)
        if only is None:
            out.append(sample)
        elif only is not _ABSENT:
            label, values = only
            if any(k == label and v in values for k, v in sample.labels):
                out.append(sample)
    return tuple(out)


def _no_derive(snapshot: Snapshot, previous: Snapshot | None) -> tuple[Sample, ...]:
    return ()


class Collector:
    """Runs the cycles. What the HTTP side may read is the public methods below (published,
    health_view, diagnosis, count_rejected, ready, interval_s); the rest is the loop's own state."""

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        interval_s: float,
        timeouts: dict[str, float] | None = None,
        derive: DeriveFn = _no_derive,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
        extra_health: Callable[[], Iterable[Sample]] | None = None,
        collectors: Mapping[SourceKind, str] | None = None,
        families: Mapping[str, tuple[str, frozenset[str]] | None] | None = None,
        buckets: Rebucketer | None = None,
    ) -> None:
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate source names: {names}")
        self.sources = tuple(sources)
        self.interval_s = interval_s
        # Each source declares its bound (None: the interval); `timeouts` overrides it by name.
        self.timeouts = {s.name: (timeouts or {}).get(s.name, s.timeout_s or interval_s) for s in sources}
        self.derive = derive
        self.clock = clock
        # Windows and rates run on the monotonic clock (exporter/clock.py). A hand-driven `clock`
        # (tests, tools) without its own monotonic one drives both.
        if monotonic is None and clock is time.time:
            monotonic = time.monotonic
        self.clocks = Clocks(clock, monotonic)
        # Self-health of parts outside the loop (the web config reloader), emitted every cycle.
        self.extra_health = extra_health
        # Source kind -> the collector its results count for (exporter/collectors.py BY_KIND); a
        # kind not in it (tests' OTHER sources) counts for none.
        self.collectors = collectors or {}
        self.health = {s.name: SourceHealth() for s in sources}
        # The profile's families (exporter/catalog/profiles.py Selection) by the sample names they
        # write: a profile only decides what /metrics shows, derive and the verdict see every family.
        self.written: dict[str, tuple[str, frozenset[str]] | None] | None = None if families is None else {
            name: only for family, only in families.items() for name in catalog.FAMILIES[family].sample_names()}
        # The engine histograms' buckets as /metrics writes them (exporter/buckets.py); None: as they came.
        self.buckets = buckets
        self.latest: Published | None = None
        self.cycles = 0
        self.scrapes_rejected = 0
        self.renderer = Renderer()
        self._ready = asyncio.Event()
        self._last_cycle_s = 0.0
        self._slots: asyncio.Semaphore | None = None  # made on the loop that runs the cycles
        self.overruns = 0  # cycles that took longer than the interval
        self._overrunning = False
        self._state_lines = 0  # state-change lines logged this cycle
        self._state_unlogged: dict[str, int] = {}  # state -> changes not logged this cycle

    @property
    def ready(self) -> bool:
        return self.latest is not None

    def published(self) -> Published | None:
        """The latest finished cycle (None before the first); immutable once published."""
        return self.latest

    def health_view(self) -> Mapping[str, HealthView]:
        """A copy of the per-source health, taken on the event loop, for a worker thread."""
        return {name: HealthView(h.last_success_ts, dict(h.errors)) for name, h in self.health.items()}

    def diagnosis(self) -> dict[str, Any] | None:
        """The deriver's verdicts for the latest cycle, or None when the deriver gives none."""
        diagnose = getattr(self.derive, "diagnosis", None)
        return None if diagnose is None else diagnose()

    def count_rejected(self) -> None:
        """A /metrics request refused at the concurrency cap (llm_exporter_scrapes_rejected_total)."""
        self.scrapes_rejected += 1

    async def wait_ready(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _collect_source(self, source: Source) -> SourceResult:
        if source.kind not in (SourceKind.ENGINE, SourceKind.ROUTER):
            return await self._collect_now(source)
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_SCRAPES_IN_FLIGHT)
        async with self._slots:
            return await self._collect_now(source)

    async def _collect_now(self, source: Source) -> SourceResult:
        health = self.health[source.name]
        started = time.perf_counter()
        attrs = dict(getattr(source, "attrs", {}) or {})
        if health.in_flight is not None and not health.in_flight.done():
            return self._failed(source, attrs, 0.0, "busy", "previous collection still running")
        task = asyncio.ensure_future(source.collect())
        health.in_flight = task
        timeout = self.timeouts[source.name]
        done, _ = await asyncio.wait({task}, timeout=timeout)
        duration = time.perf_counter() - started
        if not done:
            task.add_done_callback(_consume_result)
            return self._failed(source, attrs, duration, "timeout", f"no answer within {timeout:g}s")
        health.in_flight = None
        # exception(), not result(): re-raising here would add this frame, which holds the task,
        # to the traceback the task holds, a reference cycle.
        error = task.exception()
        if error is not None:
            del task, done
            if not isinstance(error, Exception):
                raise error  # KeyboardInterrupt, SystemExit: not a source failure
            if isinstance(error, SourceError):
                reason, message = error.reason, error.message
            else:  # a source bug must not break the cycle
                log.debug("source %s raised", source.name, exc_info=error)
                reason, message = "exception", f"{type(error).__name__}: {error}"
            release_exception(error)
            return self._failed(source, attrs, duration, reason, message)
        data: SourceData = task.result()
        attrs.update(data.attrs)
        now = self.clock()
        health.last_success_ts = now
        self._log_state(source.name, "ok", "")
        return SourceResult(source.name, True, duration, now, tuple(data.samples),
                            attrs=MappingProxyType(attrs), kind=source.kind, timeout_s=timeout)

    def _failed(self, source: Source, attrs: dict, duration: float, reason: str, message: str) -> SourceResult:
        name = source.name
        health = self.health[name]
        health.errors[reason] = health.errors.get(reason, 0) + 1
        self._log_state(name, reason, message)
        return SourceResult(name, False, duration, self.clock(), (), reason, message,
                            MappingProxyType(attrs), source.kind, self.timeouts[name])

    def _log_state(self, name: str, state: str, message: str) -> None:
        """One line when a source starts failing (or fails another way) and one when it recovers,
        rate-limited per source (logstate.StateLog: a target flipping between timeout and ok every
        cycle is 3 lines a minute, not one a cycle) and bounded per cycle (a summary past
        MAX_STATE_LINES_PER_CYCLE)."""
        health = self.health[name]
        if state == "busy" and health.last_state not in ("", "ok"):
            state = health.last_state  # the collection that failed before is still running: the same outage
        health.last_state = state

        def write(suffix: str) -> None:
            if self._state_lines >= MAX_STATE_LINES_PER_CYCLE:
                key = "recovered" if state == "ok" else state
                self._state_unlogged[key] = self._state_unlogged.get(key, 0) + 1
                return
            self._state_lines += 1
            if state == "ok":
                log.info("source %s recovered%s", name, suffix)
            else:
                log.warning("source %s failing: %s: %s%s", name, state, message, suffix)

        # The first success needs no line: "" -> "ok" is the start, not a recovery.
        health.log.update(name, "" if state == "ok" and not health.ever_failed else state,
                               LOG_SOURCE_STATE, write, initial="")
        health.ever_failed |= state != "ok"

    def _end_state_lines(self) -> None:
        if self._state_unlogged:
            counts = ", ".join(f"{n} {state}" for state, n in sorted(self._state_unlogged.items()))
            log.warning("and %d more sources changed state this cycle (%s): llm_exporter_source_up and "
                        "llm_exporter_collect_errors_total name each", sum(self._state_unlogged.values()), counts)
        self._state_lines, self._state_unlogged = 0, {}

    def _note_overrun(self, took_s: float) -> None:
        """A cycle longer than the interval: counted, and one line when it starts and when it ends."""
        over = took_s > self.interval_s
        self.overruns += over
        if over != self._overrunning:
            self._overrunning = over
            if over:
                engines = sum(1 for s in self.sources if s.kind is SourceKind.ENGINE)
                log.warning("a collection cycle took %.2f s, longer than the %gs interval: cycles are skipped until "
                            "it is shorter (%d sources, %d of them engine targets scraped %d at a time; "
                            "llm_exporter_cycle_overruns_total)", took_s, self.interval_s, len(self.sources),
                            engines, MAX_SCRAPES_IN_FLIGHT)
            else:
                log.info("collection cycles fit the %gs interval again (the last took %.2f s)", self.interval_s, took_s)

    async def collect_once(self) -> Published:
        started = time.perf_counter()
        results = await asyncio.gather(*(self._collect_source(s) for s in self.sources))
        self._end_state_lines()
        wall, steady = self.clocks.read()
        snapshot = Snapshot(wall, MappingProxyType({r.source: r for r in results}), steady_at=steady)
        previous = self.latest.snapshot if self.latest else None
        derived = self._derive(snapshot, previous)
        snapshot = Snapshot(snapshot.taken_at, snapshot.results, derived, steady)
        self.cycles += 1
        samples = (*snapshot.samples(include_derived=True), *self.self_health(snapshot))
        if self.written is not None:
            samples = written_only(samples, self.written)
        if self.buckets is not None:  # after the filter: derive and the verdict read the engine's layout
            samples = self.buckets.apply(samples)
            health = tuple(self.buckets.health())
            samples = (*samples, *(health if self.written is None else written_only(health, self.written)))
        published = Published(snapshot, tuple(samples), self.renderer)
        self.latest = published
        self._last_cycle_s = time.perf_counter() - started
        self._note_overrun(self._last_cycle_s)
        self._ready.set()
        return published

    def _derive(self, snapshot: Snapshot, previous: Snapshot | None) -> tuple[Sample, ...]:
        try:
            return tuple(self.derive(snapshot, previous))
        except Exception:  # noqa: BLE001 - derive isolates its own families; this is the last guard
            log.exception("derive failed; serving source samples only")
            return ()

    def self_health(self, snapshot: Snapshot) -> list[Sample]:
        out = [
            Sample("llm_exporter_build_info", labels_of(version=__version__, python=platform.python_version()), 1.0),
            Sample("llm_exporter_collections_total", (), float(self.cycles)),
            Sample("llm_exporter_cycle_duration_seconds", (), self._last_cycle_s),
            Sample("llm_exporter_scrapes_rejected_total", (), float(self.scrapes_rejected)),
            Sample("llm_exporter_cycle_overruns_total", (), float(self.overruns)),
            Sample("llm_exporter_clock_steps_total", (), float(self.clocks.steps)),
            Sample("llm_exporter_clock_offset_seconds", (), self.clocks.offset_s),
        ]
        for name, result in snapshot.results.items():
            source = labels_of(source=name)
            health = self.health[name]
            out.append(Sample("llm_exporter_source_up", source, 1.0 if result.ok else 0.0))
            out.append(Sample("llm_exporter_collect_duration_seconds", source, result.duration_s))
            if health.last_success_ts is not None:
                out.append(Sample("llm_exporter_last_success_timestamp_seconds", source, health.last_success_ts))
            for reason, count in health.log.suppressed.items():
                out.append(Sample("llm_exporter_log_lines_suppressed_total", labels_of(source=name, reason=reason),
                                  float(count)))
            for reason, count in sorted(health.errors.items()):
                out.append(Sample("llm_exporter_collect_errors_total", labels_of(source=name, reason=reason),
                                  float(count)))
            out.extend(_engine_up(result))
        out.extend(self._collector_health(snapshot))
        if self.extra_health is not None:
            out.extend(self.extra_health())
        return out

    def _collector_health(self, snapshot: Snapshot) -> list[Sample]:
        """node_exporter's scrape_collector_success and _duration_seconds, per collector that built
        sources: success when every one of its sources succeeded this cycle (an engine target down
        makes the engine collector's 0; llm_engine_up says which), and its duration the longest of
        its sources' (they run concurrently: the wall time the collector took)."""
        grouped: dict[str, list[SourceResult]] = {}
        for result in snapshot.results.values():
            collector = self.collectors.get(result.kind)
            if collector is not None:
                grouped.setdefault(collector, []).append(result)
        out = []
        for collector, results in sorted(grouped.items()):
            labels = labels_of(collector=collector)
            out.append(Sample("llm_exporter_collector_success", labels, float(all(r.ok for r in results))))
            out.append(Sample("llm_exporter_collector_duration_seconds", labels, max(r.duration_s for r in results)))
        return out

    async def run_forever(self) -> None:
        """Cycles start on a fixed grid; a slow cycle skips ticks instead of bunching up."""
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            await self.collect_once()
            next_tick += self.interval_s
            now = loop.time()
            if next_tick < now:
                next_tick = now + self.interval_s - ((now - next_tick) % self.interval_s)
            await asyncio.sleep(next_tick - now)

    async def close(self) -> None:
        for source in self.sources:
            try:
                await source.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                log.debug("closing %s failed", source.name, exc_info=True)


def _engine_up(result: SourceResult) -> list[Sample]:
    """`llm_engine_up{target,engine}` for engine sources, `llm_router_up{target,router}` for router
    sources, 0 on failure (with the last known kind)."""
    if result.kind is SourceKind.ROUTER:
        labels = labels_of(target=result.attrs.get("target", result.source),
                           router=result.attrs.get("router", "unknown"))
        return [Sample("llm_router_up", labels, 1.0 if result.ok else 0.0)]
    if result.kind is not SourceKind.ENGINE:
        return []
    labels = labels_of(target=result.attrs.get("target", result.source),
                       engine=result.attrs.get("engine", "unknown"))
    return [Sample("llm_engine_up", labels, 1.0 if result.ok else 0.0)]


def _consume_result(task: asyncio.Task) -> None:
    # A late result is discarded; retrieving the exception keeps asyncio from logging it. The
    # task stays in SourceHealth.in_flight until the next cycle, so its exception is released now.
    if not task.cancelled() and (error := task.exception()) is not None:
        release_exception(error)


def release_exception(error: BaseException) -> None:
    """Free what a caught exception keeps alive, without the cyclic GC.

    A failed collection's traceback holds every frame from the source's collect() down to where
    it raised, with their locals: a body read up to the payload cap, a decompressor and its
    output, a page that failed to decode. Its __context__ holds more (a UnicodeDecodeError holds
    the whole undecodable body). Through those frames (asyncio.timeout's state, a caller's local)
    the task that holds the exception is often reachable again: a reference cycle, which only the
    cyclic GC frees, and app.tune_gc makes that rare (seen: 2.8 GB of failed scrapes). The message
    and reason have been taken; the frames of the whole chain are cleared and the chain cut."""
    pending, seen = [error], set()
    while pending:
        exc = pending.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # a frame still running is left as it is
        pending.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        exc.__traceback__ = exc.__cause__ = exc.__context__ = None
