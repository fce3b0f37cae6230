"""The client-side probe in the exporter: ProbeSource in-process (its state, credentials, close) and
the real `llm-exporter run --probe` process against the loopback OpenAI stub of test_probe_client."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import catalog
from exporter.catalog.probe import ERROR_REASONS
from exporter.config import load_config
from exporter.probe.client import make_prompt, stream_completion
from exporter.probe.source import ProbeSource, ProbeState
from tests.support import background_process, free_port, http_status, stop_process, wait_until
from tests.test_probe_client import stub

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "engines" / "vllm-v0.11__documented.prom"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the fixture's model_name


# ---------------------------------------------------------------------------------------------
# ProbeSource in-process
# ---------------------------------------------------------------------------------------------
def _samples(data) -> dict[tuple[str, tuple], float]:
    return {(s.name, s.labels): s.value for s in data.samples}


def test_without_usage_the_configured_prompt_length_is_counted_and_failures_count_no_tokens():
    state = ProbeState(configured_prompt_tokens=16)
    with stub(ttft_s=0.0, itl_s=0.0, tokens=3, usage=False) as server:
        outcome = asyncio.run(stream_completion(server.url, api="completions", model="m", prompt=make_prompt(16),
                                                max_tokens=3, timeout_s=5.0))
    assert outcome.ok and outcome.prompt_tokens is None
    state.record(outcome, 0.0)
    state.record(outcome._replace(ok=False, reason="timeout"), 1.0)
    assert (state.requests, state.prompt_tokens, state.completion_tokens) == (2, 16, 3)


def test_probe_source_accumulates_histograms_and_counters_and_closes_cleanly(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    token = tmp_path / "token"
    token.write_text("sekrit-probe-token\n")
    with stub(ttft_s=0.05, itl_s=0.01, tokens=4, model="m1") as server:
        config = load_config({"engines": [f"{server.url}/metrics,name=eng,bearer_token_file={token}"],
                              "probes": [f"{server.url},every=1s,max_tokens=4"]}, {})
        source = ProbeSource(config.probes[0], engine_attrs=lambda: {"engine": "vllm"})

        async def run():
            first = await source.collect()  # starts the task; nothing finished yet: no series
            assert first.samples == ()
            for _ in range(100):
                await asyncio.sleep(0.05)
                if source.state.requests >= 2:
                    break
            data = await source.collect()
            task = source._task
            await source.close()
            assert task is not None and task.done() and task.cancelled()
            return data

        data = asyncio.run(run())
        seen = server.seen()
    values = _samples(data)
    labels = (("engine", "vllm"), ("model", "m1"), ("target", "eng"))
    requests = values[("llm_probe_requests_total", labels)]
    assert requests >= 2
    assert values[("llm_probe_up", labels)] == 1.0
    assert values[("llm_probe_time_to_first_token_seconds_count", labels)] == requests
    assert values[("llm_probe_inter_token_latency_seconds_count", labels)] == 3 * requests
    assert values[("llm_probe_completion_tokens_total", labels)] == 4 * requests
    # The engine's usage (the stub counts the prompt's words), so the verdict can leave it out.
    words = len(make_prompt(config.probes[0].prompt_tokens).split())
    assert values[("llm_probe_prompt_tokens_total", labels)] == words * requests
    assert values[("llm_probe_in_flight", labels)] in (0.0, 1.0)
    under_40ms = ("llm_probe_time_to_first_token_seconds_bucket", tuple(sorted(labels + (("le", "0.04"),))))
    assert values[under_40ms] == 0  # every TTFT >= the stub's 50 ms
    errors = {dict(k[1])["reason"]: v for k, v in values.items() if k[0] == "llm_probe_errors_total"}
    assert errors == dict.fromkeys(ERROR_REASONS, 0.0)
    for name, _ in values:
        assert catalog.family_of(name), name
    # The model came from /v1/models once; the engine target's token went with each request (same origin).
    assert [(m, p) for m, p, _, _ in seen].count(("GET", "/v1/models")) == 1
    assert all(h.get("authorization") == "Bearer sekrit-probe-token" for _, _, h, _ in seen)
    assert source.attrs["auth"] == "bearer" and source.attrs["model"] == "m1"
    assert "sekrit" not in caplog.text and "sekrit" not in repr(config)


def test_credentials_never_go_to_another_origin(tmp_path, caplog):
    token = tmp_path / "token"
    token.write_text("sekrit-probe-token\n")
    with stub(ttft_s=0.0, itl_s=0.0, tokens=2) as server:
        config = load_config({"engines": [f"http://127.0.0.1:9/metrics,name=eng,bearer_token_file={token}"],
                              "probes": [f"{server.url},target=eng,every=1s,model=stub-model"]}, {})
        source = ProbeSource(config.probes[0])

        async def once():
            try:
                return await source.probe_once()
            finally:
                await source.close()

        outcome = asyncio.run(once())
        seen = server.seen()
    assert outcome.ok and seen
    assert all("authorization" not in h for _, _, h, _ in seen)
    assert source.attrs["auth"] == "none"
    assert "not where target eng's credentials are configured for" in caplog.text and "sekrit" not in caplog.text


def test_an_unreadable_token_file_is_reason_credentials(tmp_path):
    token = tmp_path / "token"
    token.write_text("t\n")
    with stub() as server:
        config = load_config({"engines": [f"{server.url}/metrics,name=eng,bearer_token_file={token}"],
                              "probes": [f"{server.url},every=1s"]}, {})
        token.unlink()
        source = ProbeSource(config.probes[0])

        async def once():
            try:
                return await source.probe_once()
            finally:
                await source.close()

        outcome = asyncio.run(once())
        assert server.seen() == []
    assert (outcome.ok, outcome.reason) == (False, "credentials")


# ---------------------------------------------------------------------------------------------
# The real process
# ---------------------------------------------------------------------------------------------
@contextmanager
def exporter_process(*args: str) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "200ms",
               "--gpu-backend", "none", "--no-host", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: http_status(base + "/readyz") == 200, timeout=20), \
            process.stderr.read() if process.poll() is not None else "not ready"
        yield base
    finally:
        stop_process(process)
        assert process.returncode == 0, process.stderr.read()


def _scrape(base: str) -> dict[str, list]:
    samples: dict[str, list] = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=5).text):
        for sample in fam.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _value(samples: dict[str, list], name: str, **labels: str) -> float | None:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    return found[0] if len(found) == 1 else None


def test_run_probes_an_engine_and_labels_its_series_like_the_engines():
    with stub(ttft_s=0.05, itl_s=0.01, tokens=4, model=MODEL, metrics=FIXTURE.read_bytes()) as server:
        started = time.monotonic()
        with exporter_process("--engine", f"{server.url}/metrics,name=vllm",
                              "--probe", f"{server.url},every=1s,max_tokens=4,prompt_tokens=8") as base:
            assert wait_until(lambda: (_value(_scrape(base), "llm_probe_requests_total", target="vllm") or 0) >= 3,
                              timeout=20)
            samples = _scrape(base)
            elapsed = time.monotonic() - started
        posts = [doc for method, _, _, doc in server.seen() if method == "POST"]
    who = {"target": "vllm", "engine": "vllm", "model": MODEL}
    requests = _value(samples, "llm_probe_requests_total", **who)
    assert requests is not None and 3 <= requests <= elapsed + 1  # one at a time, one a second
    assert _value(samples, "llm_probe_up", **who) == 1.0
    assert abs(_value(samples, "llm_probe_last_success_timestamp_seconds", **who) - time.time()) < 30
    assert _value(samples, "llm_probe_time_to_first_token_seconds_count", **who) == requests
    assert _value(samples, "llm_probe_time_to_first_token_seconds_bucket", le="0.04", **who) == 0.0
    assert _value(samples, "llm_probe_inter_token_latency_seconds_count", **who) == 3 * requests
    assert _value(samples, "llm_probe_e2e_request_latency_seconds_count", **who) == requests
    assert sum(s.value for s in samples["llm_probe_errors_total"]) == 0
    assert {s.labels["reason"] for s in samples["llm_probe_errors_total"]} == set(ERROR_REASONS)
    # The engine's own series carry the same target/engine/model: the two join (the gap rule).
    engine_ttft = {(s.labels["target"], s.labels["engine"], s.labels.get("model"))
                   for s in samples["llm_time_to_first_token_seconds_count"]}
    assert ("vllm", "vllm", MODEL) in engine_ttft
    assert {s.labels["source"]: s.value for s in samples["llm_exporter_source_up"]} == \
        {"engine:vllm": 1.0, "probe:vllm": 1.0}
    for name in samples:
        assert catalog.family_of(name) or catalog.family_of(name.removesuffix("_created")), name
    assert posts and all(d["model"] == MODEL and d["max_tokens"] == 4 and len(d["prompt"].split()) == 8
                         for d in posts)


def test_a_failing_probe_shows_errors_by_reason_and_everything_else_is_still_served():
    with stub(metrics=FIXTURE.read_bytes()) as server:
        down = free_port()  # nothing listens there
        with exporter_process("--engine", f"{server.url}/metrics,name=vllm",
                              "--probe", f"http://127.0.0.1:{down},every=1s,model=m,timeout=2s") as base:
            assert wait_until(lambda: (_value(_scrape(base), "llm_probe_errors_total",
                                              reason="connection") or 0) >= 2, timeout=20)
            samples = _scrape(base)
    who = {"target": f"127.0.0.1:{down}", "model": "m"}
    assert _value(samples, "llm_probe_up", **who) == 0.0
    assert _value(samples, "llm_probe_last_success_timestamp_seconds", **who) is None  # never succeeded
    errors = _value(samples, "llm_probe_errors_total", reason="connection", **who)
    assert errors == _value(samples, "llm_probe_requests_total", **who)
    assert _value(samples, "llm_probe_time_to_first_token_seconds_count", **who) == 0
    # The probe's failure is its own series, not a failed source: the engine's series are all there.
    assert _value(samples, "llm_engine_up", target="vllm") == 1.0
    assert samples["llm_time_to_first_token_seconds_count"]
    assert {s.labels["source"]: s.value for s in samples["llm_exporter_source_up"]} == \
        {"engine:vllm": 1.0, f"probe:127.0.0.1:{down}": 1.0}


def test_deeply_nested_json_from_the_engine_is_reason_too_deep_and_nothing_else_breaks():
    """An SSE event of 50,000 `[` raised RecursionError inside json.loads, counted as `exception` (a
    bug of ours); it is the engine's doing, with its own reason, and the exporter serves on."""
    with stub(mode="deep_json", metrics=FIXTURE.read_bytes()) as server, \
            exporter_process("--engine", f"{server.url}/metrics,name=vllm",
                             "--probe", f"{server.url},every=1s,model=m,timeout=5s") as base:
        assert wait_until(lambda: (_value(_scrape(base), "llm_probe_errors_total",
                                          reason="too_deep") or 0) >= 2, timeout=20)
        server.config.mode = "deep_error"  # an error answer's body nested as deep: its hint is dropped
        assert wait_until(lambda: (_value(_scrape(base), "llm_probe_errors_total",
                                          reason="http_status") or 0) >= 1, timeout=20)
        samples = _scrape(base)
        assert http_status(base + "/healthz") == 200
    assert _value(samples, "llm_probe_errors_total", reason="exception", target="vllm") in (0.0, None)
    assert sum(s.value for s in samples["llm_probe_errors_total"] if s.labels["reason"] == "exception") == 0
    assert _value(samples, "llm_engine_up", target="vllm") == 1.0


