"""The router tables and their normalizer (exporter/sources/routers/), on captured and source-written
pages; the routing verdict's rule (bottleneck.py); --router's configuration. The real routers, the real
exporter and real Prometheus are in tests/test_routers_live.py."""

from __future__ import annotations

import csv
import pathlib
import tracemalloc

import pytest

from exporter.config import ConfigError, build_config
from exporter.derive.bottleneck import Signals, assess, raw_verdict, scores
from exporter.derive.routing import join_key
from exporter.sources.engines.accounting import unaccounted
from exporter.sources.routers import coverage
from exporter.sources.routers.normalize import MAX_BACKEND_CHARS, MAX_BACKENDS, backend_name, normalize
from exporter.sources.routers.registry import SPECS, detect_kind

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "routers"
INVENTORIES = {"vllm-router": "vllm-router", "sglang-router": "sglang-router", "dynamo": "dynamo-frontend",
               "epp": "gateway-api-inference-extension"}


def _inventory(kind: str) -> list[dict[str, str]]:
    with open(FIXTURES / f"{INVENTORIES[kind]}.families.tsv") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _samples(page: str, kind: str | None = None) -> dict[tuple[str, tuple], float]:
    scrape = normalize(page, target="r", kind=kind, max_series=100_000)
    return {(s.name, s.labels): s.value for s in scrape.samples}


@pytest.mark.parametrize("kind", sorted(INVENTORIES))
def test_every_family_the_router_defines_is_mapped_or_ignored(kind):
    """The inventory is every family the release's metric-defining source registers (read from the
    source; tests/fixtures/routers/README.md)."""
    rows = _inventory(kind)
    assert len(rows) >= 30
    spec = SPECS[kind]
    missing = [r["family"] for r in rows if spec.accounting.state_of(r["family"]) == "unaccounted"]
    assert missing == []


def test_the_inventories_are_checked_against_a_planted_family():
    # The check above fails on a family no table knows: a new release's name.
    assert SPECS["vllm-router"].accounting.state_of("vllm_router_brand_new_total") == "unaccounted"


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.prom")))
def test_captured_pages_are_fully_accounted_and_detected(fixture):
    page = (FIXTURES / fixture).read_text()
    kind = detect_kind(page)
    assert kind is not None and fixture.startswith(kind)
    assert unaccounted(SPECS[kind].accounting, page) == []
    scrape = normalize(page, target="r", kind=None, max_series=100_000)
    assert scrape.families.unaccounted == 0 and scrape.families.mapped >= 5


def test_vllm_router_page_with_a_killed_backend():
    """Captured from vllm-router 0.1.17 in front of two twins, round robin, the second killed after 13
    requests: its retries and breaker failures are on the page."""
    got = _samples((FIXTURES / "vllm-router-0.1.17__kill.prom").read_text())
    base = (("router", "vllm-router"), ("target", "r"))

    def one(name, **labels):
        return got[(name, tuple(sorted((*base, *labels.items()))))]

    assert one("llm_router_backend_requests_total", backend="127.0.0.1:18001") == 10
    assert one("llm_router_backend_requests_total", backend="127.0.0.1:18002") == 9
    assert one("llm_router_backend_errors_total", backend="127.0.0.1:18002") == 6
    assert ("llm_router_backend_errors_total", tuple(sorted((*base, ("backend", "127.0.0.1:18001"))))) not in got
    assert one("llm_router_retries_total") == 6
    assert one("llm_router_requests_total") == 13
    assert one("llm_router_backend_breaker_state", backend="127.0.0.1:18002", state="closed") == 1
    assert one("llm_router_backend_breaker_state", backend="127.0.0.1:18002", state="open") == 0
    assert one("llm_router_request_duration_seconds_count") == 13
    assert one("llm_router_request_duration_seconds_bucket", le="+Inf") == 13
    assert normalize((FIXTURES / "vllm-router-0.1.17__kill.prom").read_text(), target="r", kind=None,
                     max_series=1000).policy == "round_robin"


