"""Phase split: prefill and decode tokens/s, phase time shares, mean batch, decode steps/s.

Rates are taken over a short window of reset-safe counters (window.RateWindow), so an engine
restart never shows as a negative or huge spike and one late scrape does not make the rate jump.
"""

from __future__ import annotations

from typing import NamedTuple

from exporter.derive.view import EngineView
from exporter.derive.window import RateWindow
from exporter.snapshot import Labels, Sample

COUNTERS = (
    "llm_prompt_tokens_total", "llm_generation_tokens_total", "llm_prefill_seconds_total",
    "llm_decode_seconds_total", "llm_preemptions_total", "llm_request_prefill_time_seconds_sum",
    "llm_request_decode_time_seconds_sum", "llm_request_prompt_tokens_sum", "llm_request_prompt_tokens_count",
    "llm_request_generation_tokens_sum", "llm_request_generation_tokens_count",
    "llm_e2e_request_latency_seconds_count", "llm_requests_total", "llm_batch_prefill_time_seconds_sum",
    "llm_batch_decode_time_seconds_sum",
)
# Phase time sources, best first: engine time counters and per-batch forward times are engine
# time; per-request times overlap across the batch and so weight decode by the batch size.
PHASE_TIMES = (
    ("llm_prefill_seconds_total", "llm_decode_seconds_total", "engine time counters"),
    ("llm_batch_prefill_time_seconds_sum", "llm_batch_decode_time_seconds_sum", "per-batch forward time"),
    ("llm_request_prefill_time_seconds_sum", "llm_request_decode_time_seconds_sum", "per-request prefill/decode time"),
)
GAUGES = ("llm_requests_running", "llm_requests_waiting")


class Throughput(NamedTuple):
    prefill_tps: float | None = None
    decode_tps: float | None = None
    prefill_share: float | None = None  # of engine time in prefill + decode
    time_source: str = ""  # which counters gave the phase times
    token_source: str = ""  # which counters gave the token rates
    mean_batch: float | None = None
    steps_per_s: float | None = None
    preemptions_per_s: float | None = None
    requests_per_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    mean_request_tokens: float | None = None  # prompt + output of requests finished in the window


def observe(window: RateWindow, engine: EngineView, ts: float) -> None:
    get = engine.sums.get  # what engine.get() reads, without a Python call per name
    counters = {k: v for k in COUNTERS if (v := get(k)) is not None}
    gauges = {k: v for k in GAUGES if (v := get(k)) is not None}
    window.observe(ts, counters, gauges)


def _share(window: RateWindow, prefill_key: str, decode_key: str) -> float | None:
    p, d = window.increase(prefill_key), window.increase(decode_key)
    if p is None or d is None or p[0] + d[0] <= 0:
        return None
    return p[0] / (p[0] + d[0])


def _mean_per_request(window: RateWindow, sum_key: str, count_key: str) -> float | None:
    s, c = window.increase(sum_key), window.increase(count_key)
    if s is None or c is None or c[0] <= 0:
        return None
    return s[0] / c[0]


def steps_per_second(decode_tps: float | None, mean_batch: float | None) -> float | None:
    """Each decode step emits one token per running sequence: steps/s = tokens/s / batch."""
    if decode_tps is None or mean_batch is None:
        return None
    if mean_batch <= 0:
        return 0.0 if decode_tps <= 0 else None
    return decode_tps / max(mean_batch, 1.0)


def compute(engine: EngineView, window: RateWindow) -> Throughput:
    share, time_source = None, ""
    for prefill_key, decode_key, what in PHASE_TIMES:
        share = _share(window, prefill_key, decode_key)
        if share is not None:
            time_source = what
            break
    prefill_tps = window.rate("llm_prompt_tokens_total")
    decode_tps = window.rate("llm_generation_tokens_total")
    token_source = "token counters"
    if prefill_tps is None and decode_tps is None:
        # Engines without token counters (TGI): tokens of the requests that finished, which lag
        # by one request's duration but average to the same rate.
        prefill_tps = window.rate("llm_request_prompt_tokens_sum")
        decode_tps = window.rate("llm_request_generation_tokens_sum")
        token_source = "finished requests' token histograms"
    mean_batch = window.mean("llm_requests_running")
    prompt = _mean_per_request(window, "llm_request_prompt_tokens_sum", "llm_request_prompt_tokens_count")
    output = _mean_per_request(window, "llm_request_generation_tokens_sum", "llm_request_generation_tokens_count")
    requests = window.rate("llm_e2e_request_latency_seconds_count")
    if requests is None:
        requests = window.rate("llm_requests_total")
    return Throughput(
        prefill_tps=prefill_tps,
        decode_tps=decode_tps,
        token_source=token_source if decode_tps is not None or prefill_tps is not None else "",
        prefill_share=share,
        time_source=time_source,
        mean_batch=mean_batch,
        steps_per_s=steps_per_second(decode_tps, mean_batch),
        preemptions_per_s=window.rate("llm_preemptions_total"),
        requests_per_s=requests,
        running=engine.get("llm_requests_running"),
        waiting=engine.get("llm_requests_waiting"),
        mean_request_tokens=(prompt + output) if prompt is not None and output is not None else None,
    )


def samples(tp: Throughput, labels: Labels) -> list[Sample]:
    out: list[Sample] = []
    for name, value in (("llm_prefill_tokens_per_second", tp.prefill_tps),
                        ("llm_decode_tokens_per_second", tp.decode_tps),
                        ("llm_mean_batch_size", tp.mean_batch),
                        ("llm_decode_steps_per_second", tp.steps_per_s)):
        if value is not None:
            out.append(Sample(name, labels, value))
    if tp.prefill_share is not None:
        out.append(Sample("llm_phase_time_ratio", tuple(sorted(labels + (("phase", "prefill"),))), tp.prefill_share))
        out.append(Sample("llm_phase_time_ratio", tuple(sorted(labels + (("phase", "decode"),))),
                          1.0 - tp.prefill_share))
    return out
