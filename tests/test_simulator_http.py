"""The twin's /metrics in each engine format, and its HTTP control endpoints (in process and as a
subprocess)."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import Twin, TwinConfig
from exporter.simulator.demo import start_twins
from exporter.simulator.recorders import SGLANG_TTFT, TGI_DURATION, VLLM_TTFT
from tests.conftest import ROOT
from tests.support import background_process, free_port


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _twin(fmt: str, seconds: float = 30.0) -> Twin:
    twin = Twin(TwinConfig(scenario="decode-heavy", engine_format=fmt, epoch=1_700_000_000.0))
    twin.fast_forward(seconds)
    return twin


def test_vllm_v1_exposition() -> None:
    twin = _twin("vllm")
    text = twin.metrics_text()
    fams = _families(text)
    for name, kind in (("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prompt_tokens", "counter"),
                       ("vllm:generation_tokens", "counter"), ("vllm:num_preemptions", "counter"),
                       ("vllm:request_success", "counter"), ("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:inter_token_latency_seconds", "histogram"),
                       ("vllm:e2e_request_latency_seconds", "histogram"), ("vllm:iteration_tokens_total", "histogram"),
                       ("vllm:cache_config_info", "gauge")):
        assert fams[name].type == kind, name
    ttft = fams["vllm:time_to_first_token_seconds"]
    les = [float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket")]
    assert les[:-1] == list(VLLM_TTFT)
    assert all(s.labels["model_name"] == "meta-llama/Llama-3.1-8B-Instruct" and s.labels["engine"] == "0"
               for s in ttft.samples)
    assert "vllm:prompt_tokens_created{" in text and "vllm:time_to_first_token_seconds_created{" in text
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert int(info["num_gpu_blocks"]) == twin.engine.num_blocks and info["block_size"] == "16"
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples if s.name.endswith("_total")}
    assert reasons == {"stop", "length", "abort", "error"}
    prompt = [s.value for s in fams["vllm:prompt_tokens"].samples if s.name == "vllm:prompt_tokens_total"]
    assert prompt[0] == twin.engine.counters.prompt_tokens > 0


def test_sglang_exposition() -> None:
    fams = _families(_twin("sglang").metrics_text())
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                 "sglang:max_total_num_tokens", "sglang:prompt_tokens", "sglang:generation_tokens",
                 "sglang:cached_tokens", "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                 "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds"):
        assert name in fams, name
    ttft = fams["sglang:time_to_first_token_seconds"]
    assert [float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket")][:-1] == list(SGLANG_TTFT)
    labels = ttft.samples[0].labels
    assert {"model_name", "engine_type", "tp_rank", "pp_rank"} <= set(labels)
    assert 0 < fams["sglang:token_usage"].samples[0].value < 1


def test_tgi_exposition() -> None:
    text = _twin("tgi").metrics_text()
    fams = _families(text)
    for name in ("tgi_request_count", "tgi_request_success", "tgi_request_duration", "tgi_request_queue_duration",
                 "tgi_batch_inference_duration", "tgi_batch_current_size", "tgi_queue_size",
                 "tgi_request_mean_time_per_token_duration", "tgi_request_skipped_tokens"):
        assert name in fams, name
    assert "model_name" not in text  # TGI has no model label
    assert not re.search(r"^tgi_\w+_total[ {]", text, re.M)  # and counters without _total
    assert "tgi_request_success " in text
    dur = fams["tgi_request_duration"]
    assert len([s for s in dur.samples if s.name.endswith("_bucket")]) == len(TGI_DURATION) + 1
    assert {s.labels["method"] for s in fams["tgi_batch_inference_duration"].samples} == {"prefill", "decode"}
    assert fams["tgi_request_skipped_tokens"].type == "summary"


def test_llamacpp_exposition() -> None:
    twin = _twin("llamacpp")
    text = twin.metrics_text()
    fams = _families(text)
    for name in ("llamacpp:prompt_tokens", "llamacpp:prompt_seconds", "llamacpp:tokens_predicted",
                 "llamacpp:tokens_predicted_seconds", "llamacpp:n_decode", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "llamacpp:prompt_tokens_seconds"):
        assert name in fams, name
    assert "{" not in text  # no labels at all
    assert "# TYPE llamacpp:n_busy_slots_per_decode counter" in text  # an average declared as a counter
    assert fams["llamacpp:requests_processing"].samples[0].value <= 4  # a few slots, not a wide batch
    assert "Process-Start-Time-Unix" in twin.metrics_headers()


def test_restart_resets_counters_and_created() -> None:
    twin = _twin("vllm", 20)
    before = _families(twin.metrics_text())
    twin.fast_forward(5)
    twin.restart()
    twin.fast_forward(0.5)
    after = _families(twin.metrics_text())

    def value(fams: dict[str, object], family: str) -> float:
        return fams[family].samples[0].value  # type: ignore[attr-defined]

    assert value(after, "vllm:generation_tokens") < value(before, "vllm:generation_tokens")
    assert value(after, "vllm:generation_tokens_created") > value(before, "vllm:generation_tokens_created")
    assert twin.gpu_state()["gpus"][0]["energy_joules_total"] > 0  # the GPU is not reset


def test_in_process_servers_and_control_endpoints() -> None:
    async def scenario() -> None:
        twins = await start_twins(scenario="decode-heavy", engines=2, gpus=1, engine_format="vllm",
                                  gpu_name="NVIDIA H100 80GB HBM3", model="llama-3.1-8b", seed=3, speed=5.0)
        try:
            assert twins[0].url != twins[1].url
            async with httpx.AsyncClient(timeout=15) as client:
                await asyncio.sleep(0.3)
                r = await client.get(twins[0].url + "/metrics")
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
                assert "vllm:num_requests_running" in _families(r.text)
                gpu = (await client.get(twins[1].url + "/sim/gpu")).json()
                assert gpu["gpus"][0]["index"] == 1 and gpu["scenario"] == "decode-heavy"
                r = await client.post(twins[0].url + "/sim/scenario", json={"scenario": "overload"})
                assert r.status_code == 200
                assert (await client.get(twins[0].url + "/sim/gpu")).json()["scenario"] == "overload"
                assert (await client.post(twins[0].url + "/sim/scenario?name=bogus")).status_code == 400
                for body in ({"scenario": ["overload"]}, {"scenario": 3}, ["overload"]):
                    assert (await client.post(twins[0].url + "/sim/scenario", json=body)).status_code == 400, body
                assert (await client.post(twins[0].url + "/sim/scenario?name=pcie-degraded")).status_code == 409
                assert (await client.post(twins[0].url + "/sim/restart")).json()["restarts"] == 1
                assert (await client.get(twins[0].url + "/nope")).status_code == 404
                refused = await client.get(twins[0].url + "/sim/restart")
                assert refused.status_code == 405 and refused.headers["allow"] == "POST"
                head = await client.head(twins[0].url + "/metrics")
                assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0
                too_big = await client.post(twins[0].url + "/sim/scenario", content=b"{" + b" " * 10_000 + b"}")
                assert too_big.status_code == 400
        finally:
            for t in twins:
                await t.stop()

    asyncio.run(scenario())


def test_every_twin_handler_runs_on_the_event_loop() -> None:
    """The exporter reads /metrics and /sim/gpu of a twin at the same moment every cycle. A plain
    `def` handler run in a thread pool (as FastAPI ran them), and two of them advanced the engine
    concurrently and corrupted it (KV blocks leaked past 100%). The race is too rare to provoke
    reliably in a test, so the guard is structural: every route's handler must be a coroutine
    function."""
    import inspect

    from exporter.simulator.clock import RealtimeClock
    from exporter.simulator.server import build_app

    app = build_app(RealtimeClock(_twin("vllm", seconds=1.0)))
    endpoints = {path: handler for (_, path), handler in app.routes.items()}
    assert {"/metrics", "/sim/gpu", "/sim/scenario", "/sim/restart"} <= set(endpoints)
    assert [path for path, fn in endpoints.items() if not inspect.iscoroutinefunction(fn)] == []


def test_subprocess_twin() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "exporter.simulator", "--port", str(port), "--scenario", "prefill-heavy",
           "--engine-format", "sglang", "--gpu", "NVIDIA L40S", "--model", "qwen2.5-7b", "--gpus", "1", "--seed", "5"]
    with background_process(cmd, f"http://127.0.0.1:{port}/metrics", cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": str(ROOT)}):
        r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        assert "sglang:num_running_reqs" in _families(r.text)
        gpu = httpx.get(f"http://127.0.0.1:{port}/sim/gpu", timeout=2).json()
        assert gpu["gpus"][0]["name"] == "NVIDIA L40S" and gpu["gpus"][0]["nvlink"] is None


# What the simulator may import: itself, the GPU and model specs, the physics (the roofline step cost
# it shares with the planner and the runtime's cost-model check), and the HTTP server it is served by.
# The exporter's app, config, sources and derivations sit above it (exporter.app.run_demo puts the demo
# together), and uvicorn is no longer needed by anything.
SIMULATOR_MAY_IMPORT = ("exporter.simulator", "exporter.specs", "exporter.physics", "exporter.httpserver",
                        "exporter.jsonsafe")


def test_the_simulator_imports_nothing_above_it() -> None:
    import ast

    offending = []
    for path in sorted((ROOT / "exporter" / "simulator").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):  # function-level imports count too
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                inside = name == "exporter" or name.startswith("exporter.")
                if name == "uvicorn" or (inside and not name.startswith(SIMULATOR_MAY_IMPORT)):
                    offending.append(f"{path.name}: {name}")
    assert offending == []
