"""Exposition parser throughput: ours against prometheus_client.parser on a vLLM V1-shaped page.

The payload is rendered by prometheus_client itself from the metric set vLLM V1 registers
(histograms with its bucket bounds, counters with `_created`, gauges, cache_config_info), labelled
`model_name` and `engine` for several data-parallel engines and models, so it has the real shape:
long repeated label blocks on every bucket line, HELP/TYPE comments, exponent-formatted values.
"""

from __future__ import annotations

import gc
import random
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.engines.exposition import LabelCache, parse

MIN_PAYLOAD_BYTES = 200 * 1024
ROUNDS = 9

_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
         20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
        40.0, 80.0]
_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
            240.0, 480.0, 960.0, 1920.0, 7680.0]
_TOKENS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 131072]
_ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]

_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": _TTFT,
    "vllm:inter_token_latency_seconds": _ITL,
    "vllm:request_time_per_output_token_seconds": _ITL,
    "vllm:e2e_request_latency_seconds": _LATENCY,
    "vllm:request_queue_time_seconds": _LATENCY,
    "vllm:request_inference_time_seconds": _LATENCY,
    "vllm:request_prefill_time_seconds": _LATENCY,
    "vllm:request_decode_time_seconds": _LATENCY,
    "vllm:request_prompt_tokens": _TOKENS,
    "vllm:request_generation_tokens": _TOKENS,
    "vllm:request_max_num_generation_tokens": _TOKENS,
    "vllm:request_params_max_tokens": _TOKENS,
    "vllm:iteration_tokens_total": _ITERATION,
    "vllm:request_params_n": [1, 2, 5, 10, 20],
}
_COUNTERS = ["vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions",
             "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"]
_GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
_MODELS = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-72B-Instruct"]


def vllm_v1_payload(engines: int = 4) -> str:
    """A vLLM V1 /metrics page for `engines` data-parallel engines per model (about 60 KB each)."""
    rng = random.Random(42)
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    series = [(model, str(engine)) for model in _MODELS for engine in range(engines)]
    for name in _GAUGES:
        gauge = Gauge(name, f"{name} gauge.", labels, registry=registry)
        for label_values in series:
            gauge.labels(*label_values).set(rng.random() * 100)
    for name in _COUNTERS:
        counter = Counter(name, f"{name} counter.", labels, registry=registry)
        for label_values in series:
            counter.labels(*label_values).inc(rng.randrange(1, 10**7))
    success = Counter("vllm:request_success", "Finished requests.", [*labels, "finished_reason"],
                      registry=registry)
    for label_values in series:
        for reason in ("stop", "length", "abort", "error"):
            success.labels(*label_values, reason).inc(rng.randrange(0, 10**5))
    for name, buckets in _HISTOGRAMS.items():
        histogram = Histogram(name, f"{name} histogram.", labels, buckets=buckets, registry=registry)
        for label_values in series:
            child = histogram.labels(*label_values)
            top = buckets[-1]
            for _ in range(40):
                child.observe(rng.random() ** 3 * top * 1.2)
    info = Gauge("vllm:cache_config_info", "Cache config.", ["block_size", "cache_dtype", "engine",
                 "gpu_memory_utilization", "num_gpu_blocks", "enable_prefix_caching"], registry=registry)
    for engine in range(engines):
        info.labels("16", "auto", str(engine), "0.9", "81767", "True").set(1)
    return generate_latest(registry).decode()


def measure(payload: str, rounds: int = ROUNDS) -> dict[str, float]:
    """Best-of-`rounds` seconds for each parser. The three are timed in turn within each round, so
    a noisy neighbour slows them alike instead of skewing the ratio."""
    megabytes = len(payload.encode()) / 1e6

    def reference() -> int:
        return sum(len(family.samples) for family in text_string_to_metric_families(payload))

    def ours_cold() -> int:
        return len(parse(payload, label_cache=LabelCache()).samples)

    warm = LabelCache()
    parse(payload, label_cache=warm)

    def ours_warm() -> int:
        return len(parse(payload, label_cache=warm).samples)

    contenders = {"reference": reference, "cold": ours_cold, "warm": ours_warm}
    counts = {function() for function in contenders.values()}
    if len(counts) != 1:
        raise AssertionError(f"parsers disagree on the sample count: {counts}")
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for key, function in contenders.items():
            gc.collect()
            start = time.perf_counter()
            function()
            best[key] = min(best[key], time.perf_counter() - start)
    return {
        "kb": len(payload.encode()) / 1024,
        "samples": counts.pop(),
        "reference_mb_s": megabytes / best["reference"],
        "cold_mb_s": megabytes / best["cold"],
        "warm_mb_s": megabytes / best["warm"],
    }


def run() -> list[tuple[str, str]]:
    engines = 1
    payload = vllm_v1_payload(engines)
    while len(payload.encode()) < MIN_PAYLOAD_BYTES:
        engines += 1
        payload = vllm_v1_payload(engines)
    result = measure(payload)
    return [
        ("parser payload (vLLM V1 shape)", f"{result['kb']:.0f} KB, {result['samples']} samples"),
        ("prometheus_client.parser", f"{result['reference_mb_s']:.1f} MB/s"),
        ("ours, cold label cache", f"{result['cold_mb_s']:.1f} MB/s"),
        ("ours, warm label cache", f"{result['warm_mb_s']:.1f} MB/s"),
        ("ratio, cold cache (target >= 20x)", f"{result['cold_mb_s'] / result['reference_mb_s']:.1f}x"),
        ("ratio, warm cache (target >= 20x)", f"{result['warm_mb_s'] / result['reference_mb_s']:.1f}x"),
    ]


if __name__ == "__main__":
    for label, value in run():
        print(f"{label:40} {value}")
