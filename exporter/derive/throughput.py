"""Phase split: prefill and decode tokens/s, phase time shares, mean batch, decode steps/s.

Rates are taken over a short window of reset-safe counters (window.RateWindow), so an engine
restart never shows as a negative or huge spike and one late scrape does not make the rate jump.
Resets are handled per data-parallel rank (per series) before the ranks are summed.

Prompt tokens served from the prefix cache are counted in the prompt-token counters (vLLM,
SGLang) but never computed: the prefill tokens the GPU computes are the prompt tokens less the
prefix-cache hits (llm_prefix_cache_hits_total, in tokens), or, for engines that only report a
hit ratio gauge, the prompt tokens x (1 - hit ratio). MFU is taken on those.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, ScopedWindows, Stage, TargetKey, rounded
from exporter.derive.view import PREFIX_HIT_RATIO, EngineView, ProbeView
from exporter.derive.window import RateWindow
from exporter.snapshot import Sample

# The engine counters the rates are taken of (reset-safe, per series) and the gauges averaged
# over the window: what this stage declares it reads, so also what the view keeps.
COUNTERS = (
    "llm_prompt_tokens_total", "llm_generation_tokens_total", "llm_prefill_seconds_total",
    "llm_decode_seconds_total", "llm_preemptions_total", "llm_request_prefill_time_seconds_sum",
    "llm_request_decode_time_seconds_sum", "llm_request_prompt_tokens_sum", "llm_request_prompt_tokens_count",
    "llm_request_generation_tokens_sum", "llm_request_generation_tokens_count",
    "llm_batch_prefill_time_seconds_sum", "llm_batch_decode_time_seconds_sum", "llm_prefix_cache_hits_total",
    "llm_engine_steps_total", "llm_spec_decode_draft_tokens_total", "llm_spec_decode_accepted_tokens_total",
    "llm_engine_estimated_flops_total", "llm_engine_estimated_read_bytes_total",
    "llm_engine_estimated_write_bytes_total",
)
_COUNTERS = frozenset(COUNTERS)
HIT_RATIO = PREFIX_HIT_RATIO
# Phase time sources, best first: per-batch forward times are engine time; per-request times
# (histograms, or llama.cpp's per-slot time counters) overlap across the batch and so weight
# decode by the batch size.
PHASE_TIMES = (
    ("llm_batch_prefill_time_seconds_sum", "llm_batch_decode_time_seconds_sum", "per-batch forward time"),
    ("llm_request_prefill_time_seconds_sum", "llm_request_decode_time_seconds_sum", "per-request prefill/decode time"),
    ("llm_prefill_seconds_total", "llm_decode_seconds_total", "per-slot time counters"),
)
GAUGES = ("llm_requests_running", "llm_requests_waiting", "llm_requests_running_max")
# The client probe's own share of the engine's work (its tokens and its one request), kept in the
# same window as the engine's counters so both rates cover the same span.
PROBE_TOKENS, PROBE_IN_FLIGHT = "probe:tokens", "probe:in_flight"


class Throughput(NamedTuple):
    prefill_tps: float | None = None
    decode_tps: float | None = None
    prefill_share: float | None = None  # of engine time in prefill + decode
    time_source: str = ""  # which counters gave the phase times
    mean_batch: float | None = None
    steps_per_s: float | None = None
    preemptions_per_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    mean_waiting: float | None = None
    peak_running: float | None = None  # the most requests running at once in the window
    running_cap: float | None = None  # the engine's configured maximum, where it reports one
    mean_request_tokens: float | None = None  # prompt + output of requests finished in the window
    mean_prompt_tokens: float | None = None  # prompt length of requests finished in the window
    requests_per_s: float | None = None  # requests finished per second in the window
    # Prompt tokens/s the GPU computes: prefill_tps less prefix-cache hits (== prefill_tps when the
    # engine reports no prefix cache), and the share of prompt tokens the cache served.
    prefill_computed_tps: float | None = None
    prefix_hit_share: float | None = None
    spec_acceptance: float | None = None  # draft tokens accepted / proposed in the window
    # The engine's own estimates per GPU (vLLM estimated_*_per_gpu_total), as rates.
    engine_flops_per_gpu: float | None = None
    engine_bytes_per_gpu: float | None = None
    # The probe's (--probe) part of the above: its tokens/s, its request now and on average.
    probe_tps: float = 0.0
    probe_running: float = 0.0
    probe_mean_running: float = 0.0


def observe(window: RateWindow, engine: EngineView, ts: float, probe: ProbeView | None = None) -> None:
    get = engine.sums.get  # what engine.get() reads, without a Python call per name
    series = engine.series
    if series is None:  # one series per name
        counters: dict = {k: v for k in COUNTERS if (v := get(k)) is not None}
    else:  # per (name, series): a reset of one rank is handled before the ranks are summed
        counters = {k: v for k, v in series.items() if k[0] in _COUNTERS}
    gauges = {k: v for k in GAUGES if (v := get(k)) is not None}
    if engine.prefix_hit_ratio is not None:
        gauges[HIT_RATIO] = engine.prefix_hit_ratio
    # Zeros until the probe's first request ends (or with no probe): the window's baseline for the
    # probe is then 0, so the tokens of its first request are subtracted like those of the others.
    counters[PROBE_TOKENS] = probe.tokens if probe is not None else 0.0
    gauges[PROBE_IN_FLIGHT] = probe.in_flight if probe is not None else 0.0
    window.observe(ts, counters, gauges)


def computed_prefill(prefill_tps: float | None, hits_tps: float | None, hit_ratio: float | None
                     ) -> tuple[float | None, float | None]:
    """(prompt tokens/s computed, share served by the prefix cache): the hit tokens when the
    engine counts them, else its hit ratio gauge."""
    if prefill_tps is None:
        return None, None
    if hits_tps is not None:
        computed = min(prefill_tps, max(0.0, prefill_tps - hits_tps))
        share = 1.0 - computed / prefill_tps if prefill_tps > 0 else None
        return computed, share
    if hit_ratio is not None and 0.0 <= hit_ratio <= 1.0:
        return prefill_tps * (1.0 - hit_ratio), hit_ratio
    return prefill_tps, None


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


def compute(engine: EngineView, window: RateWindow, probe: ProbeView | None = None) -> Throughput:
    share, time_source = None, ""
    for prefill_key, decode_key, what in PHASE_TIMES:
        share = _share(window, prefill_key, decode_key)
        if share is not None:
            time_source = what
            break
    prefill_tps = window.rate("llm_prompt_tokens_total")
    decode_tps = window.rate("llm_generation_tokens_total")
    if prefill_tps is None and decode_tps is None:
        # Engines without token counters (TGI): tokens of the requests that finished, which lag
        # by one request's duration but average to the same rate.
        prefill_tps = window.rate("llm_request_prompt_tokens_sum")
        decode_tps = window.rate("llm_request_generation_tokens_sum")
    if engine.role == "decode":
        # A decode instance counts the prompts whose KV it imported from its prefill partner: it
        # computed none of them, so it has no prefill rate (nor MFU) of its own.
        prefill_tps = None
    computed, hit_share = computed_prefill(
        prefill_tps, window.rate("llm_prefix_cache_hits_total"), window.mean(HIT_RATIO))
    mean_batch = window.mean("llm_requests_running")
    # An engine that counts its forward passes gives steps/s directly; otherwise one decode step
    # emits a token per running sequence.
    steps = window.rate("llm_engine_steps_total")
    drafted = window.increase("llm_spec_decode_draft_tokens_total")
    accepted = window.increase("llm_spec_decode_accepted_tokens_total")
    acceptance = None
    if drafted is not None and accepted is not None and drafted[0] > 0:
        acceptance = min(1.0, max(0.0, accepted[0] / drafted[0]))
    read = window.rate("llm_engine_estimated_read_bytes_total")
    write = window.rate("llm_engine_estimated_write_bytes_total")
    prompt = _mean_per_request(window, "llm_request_prompt_tokens_sum", "llm_request_prompt_tokens_count")
    output = _mean_per_request(window, "llm_request_generation_tokens_sum", "llm_request_generation_tokens_count")
    finished = window.rate("llm_request_generation_tokens_count")
    return Throughput(
        prefill_tps=prefill_tps,
        decode_tps=decode_tps,
        prefill_share=share,
        time_source=time_source,
        mean_batch=mean_batch,
        steps_per_s=steps if steps is not None else steps_per_second(decode_tps, mean_batch),
        preemptions_per_s=window.rate("llm_preemptions_total"),
        running=engine.get("llm_requests_running"),
        waiting=engine.get("llm_requests_waiting"),
        mean_waiting=window.mean("llm_requests_waiting"),
        peak_running=window.max("llm_requests_running"),
        running_cap=engine.get("llm_requests_running_max"),
        mean_request_tokens=(prompt + output) if prompt is not None and output is not None else None,
        mean_prompt_tokens=prompt,
        requests_per_s=finished if finished is not None else window.rate("llm_request_prompt_tokens_count"),
        prefill_computed_tps=computed,
        prefix_hit_share=hit_share,
        spec_acceptance=acceptance,
        engine_flops_per_gpu=window.rate("llm_engine_estimated_flops_total"),
        engine_bytes_per_gpu=None if read is None and write is None else (read or 0.0) + (write or 0.0),
        probe_tps=window.rate(PROBE_TOKENS) or 0.0,
        probe_running=probe.in_flight if probe is not None else 0.0,
        probe_mean_running=window.mean(PROBE_IN_FLIGHT) or 0.0,
    )


def samples(tp: Throughput, key: TargetKey) -> list[Sample]:
    labels = key.labels
    out: list[Sample] = []
    for name, value in (("llm_prefill_tokens_per_second", tp.prefill_tps),
                        ("llm_decode_tokens_per_second", tp.decode_tps),
                        ("llm_mean_batch_size", tp.mean_batch),
                        ("llm_decode_steps_per_second", tp.steps_per_s),
                        ("llm_spec_decode_acceptance_ratio", tp.spec_acceptance)):
        if value is not None:
            out.append(Sample(name, labels, value))
    if tp.prefill_share is not None:
        out.append(Sample("llm_phase_time_ratio", tuple(sorted(labels + (("phase", "prefill"),))), tp.prefill_share))
        out.append(Sample("llm_phase_time_ratio", tuple(sorted(labels + (("phase", "decode"),))),
                          1.0 - tp.prefill_share))
    return out


def numbers(tp: Throughput) -> dict[str, Any]:
    return dict(prefill_tokens_per_second=rounded(tp.prefill_tps, 2),
                decode_tokens_per_second=rounded(tp.decode_tps, 2),
                prefill_time_share=rounded(tp.prefill_share), mean_batch=rounded(tp.mean_batch, 2),
                decode_steps_per_second=rounded(tp.steps_per_s, 2), running=tp.running, waiting=tp.waiting,
                preemptions_per_second=rounded(tp.preemptions_per_s),
                prefill_computed_tokens_per_second=rounded(tp.prefill_computed_tps, 2),
                prefix_cache_hit_share=rounded(tp.prefix_hit_share),
                spec_decode_acceptance=rounded(tp.spec_acceptance),
                probe_tokens_per_second=rounded(tp.probe_tps, 2))


def _rates(settings: DeriveSettings) -> ScopedWindows:
    """One rate window per target."""
    return ScopedWindows(settings, lambda: RateWindow(settings.rate_window_s))


def _compute(ctx: Ctx, state: ScopedWindows) -> Throughput:
    window = state.windows.get(ctx.engine.target)
    probe = ctx.view.probes.get(ctx.engine.target)
    observe(window, ctx.engine, ctx.now, probe)
    return compute(ctx.engine, window, probe)


STAGE = Stage(
    name="throughput", compute=_compute, samples=samples, numbers=numbers, state=_rates,
    emits=("llm_prefill_tokens_per_second", "llm_decode_tokens_per_second", "llm_mean_batch_size",
           "llm_decode_steps_per_second", "llm_spec_decode_acceptance_ratio", "llm_phase_time_ratio"),
    engine=(*COUNTERS, *GAUGES, HIT_RATIO),
)
