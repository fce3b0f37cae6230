"""Bad engine input: each failure gives llm_engine_up 0 with a reason; other sources keep flowing."""

from __future__ import annotations

import asyncio
import gc
import pathlib

import pytest

from exporter.collect import Collector
from exporter.sources.engines.scrape import EngineSource
from exporter.targets import EngineTarget
from tests.support import fake_engine, free_port
from tests.test_collect import ScriptedSource
from tests.test_http_client import offline_resolver

VLLM = (pathlib.Path(__file__).parent / "fixtures" / "engines" / "vllm-v0.11__documented.prom").read_bytes()


def _collect(url: str, *, timeout: float = 0.5, cap: int = 1 << 20, kind: str | None = None):
    source = EngineSource(EngineTarget(url=url, name="t", kind=kind, timeout_s=timeout),
                          max_payload_bytes=cap, max_series=10_000)
    other = ScriptedSource("other")

    async def scenario():
        collector = Collector([source, other], interval_s=1.0, timeouts={source.name: timeout + 0.5})
        published = await collector.collect_once()
        await collector.close()
        return published
    return asyncio.run(scenario())


def _value(published, name, **labels):
    matches = [s.value for s in published.samples if s.name == name and all(s.label(k) == v for k, v in labels.items())]
    return matches[0] if matches else None


