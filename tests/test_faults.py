"""Faults and bad input against whole exporters, all at once where a real host would have them at
once. What tests/test_engine_faults.py, test_gpu_nvml.py, test_host.py and test_config.py already
check one source at a time is not repeated here; this file adds:

- one running exporter (real sockets, /metrics scraped every 50 ms) whose engine targets hang,
  answer 500, HTML, a truncated body, 100 MB of distinct label values streamed without a length,
  garbage bytes, a cardinality bomb under the payload cap, and flap up and down, next to a good
  target, 8 fake GPUs of which one is lost mid-run, and a /sys tree with missing files. Each
  fault shows in self-metrics with its reason, every scrape is answered quickly, the good sources
  stay intact, and memory (RSS, and the per-target normalizer caches) stays bounded;
- NVML faults (library missing, required or not; NotSupported for every field) through the
  Collector next to another source;
- bad config files of every shape: ConfigError (exit 2), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import pathlib
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.app import build_sources
from exporter.catalog import family_of
from exporter.collect import Collector
from exporter.config import ConfigError, build_config, load_config
from exporter.sources.engines.exposition import MAX_CACHED_LABEL_SETS, parse
from exporter.sources.engines.scrape import EngineSource
from exporter.sources.engines.state import MAX_MAPPED_LABEL_SETS
from exporter.sources.gpu.nvml import NvmlOptions, NvmlSource
from tests import fake_pynvml as F
from tests.exporter_process import running_exporter
from tests.support import PROMETHEUS_TEXT, send_body, serve_in_background
from tests.test_collect import ScriptedSource

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
VLLM = (FIXTURES / "engines" / "vllm-v0.11__documented.prom").read_bytes()
HUGE_BYTES = 100 * 1024 * 1024
CAP = 8 * 1024 * 1024  # the default --max-payload-bytes
BOMB_SERIES = 20_000
MAX_SERIES = 1_000


def _bomb_page(n: int) -> bytes:
    """A buggy engine that puts something unbounded in model_name: n distinct series."""
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m-{i}",engine="0",request_id="{i:08x}"}} {i % 7}'
              for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


def _distinct_lines(start: int) -> bytes:
    """64 KiB-ish of lines whose every label value is new: the 100 MB stream is millions of values."""
    return "".join(f'vllm:num_requests_running{{model_name="m-{i}",request_id="{i:012x}"}} 1\n'
                   for i in range(start, start + 1000)).encode()


class FaultyEngines:
    """One loopback server, one fault per path. Counts requests and bytes sent per path."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = defaultdict(int)
        self.sent: dict[str, list[int]] = defaultdict(list)
        self.stop = threading.Event()
        self.bomb = _bomb_page(BOMB_SERIES)
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.strip("/")
                owner.requests[path] += 1
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    getattr(self, "serve_" + path)(owner.requests[path])

            def send(self, body: bytes, status: int = 200, ctype: str = PROMETHEUS_TEXT) -> None:
                send_body(self, body, status, ctype)

            def serve_good(self, n: int) -> None:
                self.send(VLLM)

            def serve_hang(self, n: int) -> None:
                owner.stop.wait(60)

            def serve_http500(self, n: int) -> None:
                self.send(b"internal server error", 500)

            def serve_html(self, n: int) -> None:
                self.send(b"<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>", 200, "text/html")

            def serve_truncated(self, n: int) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(VLLM)))
                self.end_headers()
                self.wfile.write(VLLM[: len(VLLM) // 3])
                self.close_connection = True

            def serve_huge(self, n: int) -> None:
                # No Content-Length (the exporter cannot refuse it up front), generated as it
                # goes: neither side ever holds the 100 MB.
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                sent, i = 0, 0
                try:
                    self.wfile.write(b"# TYPE vllm:num_requests_running gauge\n")
                    while sent < HUGE_BYTES and not owner.stop.is_set():
                        chunk = _distinct_lines(i)
                        self.wfile.write(chunk)
                        sent += len(chunk)
                        i += 1000
                finally:
                    owner.sent["huge"].append(sent)

            def serve_garbage(self, n: int) -> None:
                self.send(random.Random(n).randbytes(64 * 1024))

            def serve_bomb(self, n: int) -> None:
                self.send(owner.bomb)

            def serve_flap(self, n: int) -> None:
                if n % 2:
                    self.send(VLLM)
                else:  # the process died mid-request: no status line at all
                    self.close_connection = True
                    self.connection.shutdown(2)

            def log_message(self, *args: object) -> None:
                return

        self.server, self.base = serve_in_background(Handler)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _families(text: str) -> dict[tuple[str, tuple], float]:
    return {(s[0], s[1]): s[2] for s in parse(text).samples}


def _get(samples: dict, name: str, **labels: str) -> float | None:
    for (n, lab), value in samples.items():
        if n == name and all(dict(lab).get(k) == v for k, v in labels.items()):
            return value
    return None


class Scraper:
    """Prometheus in a thread: GET /metrics every 50 ms, keeping status, latency and each body."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.results: list[tuple[int, float]] = []
        self.flap_states: set[float] = set()
        self.last = ""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.done.is_set():
                started = time.perf_counter()
                try:
                    response = client.get(self.base + "/metrics")
                    status, body = response.status_code, response.text
                except httpx.HTTPError:
                    status, body = 0, ""
                self.results.append((status, time.perf_counter() - started))
                if status == 200:
                    self.last = body
                    up = re.search(r'^llm_engine_up\{[^}]*target="flap"[^}]*\} (\S+)$', body, re.M)
                    if up:
                        self.flap_states.add(float(up.group(1)))
                time.sleep(0.05)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)


@pytest.mark.timeout(90)
def test_one_exporter_survives_every_engine_fault_at_once(tmp_path: pathlib.Path):
    host_root = tmp_path / "host"
    shutil.copytree(FIXTURES / "host" / "missing_files", host_root, symlinks=True,
                    ignore=shutil.ignore_patterns("next"))
    engines = FaultyEngines()
    fake = F.FakeNvml(["h100"] * 8, "busy")
    gpu = NvmlSource(NvmlOptions(pynvml_module=fake, xid_events=False, retry_interval_s=3600))
    paths = ("good", "hang", "http500", "html", "truncated", "huge", "garbage", "bomb", "flap")
    specs = [f"{engines.base}/{p},name={p},kind=vllm" + (",timeout=5s" if p == "bomb" else "") for p in paths]
    config = load_config({"listen": "127.0.0.1:0", "engines": specs, "interval": "1s", "gpu_backend": "none",
                          "max_series_per_target": str(MAX_SERIES), "proc_root": str(host_root / "proc"),
                          "sys_root": str(host_root / "sys"), "engine_process_name": "llama", "log_level": "error"}, {})
    assert config.max_payload_bytes == CAP
    sources = build_sources(config, gpu_source=gpu)
    try:
        with running_exporter(config, sources) as base:
            scraper = Scraper(base)
            time.sleep(3.5)
            rss_warm = _rss_mb()
            fake.lose(3)  # GPU 3 falls off the bus mid-run
            time.sleep(6.5)
            scraper.stop()
            rss_end = _rss_mb()
            text = httpx.get(base + "/metrics", timeout=5).text
    finally:
        engines.close()

    # Every scrape answered, fast: collection runs beside the server, never in its way.
    statuses = [s for s, _ in scraper.results]
    latencies = sorted(d for _, d in scraper.results)
    assert len(statuses) > 50 and set(statuses) == {200}, set(statuses)
    assert latencies[-1] < 0.5, f"slowest /metrics {latencies[-1] * 1000:.0f} ms"

    m = _families(text)
    reasons = {"hang": "timeout", "http500": "http_status", "html": "parse", "truncated": "connection",
               "huge": "too_large", "garbage": "parse"}
    for target, reason in reasons.items():
        assert _get(m, "llm_engine_up", target=target) == 0.0, target
        assert _get(m, "llm_exporter_source_up", source=f"engine:{target}") == 0.0, target
        errors = _get(m, "llm_exporter_collect_errors_total", source=f"engine:{target}", reason=reason)
        assert errors is not None and errors >= 1, (target, reason)
        assert not [k for k in m if dict(k[1]).get("target") == target and k[0] not in ("llm_engine_up",)], target
    # The hung target is given up on after its timeout and asked once a cycle, no more (~10 s).
    assert engines.requests["hang"] <= 12, engines.requests["hang"]
    # The 100 MB stream: abandoned at the cap every time, never read to the end (what the server
    # wrote is the cap plus what the loopback socket buffers took before the client hung up).
    assert engines.sent["huge"] and max(engines.sent["huge"]) < 3 * CAP, engines.sent["huge"]

    # The bomb: up, cut to max_series, the cut counted (and growing every cycle).
    assert _get(m, "llm_engine_up", target="bomb") == 1.0
    # The cap is on what the engine sends: derived series (the verdict's, GPU health's) come on top,
    # a few per target whatever the engine sends.
    mine = [k for k in m if dict(k[1]).get("target") == "bomb"
            and k[0] not in ("llm_engine_up", "llm_exporter_engine_families")]  # 3 self-health counts
    derived = [k for k in mine if (f := family_of(k[0])) is not None and f.source == "derived"]
    bomb_series = [k for k in mine if k not in derived]
    assert len(bomb_series) <= MAX_SERIES + 2  # + llm_engine_info
    assert len(derived) <= 60, sorted({k[0] for k in derived})
    dropped = _get(m, "llm_exporter_series_dropped_total", source="engine:bomb")
    assert dropped is not None and dropped >= 2 * (BOMB_SERIES - MAX_SERIES)

    # The flapping target was seen up and down, and its series come and go with it.
    assert scraper.flap_states == {0.0, 1.0}
    assert _get(m, "llm_exporter_collect_errors_total", source="engine:flap", reason="connection") >= 2

    # The rest is intact: the good engine, 7 of 8 GPUs (the lost one says so), the host.
    assert _get(m, "llm_engine_up", target="good") == 1.0
    assert _get(m, "llm_requests_running", target="good") is not None
    assert _get(m, "llm_exporter_collect_errors_total", source="engine:good") is None
    gpu_up = {dict(k[1])["gpu"]: v for k, v in m.items() if k[0] == "llm_gpu_up"}
    assert gpu_up == {str(i): (0.0 if i == 3 else 1.0) for i in range(8)}
    assert len([k for k in m if k[0] == "llm_gpu_power_watts"]) == 7
    assert _get(m, "llm_exporter_source_up", source="host") == 1.0
    assert _get(m, "llm_engine_process_found") == 1.0  # found in the fixture's /proc by name
    assert _get(m, "llm_engine_process_cpu_seconds_total") is not None

    # Memory: bounded caches per target, and no growth after warm-up beyond allocator noise.
    for source in sources:
        if isinstance(source, EngineSource):
            state = source._state
            assert len(state.label_cache) <= MAX_CACHED_LABEL_SETS
            assert sum(len(e) for e in state._entries) <= MAX_MAPPED_LABEL_SETS
    assert rss_end - rss_warm < 64, f"RSS {rss_warm:.0f} -> {rss_end:.0f} MB"


# ------------------------------------------------------------------------------------------------
# NVML faults through the Collector
# ------------------------------------------------------------------------------------------------
def _not_supported_everywhere(fake: F.FakeNvml) -> None:
    keep = {"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
            "nvmlDeviceGetPciInfo"}
    for name in dir(fake):
        if name.startswith("nvmlDevice") and name not in keep:
            for index in range(len(fake.devices)):
                fake.fail(index, name, F.NVMLError_NotSupported)
    fake.gpm_unsupported = set(range(256))


def _collect_with(gpu: NvmlSource, cycles: int = 3):
    other = ScriptedSource("other")

    async def scenario():
        collector = Collector([gpu, other], interval_s=1.0)
        for _ in range(cycles):
            published = await collector.collect_once()
        await collector.close()
        return published
    published = asyncio.run(scenario())
    return {(s.name, s.labels): s.value for s in published.samples}, published


@pytest.mark.parametrize("case", ["missing_auto", "missing_required", "not_supported_everywhere"])
def test_nvml_faults_through_the_collector(case: str, monkeypatch):
    if case.startswith("missing"):
        monkeypatch.setitem(sys.modules, "pynvml", None)  # the library is not installed
        gpu = NvmlSource(NvmlOptions(required=case == "missing_required", xid_events=False, retry_interval_s=0.0))
    else:
        fake = F.FakeNvml(["h100", "a100"], "busy")
        _not_supported_everywhere(fake)
        gpu = NvmlSource(NvmlOptions(pynvml_module=fake, xid_events=False))
    m, published = _collect_with(gpu)
    assert _get(m, "llm_requests_running", target="other") == 1.0  # the other source is intact
    assert _get(m, "llm_exporter_source_up", source="other") == 1.0
    gpu_series = {k[0] for k in m if k[0].startswith("llm_gpu_")}
    if case == "missing_auto":  # a host without NVIDIA: normal, nothing made up, state reported
        assert _get(m, "llm_exporter_source_up", source="gpu") == 1.0
        assert not gpu_series
        assert published.snapshot.results["gpu"].attrs["state"] == "nvml_missing"
    elif case == "missing_required":  # --gpu-backend nvml: a failure with its reason
        assert _get(m, "llm_exporter_source_up", source="gpu") == 0.0
        assert _get(m, "llm_exporter_collect_errors_total", source="gpu", reason="nvml_missing") == 3.0
        assert not gpu_series
    else:  # every field refused: the GPUs are known and up, no field series is made up
        assert _get(m, "llm_exporter_source_up", source="gpu") == 1.0
        assert [v for k, v in m.items() if k[0] == "llm_gpu_up"] == [1.0, 1.0]
        assert gpu_series <= {"llm_gpu_up", "llm_gpu_info"}, gpu_series


# ------------------------------------------------------------------------------------------------
# Bad config
# ------------------------------------------------------------------------------------------------
BAD_FILES = {
    "top level a list": "- listen: 127.0.0.1:9480\n",
    "engines a number": "engines: 5\n",
    "engine mapping without url": "engines:\n  - {name: a}\n",
    "engine basic_auth a string": "engines:\n  - {url: 'http://a:1', basic_auth: x}\n",
    "negative max series": "max_series_per_target: -1\n",
    "payload cap as text": "max_payload_bytes: lots\n",
    "interval a list": "interval: [1, 2]\n",
    "log level a mapping": "log_level: {loud: 1}\n",
    "binary junk": "\x00\x01\x02: \x03\n",
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_config_file_exits_2_with_one_line(name: str, tmp_path: pathlib.Path):
    path = tmp_path / "config.yaml"
    path.write_text(BAD_FILES[name])
    result = subprocess.run([sys.executable, "-m", "exporter.cli", "run", "--config", str(path),
                             "--gpu-backend", "none", "--no-host", "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-exporter: "), result.stderr


_KEYS = ("listen", "interval", "engine_timeout", "engines", "gpu_backend", "max_payload_bytes",
         "max_series_per_target", "max_concurrent_scrapes", "engine_port", "host", "host_enabled", "log_level",
         "slo_ttft", "quantile_window", "tensor_parallel", "gpu_price_per_hour", "model")
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5))
def test_any_config_mapping_is_a_config_or_a_config_error(settings_: dict):
    """What a YAML file can hold, under the keys that matter: validated into a Config or refused
    with a ConfigError naming the field; never a TypeError or AttributeError from deep inside."""
    try:
        build_config(settings_, {})
    except ConfigError as error:
        named = error.field.split(".")[0]
        assert named in settings_ or named in ("engine", "host_enabled"), (error.field, settings_)