def test_breaker_states_and_tombstones():
    page = "\n".join([
        'smg_worker_cb_state{worker="http://a:1"} 1', 'smg_worker_cb_state{worker="http://b:2"} 2',
        'smg_worker_cb_state{worker="http://gone:3"} -1', 'smg_worker_health{worker="http://gone:3"} -1',
        'smg_worker_health{worker="http://a:1"} 0', 'smg_router_requests_total{model="m"} 5', ""])
    scrape = normalize(page, target="r", kind=None, max_series=1000)
    got = {(s.name, dict(s.labels).get("backend"), dict(s.labels).get("state")): s.value for s in scrape.samples}
    assert got[("llm_router_backend_breaker_state", "a:1", "open")] == 1
    assert got[("llm_router_backend_breaker_state", "a:1", "closed")] == 0
    assert got[("llm_router_backend_breaker_state", "b:2", "half_open")] == 1
    assert got[("llm_router_backend_up", "a:1", None)] == 0
    # A removed backend's -1 is neither a state nor an error: it is left out, and nothing is dropped.
    assert not any(backend == "gone:3" for _, backend, _ in got)
    assert scrape.dropped == {}


def test_error_causes_are_mapped_and_bounded():
    page = "\n".join([
        'vllm_router_request_errors_total{route="/v1/completions",error_type="no_available_workers"} 3',
        'vllm_router_request_errors_total{route="/v1/chat/completions",error_type="no_available_workers"} 2',
        'vllm_router_request_errors_total{route="/v1/completions",error_type="request_failed"} 4',
        'vllm_router_request_errors_total{route="/v1/completions",error_type="' + "x" * 500 + '"} 1', ""])
    got = {dict(s.labels)["cause"]: s.value for s in normalize(page, target="r", kind=None, max_series=100).samples}
    assert got == {"no_backend": 5, "backend": 4, "other": 1}


def test_source_written_pages_of_routers_that_do_not_run_here():
    """Dynamo's frontend and the endpoint picker need GPUs or a cluster: a page with one sample of each
    family of their inventory (their own label names) is read without unaccounted families, and fills
    the families their tables map."""
    for kind, wanted in (("dynamo", {"llm_router_requests_total", "llm_router_time_to_first_token_seconds_count",
                                     "llm_router_requests_active", "llm_router_errors_total"}),
                         ("epp", {"llm_router_requests_total", "llm_router_backend_requests_total",
                                  "llm_router_time_to_first_token_seconds_count", "llm_router_errors_total",
                                  "llm_router_backends"})):
        lines = []
        for row in _inventory(kind):
            name, type_ = row["family"], row["type"].split()[0].rstrip("?").split("/")[0]
            labels = {"model": "m", "status": "success" if kind == "epp" else "error", "error_type": "timeout",
                      "error_code": "ModelServerError",
                      "pod_name": "pod-1", "namespace": "ns", "worker_id": "w1", "model_name": "m",
                      "target_model_name": "m", "name": "pool"}
            text = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
            if type_ == "histogram":
                lines += [f'{name}_bucket{{le="0.5",{text[1:]} 1', f'{name}_bucket{{le="+Inf",{text[1:]} 2',
                          f"{name}_sum{text} 1.5", f"{name}_count{text} 2"]
            else:
                lines.append(f"{name}{text} 2")
        page = "\n".join(lines) + "\n"
        assert detect_kind(page) == kind
        scrape = normalize(page, target="r", kind=None, max_series=100_000)
        assert scrape.families.unaccounted == 0, scrape.families.names
        names = {s.name for s in scrape.samples}
        assert wanted <= names, wanted - names


def test_backend_names():
    assert backend_name("http://user:secret@10.0.0.1:8000/v1") == "10.0.0.1:8000"
    assert backend_name("https://[fd00::1]:8443") == "[fd00::1]:8443"
    assert backend_name("pod-7") == "pod-7"
    assert backend_name('bad"\\\n' + "y" * 500) == "bad" + "y" * (MAX_BACKEND_CHARS - 3)
    assert join_key("localhost:8000") == join_key("127.0.0.1:8000") != join_key("127.0.0.1:8001")


