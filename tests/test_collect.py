"""The collection loop: snapshots, self-health, failed sources dropped, hung sources bounded."""

from __future__ import annotations

import asyncio
import threading

import pytest

from exporter.collect import Collector
from exporter.expose import Renderer
from exporter.snapshot import Sample, labels_of
from exporter.sources.base import SourceData, SourceError, SourceKind


class ScriptedSource:
    """A source whose next outcome the test sets: samples, a SourceError, a crash or a hang."""

    def __init__(self, name: str, value: float = 1.0, *, kind: SourceKind = SourceKind.OTHER,
                 timeout_s: float | None = None) -> None:
        self.name = name
        self.kind = kind
        self.timeout_s = timeout_s
        self.attrs: dict[str, str] = {}
        self.value = value
        self.fail: Exception | None = None
        self.hang: asyncio.Event | None = None
        self.calls = 0

    async def collect(self) -> SourceData:
        self.calls += 1
        if self.hang is not None:
            await self.hang.wait()
        if self.fail is not None:
            raise self.fail
        return SourceData((Sample("llm_requests_running", labels_of(target=self.name), self.value),))

    async def close(self) -> None:
        return


def _values(published, name):
    return {s.labels: s.value for s in published.samples if s.name == name}


def test_snapshot_holds_every_source_and_self_health():
    async def scenario():
        a, b = ScriptedSource("a", 3), ScriptedSource("b", 5)
        collector = Collector([a, b], interval_s=1.0, clock=lambda: 1000.0)
        published = await collector.collect_once()
        running = _values(published, "llm_requests_running")
        assert running == {labels_of(target="a"): 3, labels_of(target="b"): 5}
        up = _values(published, "llm_exporter_source_up")
        assert up == {labels_of(source="a"): 1.0, labels_of(source="b"): 1.0}
        assert _values(published, "llm_exporter_last_success_timestamp_seconds")[labels_of(source="a")] == 1000.0
        assert b"llm_requests_running{target=\"a\"} 3.0" in published.text
    asyncio.run(scenario())


def test_failed_source_series_are_dropped_not_served_stale():
    async def scenario():
        good, bad = ScriptedSource("good"), ScriptedSource("bad", 7)
        collector = Collector([good, bad], interval_s=1.0)
        await collector.collect_once()
        bad.fail = SourceError("connection", "refused")
        published = await collector.collect_once()
        assert labels_of(target="bad") not in _values(published, "llm_requests_running")
        assert labels_of(target="good") in _values(published, "llm_requests_running")
        assert _values(published, "llm_exporter_source_up")[labels_of(source="bad")] == 0.0
        errors = _values(published, "llm_exporter_collect_errors_total")
        assert errors == {labels_of(source="bad", reason="connection"): 1.0}
        # The success timestamp stays at the last success instead of vanishing or going to 0.
        assert labels_of(source="bad") in _values(published, "llm_exporter_last_success_timestamp_seconds")
    asyncio.run(scenario())


def test_success_timestamp_absent_before_first_success():
    async def scenario():
        source = ScriptedSource("s")
        source.fail = SourceError("timeout", "slow")
        published = await Collector([source], interval_s=1.0).collect_once()
        assert _values(published, "llm_exporter_last_success_timestamp_seconds") == {}
    asyncio.run(scenario())


def test_a_crashing_source_is_counted_and_others_survive():
    async def scenario():
        ok, broken = ScriptedSource("ok"), ScriptedSource("broken")
        broken.fail = ZeroDivisionError("bug")
        published = await Collector([ok, broken], interval_s=1.0).collect_once()
        assert _values(published, "llm_exporter_collect_errors_total") == {
            labels_of(source="broken", reason="exception"): 1.0}
        assert labels_of(target="ok") in _values(published, "llm_requests_running")
    asyncio.run(scenario())


def test_hung_source_times_out_and_is_not_called_again_while_running():
    async def scenario():
        fast, hung = ScriptedSource("fast"), ScriptedSource("hung")
        hung.hang = asyncio.Event()
        hung.timeout_s = 0.05
        collector = Collector([fast, hung], interval_s=1.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = await collector.collect_once()
        second = await collector.collect_once()
        elapsed = loop.time() - started
        assert elapsed < 1.0  # two cycles bounded by the 50 ms timeout, not by the hang
        assert hung.calls == 1  # the second cycle did not start another call
        errors = _values(second, "llm_exporter_collect_errors_total")
        assert errors[labels_of(source="hung", reason="timeout")] == 1.0
        assert errors[labels_of(source="hung", reason="busy")] == 1.0
        assert labels_of(target="fast") in _values(first, "llm_requests_running")
        hung.hang.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        third = await collector.collect_once()
        assert hung.calls == 2
        assert _values(third, "llm_exporter_source_up")[labels_of(source="hung")] == 1.0
    asyncio.run(scenario())


def test_blocking_thread_source_cannot_pile_up_threads():
    release = threading.Event()

    class ThreadSource(ScriptedSource):
        async def collect(self) -> SourceData:
            self.calls += 1
            await asyncio.to_thread(release.wait, 5)
            return await super().collect()

    async def scenario():
        source = ThreadSource("nvml", timeout_s=0.02)
        collector = Collector([source], interval_s=1.0)
        for _ in range(5):
            await collector.collect_once()
        assert source.calls == 1
        release.set()
    asyncio.run(scenario())


def test_one_log_line_per_state_change(caplog: pytest.LogCaptureFixture):
    async def scenario():
        source = ScriptedSource("flappy")
        collector = Collector([source], interval_s=1.0)
        source.fail = SourceError("connection", "refused")
        for _ in range(3):
            await collector.collect_once()
        source.fail = None
        for _ in range(3):
            await collector.collect_once()
    caplog.set_level("INFO", logger="llm_exporter.collect")
    asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records if r.name == "llm_exporter.collect"]
    assert messages == ["source flappy failing: connection: refused", "source flappy recovered"]


