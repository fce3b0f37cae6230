"""`llm-exporter run` as a subprocess against real HTTP engine servers on loopback."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter import catalog
from tests.support import fake_engine, free_port, http_status, stop_process, wait_until

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "engines"


@contextmanager
def exporter_process(*args: str) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}",
               "--interval", "200ms", "--gpu-backend", "none", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        ready = wait_until(lambda: http_status(base + "/readyz") == 200, timeout=20)
        assert ready, f"exporter never became ready: {process.stderr.read() if process.poll() is not None else ''}"
        yield base
    finally:
        # SIGTERM is the exporter's own to handle: a clean exit (0), at once, not a re-raised signal.
        started = time.monotonic()
        stop_process(process)
        assert process.returncode == 0, process.stderr.read()
        assert time.monotonic() - started < 5.0


def _scrape(base: str) -> dict[str, list]:
    text = httpx.get(base + "/metrics", timeout=5).text
    samples: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def test_run_scrapes_three_engine_formats_into_one_schema():
    bodies = {
        "vllm": (FIXTURES / "vllm-v0.11__documented.prom").read_bytes(),
        "sglang": (FIXTURES / "sglang-v0.4-production_metrics_docs.prom").read_bytes(),
        "llama": (FIXTURES / "llamacpp-server_cuda_2026-opencode_session_log.prom").read_bytes(),
    }
    with ExitStack() as stack:
        urls = {name: stack.enter_context(fake_engine(body))[0] for name, body in bodies.items()}
        args = [a for name, url in urls.items() for a in ("--engine", f"{url},name={name}")]
        base = stack.enter_context(exporter_process(*args, "--no-host"))
        assert wait_until(lambda: len(_scrape(base).get("llm_engine_up", [])) == 3, timeout=10)
        samples = _scrape(base)

    up = {(s.labels["target"], s.labels["engine"]): s.value for s in samples["llm_engine_up"]}
    assert up == {("vllm", "vllm"): 1.0, ("sglang", "sglang"): 1.0, ("llama", "llamacpp"): 1.0}
    # Every exported name belongs to the catalogue (the schema is the contract).
    for name in samples:
        assert catalog.family_of(name) or catalog.family_of(name.removesuffix("_created")), name
    ttft_targets = {s.labels["target"] for s in samples["llm_time_to_first_token_seconds_bucket"]}
    assert ttft_targets == {"vllm", "sglang"}  # llama.cpp has no TTFT histogram: omitted, not zero
    gen = {s.labels["target"]: s.value for s in samples["llm_generation_tokens_total"]}
    assert set(gen) == {"vllm", "sglang", "llama"}
    sources = {s.labels["source"]: s.value for s in samples["llm_exporter_source_up"]}
    assert sources == {"engine:vllm": 1.0, "engine:sglang": 1.0, "engine:llama": 1.0}


def test_hanging_target_does_not_slow_metrics():
    body = (FIXTURES / "vllm-v0.7-aibrix_runtime_docs.prom").read_bytes()
    with ExitStack() as stack:
        good_url, _ = stack.enter_context(fake_engine(body))
        hung_url, _ = stack.enter_context(fake_engine(body, delay_s=30))
        base = stack.enter_context(exporter_process(
            "--engine", f"{good_url},name=good", "--engine", f"{hung_url},name=hung,timeout=3s", "--no-host"))
        assert wait_until(lambda: any(
            s.labels.get("source") == "engine:hung" and s.labels.get("reason") == "timeout"
            for s in _scrape(base).get("llm_exporter_collect_errors_total", [])), timeout=15)
        durations = []
        with httpx.Client(timeout=5) as client:
            for _ in range(20):
                started = time.perf_counter()
                assert client.get(base + "/metrics").status_code == 200
                durations.append(time.perf_counter() - started)
        samples = _scrape(base)
    durations.sort()
    # /metrics never waits on a source: even the slowest of 20 scrapes (over about two 3 s cycles,
    # each waiting out the hung target's timeout) is far below that timeout.
    assert durations[-1] < 1.0, durations
    up = {s.labels["target"]: s.value for s in samples["llm_engine_up"]}
    assert up == {"good": 1.0, "hung": 0.0}
    assert any(s.labels["target"] == "good" for s in samples["llm_requests_running"])
    assert not any(s.labels["target"] == "hung" for s in samples["llm_requests_running"])


def test_run_gives_the_scheduler_verdict_and_spec_acceptance_for_a_busy_llamacpp():
    """The real process on a llama.cpp page that moves like a busy server (4 slots busy, 4
    deferred, drafts accepted 30%): the scheduler verdict and the acceptance ratio on /metrics,
    as the in-process tests in test_derive_formulas.py see them."""
    from tests.test_derive_verdict import llamacpp_page

    started = time.monotonic()
    with fake_engine(llamacpp_page(0.0, deferred=4).encode()) as (url, behaviour), \
            exporter_process("--engine", f"{url},name=a", "--no-host") as base:
        def moved() -> bool:
            behaviour.body = llamacpp_page(time.monotonic() - started, deferred=4).encode()
            samples = _scrape(base)
            verdict = [s for s in samples.get("llm_bottleneck", []) if s.value == 1.0]
            return bool(verdict) and verdict[0].labels["resource"] == "scheduler" \
                and "llm_spec_decode_acceptance_ratio" in samples
        assert wait_until(moved, timeout=30, interval=0.2), _scrape(base).get("llm_bottleneck")
        ratio = _scrape(base)["llm_spec_decode_acceptance_ratio"][0].value
        assert abs(ratio - 0.3) < 0.02, ratio


def _vllm_page(served: int) -> bytes:
    """A vLLM page after `served` requests, each 3 s to its first token (over the 2.5 s TTFT SLO)."""
    lines = ["# TYPE vllm:num_requests_running gauge", f'vllm:num_requests_running{{model_name="m"}} {min(served, 4)}',
             "# TYPE vllm:num_requests_waiting gauge", 'vllm:num_requests_waiting{model_name="m"} 0',
             "# TYPE vllm:prompt_tokens_total counter", f'vllm:prompt_tokens_total{{model_name="m"}} {100 * served}',
             "# TYPE vllm:generation_tokens_total counter",
             f'vllm:generation_tokens_total{{model_name="m"}} {50 * served}',
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    for le, count in (("0.5", 0), ("1.0", 0), ("2.5", 0), ("5.0", served), ("+Inf", served)):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {count}')
    lines += [f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {3 * served}',
              f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {served}']
    return ("\n".join(lines) + "\n").encode()


def test_run_reads_one_window_across_an_engine_restart_then_says_no_recent_traffic():
    """Issues 19 and 26: the real process, slow requests, then an engine restart (counters back to 0)
    and no traffic since. The tails and the SLO line read one window, as Prometheus' rate() and the
    burn-rate rules do: right after the restart both still count the requests before it (the same
    number), the words say the restart came and how many requests followed it, and doctor prints no
    p99 of seconds beside "100% within". Once those requests leave the (here 6 s) window: no recent
    traffic, not degraded, and no attainment sample (absent, not 0, not the old value)."""
    started = time.monotonic()
    with fake_engine(_vllm_page(0)) as (url, behaviour), \
            exporter_process("--engine", f"{url},name=a,kind=vllm", "--no-host", "--quantile-window", "6s") as base:
        def diagnosis() -> dict:
            return httpx.get(base + "/api/v1/diagnosis", timeout=5).json()

        def missed() -> bool:
            behaviour.body = _vllm_page(int(10 * (time.monotonic() - started)))
            target = diagnosis()["targets"].get("a", {})
            return target.get("slo", {}).get("ttft", {}).get("state") == "missed"
        assert wait_until(missed, timeout=20, interval=0.2), diagnosis()
        degraded = diagnosis()["targets"]["a"]
        assert degraded["status"] == "degraded" and "only 0% of requests meet the TTFT SLO" in degraded[
            "degraded_because"]
        attained = [s for s in _scrape(base).get("llm_ttft_slo_attainment_ratio", []) if s.labels["target"] == "a"]
        assert attained and attained[0].labels["engine"] == "vllm"  # derived families carry the engine label

        behaviour.body = _vllm_page(0)  # restarted; nothing served since

        def restarted() -> bool:
            ttft = diagnosis()["targets"].get("a", {}).get("numbers", {}).get("ttft", {})
            return ttft.get("restarted_seconds_ago") is not None and ttft.get("window_count", 0) > 0
        assert wait_until(restarted, timeout=10, interval=0.1), diagnosis()
        target = diagnosis()["targets"]["a"]
        ttft = target["numbers"]["ttft"]
        assert ttft["window_count"] == ttft["slo_window_count"] and ttft["window_count_since_restart"] == 0
        assert "the engine restarted" in target["slo"]["ttft"]["words"] and target["slo"]["ttft"]["state"] == "missed"
        report = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", base], capture_output=True,
                                text=True, timeout=60).stdout
        assert "100% of" not in report, report

        def quiet() -> bool:
            target = diagnosis()["targets"].get("a", {})
            attainment = [s for s in _scrape(base).get("llm_ttft_slo_attainment_ratio", [])
                          if s.labels["target"] == "a"]
            return target.get("slo", {}).get("ttft", {}).get("state") == "no_recent_traffic" and not attainment
        assert wait_until(quiet, timeout=30, interval=0.2), diagnosis()
        doc = diagnosis()
        target = doc["targets"]["a"]
        assert target["status"] != "degraded" and doc["status"] != "degraded", target["degraded_because"]
        assert not any("SLO" in reason for reason in target["degraded_because"])
        assert "TTFT SLO: no recent traffic (no requests finished in the last 6 seconds)" in target["notes"], \
            target["notes"]
        assert "no recent traffic" in httpx.get(base + "/", timeout=5).text
        samples = _scrape(base)
        assert not [s for s in samples.get("llm_ttft_slo_attainment_ratio", []) if s.labels["target"] == "a"]
        assert {s.labels["engine"] for s in samples["llm_bottleneck"]} == {"vllm"}


def test_run_counts_and_names_engine_families_its_table_does_not_know():
    """`llm-exporter run` against a vLLM page with one family no table knows (as after an engine
    upgrade): llm_exporter_engine_families counts every family of the page once by state, the
    snapshot and the status page name the unknown one, one log line says so when it appears and one
    when the page no longer has it. A TYPE line whose name is not a metric name is no family."""
    page = (FIXTURES / "vllm-v0.11__documented.prom").read_text()
    unknown = ("# HELP vllm:brand_new_feature_seconds Something a newer vLLM measures.\n"
               "# TYPE vllm:brand_new_feature_seconds gauge\n"
               'vllm:brand_new_feature_seconds{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.5\n'
               "# TYPE \x1b[31mforged counter\n")
    from exporter.sources.engines.accounting import page_families
    from exporter.sources.engines.registry import SPECS
    spec = SPECS["vllm"]
    states = [spec.state_of(name) for name in page_families(page, spec).values()]
    expected = {state: float(states.count(state)) for state in ("mapped", "ignored", "unaccounted")}
    assert expected["unaccounted"] == 0 and expected["mapped"] > 10

    def families(base: str) -> dict[str, float]:
        return {s.labels["state"]: s.value for s in _scrape(base).get("llm_exporter_engine_families", [])
                if s.labels["target"] == "v"}

    with fake_engine((page + unknown).encode()) as (url, behaviour):
        port = free_port()
        command = [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}",
                   "--interval", "200ms", "--gpu-backend", "none", "--no-host", "--engine", f"{url},name=v"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        base = f"http://127.0.0.1:{port}"
        try:
            assert wait_until(lambda: http_status(base + "/readyz") == 200, timeout=20)
            assert wait_until(lambda: families(base).get("unaccounted") == 1.0, timeout=10)
            assert families(base) == {**expected, "unaccounted": 1.0}
            snapshot = httpx.get(base + "/api/v1/snapshot", timeout=5).json()
            assert snapshot["sources"]["engine:v"]["attrs"]["unaccounted_families"] == "vllm:brand_new_feature_seconds"
            status = httpx.get(base + "/", timeout=5).text
            assert "Engine families not understood" in status and "vllm:brand_new_feature_seconds" in status
            assert "forged" not in status
            doctor = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", base],
                                    capture_output=True, text=True, timeout=60)
            assert "engine families not understood" in doctor.stdout, doctor.stdout + doctor.stderr
            assert "vllm:brand_new_feature_seconds" in doctor.stdout
            behaviour.body = page.encode()  # the engine rolled back: every family known again
            assert wait_until(lambda: families(base).get("unaccounted") == 0.0, timeout=10)
            time.sleep(0.5)  # a few more cycles: no further log line
        finally:
            stop_process(process)
        log = process.stderr.read()
    assert process.returncode == 0, log
    appeared = [line for line in log.splitlines() if "neither mapped nor ignored" in line]
    assert len(appeared) == 1 and "vllm:brand_new_feature_seconds" in appeared[0], log
    assert "\x1b" not in log
    assert sum("every engine family is accounted for again" in line for line in log.splitlines()) == 1, log


def test_run_reads_a_data_parallel_vllm_twin_as_ranks_of_one_target():
    """The twin serving vLLM with --data-parallel 2 (the API server's page: each engine's series with
    its `engine` index, num_gpu_blocks summed over both on every cache_config_info) read by `llm-exporter
    run`: two ranks of one target, each with its own KV capacity (kv_cache_size_tokens, not the sum x
    block size), two GPUs; an API request is served by one of the engines."""
    twin_port = free_port()
    twin = subprocess.Popen([sys.executable, "-m", "exporter.simulator", "--port", str(twin_port), "--scenario",
                             "decode-heavy", "--data-parallel", "2", "--gpu", "l4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    twin_url = f"http://127.0.0.1:{twin_port}"
    try:
        assert wait_until(lambda: http_status(twin_url + "/health") == 200, timeout=20), twin.stderr
        page = httpx.get(twin_url + "/metrics", timeout=5).text
        infos = [s for f in text_string_to_metric_families(page) for s in f.samples
                 if s.name == "vllm:cache_config_info"]
        assert sorted(s.labels["engine"] for s in infos) == ["0", "1"]
        per_engine = float(infos[0].labels["kv_cache_size_tokens"])
        assert float(infos[0].labels["num_gpu_blocks"]) * float(infos[0].labels["block_size"]) == 2 * per_engine
        done = httpx.post(twin_url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3}, timeout=30).json()
        assert done["usage"]["completion_tokens"] == 3
        gpus = httpx.get(twin_url + "/sim/gpu", timeout=5).json()["gpus"]
        assert len(gpus) == 2 and len({g["index"] for g in gpus}) == 2
        with exporter_process("--engine", f"{twin_url}/metrics,name=dp", "--no-host") as base:
            def capacity() -> dict[str, float]:
                return {s.labels.get("rank", ""): s.value
                        for s in _scrape(base).get("llm_kv_cache_capacity_tokens", []) if s.labels["target"] == "dp"}
            assert wait_until(lambda: len(capacity()) == 2, timeout=10)
            assert capacity() == {"0": per_engine, "1": per_engine}
            ranks = {s.labels.get("rank") for s in _scrape(base)["llm_requests_running"]}
            assert ranks == {"0", "1"}
    finally:
        stop_process(twin)
