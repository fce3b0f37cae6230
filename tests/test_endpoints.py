"""The HTTP server over a real socket: formats, readiness, the scrape cap, the JSON snapshot."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from exporter.collect import Collector
from exporter.config import Config
from exporter.endpoints import MetricsEndpoint, create_app
from tests.exporter_process import running_exporter
from tests.test_collect import ScriptedSource

CONFIG = Config(listen_host="127.0.0.1", listen_port=0, interval_s=0.2, gpu_backend="none", host_enabled=False)


def test_metrics_text_and_openmetrics_and_json():
    with running_exporter(CONFIG, [ScriptedSource("a", 4)]) as base:
        text = httpx.get(base + "/metrics", timeout=5)
        assert text.status_code == 200
        assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
        names = {s.name for f in text_string_to_metric_families(text.text) for s in f.samples}
        assert {"llm_requests_running", "llm_exporter_source_up", "llm_exporter_collections_total"} <= names

        om = httpx.get(base + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5)
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        om_names = {s.name for f in parse_openmetrics(om.text) for s in f.samples}
        assert "llm_exporter_collections_total" in om_names

        snapshot = httpx.get(base + "/api/v1/snapshot", timeout=5).json()
        assert snapshot["ready"] is True
        assert snapshot["sources"]["a"]["ok"] is True
        assert snapshot["sources"]["a"]["samples"][0]["value"] == 4
        assert httpx.get(base + "/healthz", timeout=5).text == "ok\n"
        refused = httpx.post(base + "/metrics", timeout=5)
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
        for path in ("/metrics", "/healthz", "/readyz", "/api/v1/snapshot", "/api/v1/diagnosis", "/"):
            head, get = httpx.head(base + path, timeout=5), httpx.get(base + path, timeout=5)
            assert head.status_code == 200 and head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
        assert httpx.get(base + "/nope", timeout=5).status_code == 404
        refused = httpx.post(base + "/readyz", timeout=5)
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"


PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                     "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
                     "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")


def test_accept_header_negotiation_honours_quality_and_case():
    from exporter.endpoints import _wants_openmetrics

    assert _wants_openmetrics(PROMETHEUS_ACCEPT)
    assert _wants_openmetrics("Application/OpenMetrics-Text; version=1.0.0")
    assert _wants_openmetrics("text/plain, application/openmetrics-text")  # a tie goes to OpenMetrics
    assert not _wants_openmetrics("application/openmetrics-text;q=0, text/plain")
    assert not _wants_openmetrics("text/plain;q=0.9, application/openmetrics-text;q=0.5")
    assert not _wants_openmetrics("application/openmetrics-text;q=oops")
    assert not _wants_openmetrics("")
    assert not _wants_openmetrics("*/*")


def test_readyz_is_503_before_first_collection_and_metrics_too():
    collector = Collector([ScriptedSource("a")], interval_s=1.0)
    endpoint = create_app(collector)
    transport = httpx.ASGITransport(app=endpoint)

    async def scenario():
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/metrics")).status_code == 503
            assert (await client.get("/api/v1/snapshot")).json() == {"ready": False, "sources": {}}
            assert (await client.get("/api/v1/diagnosis")).json()["ready"] is False
            assert (await client.get("/")).status_code == 200
            await collector.collect_once()
            assert (await client.get("/readyz")).status_code == 200
            assert (await client.get("/metrics")).status_code == 200
    asyncio.run(scenario())


def test_scrape_cap_answers_503_fast_and_counts_it():
    collector = Collector([ScriptedSource("a")], interval_s=1.0)
    endpoint: MetricsEndpoint = create_app(collector, max_concurrent_scrapes=1)

    async def scenario():
        await collector.collect_once()
        endpoint.in_flight = 1  # one scrape is being answered
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await endpoint({"type": "http", "path": "/metrics", "method": "GET", "headers": []}, None, send)
        assert sent[0]["status"] == 503
        assert collector.scrapes_rejected == 1
        published = await collector.collect_once()
        assert b"llm_exporter_scrapes_rejected_total 1.0" in published.text
    asyncio.run(scenario())