def test_a_source_slower_than_its_timeout_logs_one_line_not_one_per_cycle(caplog: pytest.LogCaptureFixture):
    class SlowSource(ScriptedSource):
        """Answers each call only when the test releases it: timeout, then busy while it runs on."""

        def __init__(self, name: str) -> None:
            super().__init__(name)
            self.releases: list[asyncio.Event] = []

        async def collect(self) -> SourceData:
            self.releases.append(asyncio.Event())
            await self.releases[-1].wait()
            return await super().collect()

    async def scenario():
        source = SlowSource("slow")
        collector = Collector([source], interval_s=1.0, timeouts={"slow": 0.02})
        for _ in range(4):  # timeout, busy, (released) timeout, busy
            await collector.collect_once()
            await collector.collect_once()
            source.releases[-1].set()
            await asyncio.sleep(0)
        return collector
    caplog.set_level("INFO", logger="llm_exporter.collect")
    collector = asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records if r.name == "llm_exporter.collect"]
    assert messages == ["source slow failing: timeout: no answer within 0.02s"], messages
    assert collector.health["slow"].errors == {"timeout": 4, "busy": 4}


def test_derive_failure_keeps_source_samples():
    def broken_derive(snapshot, previous):
        raise RuntimeError("bad formula")

    async def scenario():
        published = await Collector([ScriptedSource("a")], interval_s=1.0, derive=broken_derive).collect_once()
        assert labels_of(target="a") in _values(published, "llm_requests_running")
    asyncio.run(scenario())


def test_derive_sees_previous_snapshot():
    seen = []

    def derive(snapshot, previous):
        seen.append(previous)
        return (Sample("llm_requests_waiting", labels_of(target="derived"), 1.0),)

    async def scenario():
        collector = Collector([ScriptedSource("a")], interval_s=1.0, derive=derive)
        first = await collector.collect_once()
        second = await collector.collect_once()
        assert seen[0] is None and seen[1] is first.snapshot
        assert _values(second, "llm_requests_waiting") == {labels_of(target="derived"): 1.0}
    asyncio.run(scenario())


def test_openmetrics_rendering_ends_with_eof():
    async def scenario():
        published = await Collector([ScriptedSource("a")], interval_s=1.0).collect_once()
        body = published.openmetrics()
        assert body.endswith(b"# EOF\n")
        assert b"# TYPE llm_exporter_collections counter" in body
        assert published.openmetrics() is body  # rendered once
    asyncio.run(scenario())


def test_a_cycle_is_rendered_only_when_asked_and_only_once_per_format():
    async def scenario():
        renders: list[bool] = []

        class CountingRenderer(Renderer):
            __slots__ = ()

            def render(self, samples, *, openmetrics=False):
                renders.append(openmetrics)
                return super().render(samples, openmetrics=openmetrics)

        collector = Collector([ScriptedSource("a", 3)], interval_s=1.0)
        collector.renderer = CountingRenderer()
        await collector.collect_once()
        await collector.collect_once()
        assert renders == []  # nobody scraped: nothing formatted
        published = collector.latest
        assert published.text is published.text and b"# EOF" in published.openmetrics()  # cached, not rebuilt
        assert published.openmetrics().endswith(b"# EOF\n")
        assert renders == [False, True]
    asyncio.run(scenario())


def test_each_source_is_bounded_by_the_timeout_it_declares():
    """The bound comes from the source (EngineSource: its target's timeout), not from a table the
    app keeps beside it; the collector's `timeouts` still overrides it by name."""
    async def scenario():
        declared, overridden, default = (ScriptedSource("declared", timeout_s=0.05),
                                         ScriptedSource("overridden", timeout_s=30.0), ScriptedSource("default"))
        for source in (declared, overridden, default):
            source.hang = asyncio.Event()
        collector = Collector([declared, overridden, default], interval_s=0.3, timeouts={"overridden": 0.1})
        published = await asyncio.wait_for(collector.collect_once(), timeout=5)
        results = published.snapshot.results
        assert {name: r.timeout_s for name, r in results.items()} == {
            "declared": 0.05, "overridden": 0.1, "default": 0.3}
        assert all(r.error_reason == "timeout" for r in results.values())
        for source in (declared, overridden, default):
            source.hang.set()
    asyncio.run(scenario())


def test_engine_up_follows_the_declared_kind_not_the_name_or_attrs():
    """llm_engine_up is for sources of kind ENGINE: a source named like an engine, or whose attrs
    say "engine", is not one; an engine source is, whatever its name. Results carry the kind."""
    async def scenario():
        engine = ScriptedSource("scraper-1", kind=SourceKind.ENGINE)
        engine.attrs = {"target": "t1", "engine": "vllm"}
        lookalike = ScriptedSource("engine:fake")
        lookalike.attrs = {"kind": "engine", "target": "fake"}
        published = await Collector([engine, lookalike], interval_s=1.0).collect_once()
        assert _values(published, "llm_engine_up") == {labels_of(target="t1", engine="vllm"): 1.0}
        kinds = {name: r.kind for name, r in published.snapshot.results.items()}
        assert kinds == {"scraper-1": SourceKind.ENGINE, "engine:fake": SourceKind.OTHER}
    asyncio.run(scenario())