def test_deep_json_in_utf16_is_measured_on_its_text_not_its_bytes():
    """json.loads also reads UTF-16. In `["\u0122",[[[...` the character's 0x22 byte looked like a
    quote to the byte-level depth check, the rest like one string, and 20,000 levels reached
    json.loads: RecursionError again, counted as `exception`. Now reason too_deep."""
    with stub(mode="utf16_deep_json", metrics=FIXTURE.read_bytes()) as server, \
            exporter_process("--engine", f"{server.url}/metrics,name=vllm",
                             "--probe", f"{server.url},every=1s,model=m,timeout=5s") as base:
        assert wait_until(lambda: (_value(_scrape(base), "llm_probe_errors_total",
                                          reason="too_deep") or 0) >= 2, timeout=20), _scrape(base).get(
            "llm_probe_errors_total")
        samples = _scrape(base)
        assert http_status(base + "/healthz") == 200
    assert sum(s.value for s in samples["llm_probe_errors_total"] if s.labels["reason"] == "exception") == 0
    assert _value(samples, "llm_engine_up", target="vllm") == 1.0


# ---------------------------------------------------------------------------------------------
# The probe in the diagnosis (/api/v1/diagnosis, `doctor --url`), on the real twin's moving metrics
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def twin_metrics() -> Iterator[str]:
    """A twin serving decode-heavy traffic: its TTFT histogram moves, so the engine has a mean."""
    port = free_port()
    command = [sys.executable, "-m", "exporter.simulator", "--port", str(port), "--scenario", "decode-heavy",
               "--gpu", "l4"]
    with background_process(command, f"http://127.0.0.1:{port}/metrics"):
        yield f"http://127.0.0.1:{port}"