@pytest.mark.parametrize("body, status, reason", [
    (b"<html><body>502 Bad Gateway</body></html>", 200, "parse"),
    (VLLM[: len(VLLM) // 2] + b'vllm:num_requests_running{model_name="x', 200, "parse"),
    (bytes(range(256)) * 10, 200, "parse"),
    (b"internal error", 500, "http_status"),
    (b"# just comments\n", 200, "unknown_engine"),
])
def test_bad_payloads_mark_the_target_down_with_a_reason(body, status, reason):
    with fake_engine(body, status=status) as (url, _):
        published = _collect(url)
    assert _value(published, "llm_engine_up", target="t") == 0.0
    assert _value(published, "llm_exporter_collect_errors_total", source="engine:t", reason=reason) == 1.0
    assert _value(published, "llm_requests_running", target="other") == 1.0  # the rest is intact
    assert not any(s.label("target") == "t" and s.name.startswith("llm_time") for s in published.samples)


def test_connection_refused():
    published = _collect(f"http://127.0.0.1:{free_port()}/metrics")
    assert _value(published, "llm_exporter_collect_errors_total", source="engine:t", reason="connection") == 1.0
    assert _value(published, "llm_engine_up", target="t") == 0.0


def test_a_host_that_does_not_resolve_is_reason_dns(monkeypatch):
    offline_resolver(monkeypatch)
    published = _collect("http://no-such-host.invalid:9/metrics")
    assert _value(published, "llm_exporter_collect_errors_total", source="engine:t", reason="dns") == 1.0
    assert _value(published, "llm_engine_up", target="t") == 0.0
    result = published.snapshot.results["engine:t"]
    assert "Name or service not known" in result.error_message


def test_timeout():
    with fake_engine(VLLM, delay_s=2) as (url, _):
        published = _collect(url, timeout=0.2)
    assert _value(published, "llm_exporter_collect_errors_total", source="engine:t", reason="timeout") == 1.0


def test_payload_over_the_cap_is_refused():
    big = VLLM * 200  # a few MB
    with fake_engine(big) as (url, _):
        published = _collect(url, cap=64 * 1024)
    assert _value(published, "llm_exporter_collect_errors_total", source="engine:t", reason="too_large") == 1.0


def test_good_payload_after_bad_recovers_and_keeps_the_kind():
    with fake_engine(VLLM) as (url, behaviour):
        source = EngineSource(EngineTarget(url=url, name="t"), max_payload_bytes=1 << 20, max_series=10_000)

        async def scenario():
            collector = Collector([source], interval_s=1.0)
            first = await collector.collect_once()
            behaviour.status = 503
            second = await collector.collect_once()
            behaviour.status = 200
            third = await collector.collect_once()
            await collector.close()
            return first, second, third
        first, second, third = asyncio.run(scenario())
    assert _value(first, "llm_engine_up", target="t", engine="vllm") == 1.0
    assert _value(second, "llm_engine_up", target="t", engine="vllm") == 0.0  # last known kind kept
    assert _value(third, "llm_engine_up", target="t", engine="vllm") == 1.0
    assert _value(third, "llm_exporter_collect_errors_total", source="engine:t", reason="http_status") == 1.0


def test_duplicate_series_and_nan_do_not_fail_the_target():
    body = (b"# TYPE vllm:num_requests_running gauge\n"
            b'vllm:num_requests_running{model_name="m",engine="0"} 3\n'
            b'vllm:num_requests_running{model_name="m",engine="0"} 3\n'
            b"# TYPE vllm:num_requests_waiting gauge\n"
            b'vllm:num_requests_waiting{model_name="m",engine="0"} NaN\n'
            b"# TYPE vllm:kv_cache_usage_perc gauge\n"
            b'vllm:kv_cache_usage_perc{model_name="m",engine="0"} +Inf\n')
    with fake_engine(body) as (url, _):
        published = _collect(url)
    assert _value(published, "llm_engine_up", target="t") == 1.0
    running = [s for s in published.samples if s.name == "llm_requests_running" and s.label("target") == "t"]
    assert len(running) == 1 and running[0].value == 3.0
    assert _value(published, "llm_requests_waiting", target="t") is None  # NaN dropped, not passed on
    assert _value(published, "llm_kv_cache_usage_ratio", target="t") is None


def test_the_scrape_sends_an_accept_header_and_never_follows_redirects():
    page = b'vllm:num_requests_running{model_name="m"} 1\n'
    with fake_engine(page) as (elsewhere, elsewhere_seen), \
            fake_engine(b"", status=302, headers={"Location": elsewhere}) as (url, behaviour):
        published = _collect(url)
    assert _value(published, "llm_exporter_collect_errors_total", source="engine:t", reason="http_status") == 1.0
    assert "text/plain" in behaviour.headers_seen[0]["Accept"]
    assert behaviour.requests == 1 and elsewhere_seen.requests == 0  # the Location was not followed


def _bomb(n: int) -> bytes:
    return "".join(f'vllm:num_requests_running{{model_name="m",request_id="{i:08x}"}} 1\n'
                   for i in range(n)).encode()


def test_only_cheap_unchanged_pages_are_normalized_on_the_event_loop(monkeypatch):
    """A warm page of the usual size is replayed on the loop, skipping the thread handoff; a page
    needing the full pass, a page that grew, and a page that was slow to normalize (a cardinality
    bomb) go to a worker thread."""
    import exporter.sources.engines.scrape as scrape

    offloaded: list[int] = []
    real_to_thread = asyncio.to_thread

    async def counting_to_thread(fn, *args, **kwargs):
        offloaded.append(len(args[0]))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(scrape.asyncio, "to_thread", counting_to_thread)
    # A budget no machine misses for this page (and every machine misses for 20,000 new series).
    monkeypatch.setattr(scrape, "INLINE_MAX_CPU_S", 0.05)
    with fake_engine(VLLM) as (url, behaviour):
        source = EngineSource(EngineTarget(url=url, name="t", timeout_s=5), max_payload_bytes=8 << 20,
                              max_series=100_000)

        async def collect_pages(bodies):
            for body in bodies:
                behaviour.body = body
                await source.collect()
            await source.close()

        bomb = _bomb(20_000)
        grown = VLLM + b"# padding\n" * 2000
        # A cyclic GC pass inside one normalize counts in its thread CPU time and could push a warm
        # page past the budget (seen once in a full run): the pages are judged without it.
        gc.disable()
        try:
            asyncio.run(collect_pages([VLLM] * 6 + [grown] + [VLLM] * 4 + [bomb, bomb]))
        finally:
            gc.enable()
    # The first page (nothing known yet), the second (tried on the loop, but no plan is recorded
    # before a page repeats), the grown one, and both bombs (grown, then slow). The page after the
    # grown one replays on the loop: the padding was comments, so the plan still fits.
    assert offloaded == [len(VLLM), len(VLLM), len(grown), len(bomb), len(bomb)]
    assert not source.normalize_inline(len(bomb))  # its last normalize took far more than the budget