def test_a_hostile_page_is_bounded_in_backends_label_bytes_and_memory():
    """A router page of 10,000 series (the default max_series_per_target) naming 10,000 made-up backends,
    500 of them with 4 KB names: at most MAX_BACKENDS backends and MAX_BACKEND_CHARS characters each are
    kept, the rest counted as dropped, and the pass's memory stays a small multiple of the page's own."""
    page = "".join(f'vllm_router_processed_requests_total{{worker="http://h{i}-{"z" * 4000}:1"}} 1\n'
                   for i in range(500))
    page += "".join(f'vllm_router_worker_health{{worker="http://w{i}:1"}} 1\n' for i in range(9_500))
    tracemalloc.start()
    try:
        scrape = normalize(page, target="r", kind=None, max_series=10_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    backends = {dict(s.labels)["backend"] for s in scrape.samples if "backend" in dict(s.labels)}
    assert len(backends) == MAX_BACKENDS
    assert max(map(len, backends)) <= MAX_BACKEND_CHARS
    assert scrape.dropped["cardinality"] == 10_000 - MAX_BACKENDS + 1  # + the page at the series cap
    assert peak < 4 * len(page) + (16 << 20), (peak, len(page))


def test_docs_routers_md_is_current():
    assert (ROOT / "docs" / "routers.md").read_text() == coverage.render()


def test_router_configuration():
    config = build_config({"engines": ["http://127.0.0.1:8000/metrics"],
                           "routers": ["http://127.0.0.1:29000/metrics,kind=vllm-router,name=gw"]}, {})
    assert [(r.name, r.kind) for r in config.routers] == [("gw", "vllm-router")]
    with pytest.raises(ConfigError, match="router.kind"):
        build_config({"routers": ["http://127.0.0.1:29000/metrics,kind=vllm"]}, {})
    with pytest.raises(ConfigError, match="share this name"):
        build_config({"engines": ["http://127.0.0.1:8000/metrics,name=a"],
                      "routers": ["http://127.0.0.1:29000/metrics,name=a"]}, {})


# --- the routing rule (bottleneck.py); the real path is tests/test_routers_live.py ------------------

BUSY = dict(running=8.0, waiting=3.0, mean_batch=8.0, mean_waiting=3.0, decode_tps=200.0, prefill_tps=500.0)
SKEWED = dict(routing_router="router gw (vllm-router, policy consistent_hash)", routing_share=1.0,
              routing_fair=0.5, routing_skew=2.0, routing_busiest=True, routing_idle=("10.0.0.2:8000",))


def test_routing_is_named_for_the_hot_replica_with_evidence():
    s = Signals(**BUSY, **SKEWED, ttft_attainment=0.4)
    verdict, rule = raw_verdict(s, scores(s), None)
    assert verdict == "routing", rule
    words = " ".join(assess(s).evidence["routing"])
    assert "100% of its requests" in words and "10.0.0.2:8000" in words and "TTFT SLO attainment 40%" in words


@pytest.mark.parametrize("change", [
    dict(routing_skew=1.2),  # even enough
    dict(routing_idle=()),  # nobody idles: the whole fleet is loaded
    dict(routing_busiest=False),  # another replica is the hot one
    dict(routing_share=None, routing_skew=None),  # no router read
])
def test_routing_is_not_named_without_skew_an_idle_peer_or_on_the_cold_replica(change):
    s = Signals(**BUSY, **{**SKEWED, **change}, ttft_attainment=0.4)
    assert scores(s)["routing"] == 0.0
    assert raw_verdict(s, scores(s), None)[0] != "routing"


def test_routing_is_not_named_when_the_hot_replica_meets_its_slo_and_does_not_queue():
    s = Signals(**{**BUSY, "waiting": 0.0, "mean_waiting": 0.0}, **SKEWED, ttft_attainment=0.99,
                tbt_attainment=0.97)
    assert scores(s)["routing"] == 0.0