def _probe_diagnosis(base: str, until: Callable[[dict], bool]) -> dict:
    seen: list[dict] = []

    def ready() -> bool:
        target = httpx.get(base + "/api/v1/diagnosis", timeout=5).json()["targets"].get("twin", {})
        seen[:] = [target]
        return "probe" in target and target.get("verdict") is not None and until(target)

    assert wait_until(ready, timeout=40, interval=0.5), seen
    return seen[0]


def _doctor(base: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", base], capture_output=True,
                          text=True, timeout=30)
    return done.returncode, done.stdout


def test_doctor_names_a_client_latency_gap_in_front_of_the_engine(twin_metrics):
    """The probe goes through something slow in front of the engine (here a stub answering after
    1.5 s); the engine's own TTFT stays that of the twin. The diagnosis degrades the target on the
    gap, with both means, and `doctor` says so and exits 1."""
    with stub(ttft_s=1.5, itl_s=0.0, tokens=2) as slow, \
            exporter_process("--engine", f"{twin_metrics}/metrics,name=twin",
                             "--probe", f"{slow.url},target=twin,every=1s,max_tokens=2,model=stub-model") as base:
        target = _probe_diagnosis(base, lambda t: t["numbers"]["probe"]["requests"] >= 3)
        code, report = _doctor(base)
    numbers = target["numbers"]["probe"]
    assert numbers["failed"] == 0 and 1.5 <= numbers["client_ttft_mean_seconds"] < 3.0, numbers
    engine = numbers["engine_ttft_mean_seconds"]
    assert engine is not None and 0 < engine < 0.5, numbers  # the twin's L4 decode-heavy TTFT
    assert numbers["gap_seconds"] == pytest.approx(numbers["client_ttft_mean_seconds"] - engine, abs=1e-5)
    assert target["probe"]["gap_too_large"] and not target["probe"]["failing"]
    gap_line = [line for line in target["degraded_because"] if line.startswith("clients wait")]
    assert gap_line and "in front of the engine" in gap_line[0], target["degraded_because"]
    assert target["status"] == "degraded"
    assert code == 1, report
    assert "probe: " in report and "succeeded over the last 5 minutes" in report
    assert "degraded: clients wait" in report


def test_doctor_says_the_probe_fails_while_the_engine_metrics_look_fine(twin_metrics):
    down = free_port()  # nothing listens there
    with exporter_process("--engine", f"{twin_metrics}/metrics,name=twin",
                          "--probe", f"http://127.0.0.1:{down},target=twin,every=1s,model=m,timeout=2s") as base:
        target = _probe_diagnosis(base, lambda t: t["numbers"]["probe"]["failed"] >= 2)
        code, report = _doctor(base)
    numbers = target["numbers"]["probe"]
    assert numbers["failed"] == numbers["requests"] and numbers["failed_by_reason"] == {"connection": numbers["failed"]}
    assert numbers["client_ttft_mean_seconds"] is None and numbers["gap_seconds"] is None
    failing = [line for line in target["degraded_because"] if line.startswith("the probe's requests")]
    assert failing and "(connection " in failing[0], target["degraded_because"]
    assert target["status"] == "degraded" and target["probe"]["failing"]
    assert code == 1 and "degraded: the probe's requests to the engine's API fail" in report, report
