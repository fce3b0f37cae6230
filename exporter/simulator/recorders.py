"""Engine-format metric recorders: the twin's /metrics pages, with each engine's real names,
labels, bucket bounds and quirks (shared/reference/engines.md).

vLLM and SGLang use prometheus_client, so their pages are rendered by prometheus_client itself
(`_created` samples, `_total` handling and number formatting come out exactly as the engines').
TGI (Rust metrics-exporter-prometheus) and llama.cpp (hand-written C++) are formatted by hand.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample as PromSample
from prometheus_client.utils import floatToGoString

from exporter.simulator.engine import EngineState, Request, StepRecord

FORMATS = ("vllm", "sglang", "tgi", "llamacpp")

# --- bucket bounds ---------------------------------------------------------------------------
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
VLLM_PARAMS_N = (1, 2, 5, 10, 20)

SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
              0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
SGLANG_QUEUE = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500,
                600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)
SGLANG_RETRACTIONS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 75, 100)
# PD disaggregation (sglang/srt/observability/metrics_collector.py, 0.5.23): observed on the prefill
# instance when a request's KV has been sent, latency from its entry into the inflight queue.
SGLANG_KV_TRANSFER_LATENCY_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
SGLANG_KV_TRANSFER_TOTAL_MB = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)
SGLANG_KV_TRANSFER_SPEED_GB_S = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)

# vLLM NIXL connector (distributed/kv_transfer/kv_connector/v1/nixl/stats.py, 0.34.0): observed by
# the KV consumer (decode), which reads the KV from the producer.
VLLM_NIXL_TIME = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
VLLM_NIXL_XFER_TIME = VLLM_NIXL_TIME[1:]
VLLM_NIXL_BYTES = tuple(2 ** (10 + i) for i in range(1, 25, 2))
VLLM_NIXL_DESCRIPTORS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
VLLM_NIXL_POST_S = 50e-6  # posting one transfer (descriptor list to the NIXL agent)
# vllm/v1/metrics/stats.py KV_FETCH_STAGES, in the order vLLM creates them.
VLLM_KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
MiB = 1 << 20

# TGI: metrics-exporter-prometheus Matcher::Suffix("duration"): 0.0001 x 1.5^k, k = 1..35.
TGI_DURATION = tuple(0.0001 * 1.5**k for k in range(1, 36))
TGI_SUMMARY_QUANTILES = (0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return tuple(out)
            out.append(v)
        exponent += 1


def linear_buckets(maximum: int, steps: int = 100) -> tuple[float, ...]:
    step = maximum / steps
    return tuple(step * i for i in range(1, steps + 1))


class Hist:
    """A histogram with fixed upper bounds (le semantics); counts are per bucket, cumulated on render."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[float, int]]:
        out: list[tuple[float, int]] = []
        running = 0
        for bound, c in zip(self.bounds + (float("inf"),), self.counts, strict=True):
            running += c
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile q (what a dashboard can read back)."""
        if self.count == 0:
            return float("nan")
        rank = q * self.count
        for bound, cum in self.cumulative():
            if cum >= rank:
                return bound
        return float("inf")


# --- prometheus_client rendering helpers -----------------------------------------------------

class _Families:
    """Collects prometheus_client families for one render."""

    def __init__(self, labels: dict[str, str], created: float) -> None:
        self.names = list(labels)
        self.values = list(labels.values())
        self.created = created
        self.out: list[Metric] = []

    def gauge(self, name: str, doc: str, value: float) -> None:
        g = GaugeMetricFamily(name, doc, labels=self.names)
        g.add_metric(self.values, value)
        self.out.append(g)

    def counter(self, name: str, doc: str, value: float, *, created: bool = True,
                extra: Iterable[tuple[dict[str, str], float]] = ()) -> None:
        extra = list(extra)
        extra_names = list(extra[0][0]) if extra else []
        c = CounterMetricFamily(name, doc, labels=self.names + extra_names)
        if extra:
            for lab, v in extra:
                c.add_metric(self.values + list(lab.values()), v, created=self.created if created else None)
        else:
            c.add_metric(self.values, value, created=self.created if created else None)
        self.out.append(c)

    def histogram(self, name: str, doc: str, h: Hist, *, created: bool = True) -> None:
        fam = HistogramMetricFamily(name, doc, labels=self.names)
        fam.add_metric(self.values, [(floatToGoString(b), c) for b, c in h.cumulative()], h.sum)
        if created:
            fam.samples.append(PromSample(name + "_created", dict(zip(self.names, self.values, strict=True)),
                                          self.created))
        self.out.append(fam)

    def render(self) -> str:
        return _exposition(self.out)


def _exposition(families: list[Metric]) -> str:
    class _Collector:
        def collect(self) -> Iterable[Metric]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry).decode()


def render_merged(pages: list[list[Metric]]) -> str:
    """One exposition of several engines' families (vLLM's data-parallel engines behind one API
    server): each family once, with every engine's samples, in the first engine's order."""
    merged: dict[str, Metric] = {}
    for families in pages:
        for family in families:
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family
    return _exposition(list(merged.values()))


# --- recorders -----------------------------------------------------------------------------

class Recorder:
    """Base: ignores every event. Subclasses keep what their engine exports."""

    fmt = "none"
    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, model_name: str, created_epoch: float, epoch_offset: float) -> None:
        self.model_name = model_name
        self.created = created_epoch  # when the engine (re)started, wall-clock seconds
        self.epoch_offset = epoch_offset  # engine time + offset = wall-clock seconds

    def on_arrival(self, req: Request, now: float) -> None:
        pass

    def on_step(self, rec: StepRecord) -> None:
        pass

    def on_itl(self, value: float, count: int) -> None:
        pass

    def on_first_token(self, req: Request, now: float) -> None:
        pass

    def on_finish(self, req: Request, now: float, reason: str) -> None:
        pass

    def on_preempt(self, req: Request, now: float) -> None:
        pass

    def on_prefix_cache(self, queries: int, hits: int) -> None:
        pass

    def on_abort(self, req: Request, now: float) -> None:
        pass

    def on_kv_sent(self, req: Request, now: float) -> None:
        pass

    def on_kv_received(self, req: Request, now: float) -> None:
        pass

    def render(self, state: EngineState, info: dict[str, str]) -> str:
        """The engine's /metrics page in its own format; every engine format overrides this."""
        raise TypeError(f"{type(self).__name__} does not render an engine format")

    def families(self, state: EngineState, info: dict[str, str]) -> list[Metric]:
        """The page as families, for render_merged over data-parallel engines: only a format with data
        parallelism overrides this (the vllm one; Twin refuses data_parallel > 1 for the others)."""
        raise TypeError(f"{type(self).__name__} has no data-parallel page")

    def headers(self) -> dict[str, str]:
        return {}


class VllmRecorder(Recorder):
    """vLLM V1 (vllm/v1/metrics/loggers.py, ~0.11-0.12)."""

    fmt = "vllm"

    def __init__(self, model_name: str, created_epoch: float, epoch_offset: float, *, max_model_len: int,
                 engine_index: str = "0", role: str = "both") -> None:
        super().__init__(model_name, created_epoch, epoch_offset)
        self.engine_index = engine_index
        # PD: a NixlConnector instance (kv_producer for prefill, kv_consumer for decode).
        self.role = role
        self.prompt_by_source = {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 0}
        self.nixl = {"xfer": Hist(VLLM_NIXL_XFER_TIME), "post": Hist(VLLM_NIXL_TIME), "bytes": Hist(VLLM_NIXL_BYTES),
                     "descriptors": Hist(VLLM_NIXL_DESCRIPTORS)}
        self.block_size = 16
        tokens = buckets_1_2_5(max_model_len)
        self.h = {
            "ttft": Hist(VLLM_TTFT), "itl": Hist(VLLM_ITL), "tpot": Hist(VLLM_ITL),
            "e2e": Hist(VLLM_REQUEST_LATENCY), "queue": Hist(VLLM_REQUEST_LATENCY),
            "inference": Hist(VLLM_REQUEST_LATENCY), "prefill": Hist(VLLM_REQUEST_LATENCY),
            "decode": Hist(VLLM_REQUEST_LATENCY), "prompt": Hist(tokens), "generation": Hist(tokens),
            "max_gen": Hist(tokens), "params_max_tokens": Hist(tokens), "params_n": Hist(VLLM_PARAMS_N),
            "iteration": Hist(VLLM_ITERATION_TOKENS),
        }
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        # vLLM's own roofline estimates per GPU (--enable-mfu-metrics): the twin's step costs.
        self.flops = self.read_bytes = 0.0

    def on_step(self, rec: StepRecord) -> None:
        self.h["iteration"].observe(rec.decode_seqs + rec.prefill_tokens)
        self.flops += rec.cost.flops_per_gpu
        self.read_bytes += rec.cost.bytes_per_gpu

    def on_itl(self, value: float, count: int) -> None:
        self.h["itl"].observe(value, count)
        self.generation_tokens += count

    def on_first_token(self, req: Request, now: float) -> None:
        self.h["ttft"].observe(now - req.arrival)
        self.h["queue"].observe(req.first_scheduled - req.ready_at)
        self.h["prefill"].observe(now - req.first_scheduled)
        self.prompt_tokens += req.prompt
        self.generation_tokens += 1
        # PromptTokenStats: a KV consumer's prompts arrive by the connector, not computed here.
        if req.kv_done_at >= 0 and self.role == "decode":
            self.prompt_by_source["external_kv_transfer"] += req.prompt
        else:
            self.prompt_by_source["local_cache_hit"] += req.cached
            self.prompt_by_source["local_compute"] += req.prompt - req.cached

    def on_finish(self, req: Request, now: float, reason: str) -> None:
        h = self.h
        if self.role == "prefill" and req.first_token >= 0:
            # A KV producer's request is done in vLLM's stats at its first token (max_tokens 1 on the
            # prefill side); its blocks stay held until the consumer has read them, which the
            # connector's families count, not the request's decode time.
            now = req.first_token
        h["e2e"].observe(now - req.arrival)
        h["inference"].observe(now - req.first_scheduled)
        h["decode"].observe(now - req.first_token)
        if req.generated > 1:
            h["tpot"].observe((now - req.first_token) / (req.generated - 1))
        h["prompt"].observe(req.prompt)
        h["generation"].observe(req.generated)
        h["max_gen"].observe(req.generated)
        h["params_max_tokens"].observe(req.max_tokens)
        h["params_n"].observe(1)
        self.success[reason] += 1

    def on_abort(self, req: Request, now: float) -> None:
        # vLLM counts a request its client dropped under finished_reason="abort"; its tokens so far
        # were counted as they came.
        self.success["abort"] += 1

    def on_preempt(self, req: Request, now: float) -> None:
        self.preemptions += 1

    def on_prefix_cache(self, queries: int, hits: int) -> None:
        self.prefix_queries += queries
        self.prefix_hits += hits

    def on_kv_received(self, req: Request, now: float) -> None:
        # The consumer posts its read at once; the transport's FIFO holds it behind earlier ones, so
        # the transfer's duration (post to completion) includes that wait.
        n = self.nixl
        n["xfer"].observe(now - req.kv_handoff_at)
        n["post"].observe(VLLM_NIXL_POST_S)
        n["bytes"].observe(req.kv_bytes)
        n["descriptors"].observe(-(-req.prompt // self.block_size))

    def render(self, state: EngineState, info: dict[str, str]) -> str:
        return _exposition(self.families(state, info))

    def families(self, state: EngineState, info: dict[str, str]) -> list[Metric]:
        f = _Families({"model_name": self.model_name, "engine": self.engine_index}, self.created)
        cfg = _Families({"engine": self.engine_index}, self.created)
        # As vLLM >= 0.33: num_gpu_blocks is summed over the data-parallel engines by the API server
        # (every engine's series repeats the sum), kv_cache_size_tokens is this engine's own.
        dp = int(info.get("data_parallel", "1"))
        cache_labels = {
            "block_size": str(state.block_size), "cache_dtype": "auto", "calculate_kv_scales": "False",
            "cpu_offload_gb": "0", "enable_prefix_caching": info.get("enable_prefix_caching", "True"),
            "gpu_memory_utilization": info.get("gpu_memory_utilization", "0.9"), "is_attention_free": "False",
            "kv_cache_size_tokens": str(state.kv_blocks_total * state.block_size),
            "num_cpu_blocks": "0", "num_gpu_blocks": str(state.kv_blocks_total * dp),
            "num_gpu_blocks_override": "None", "sliding_window": "None", "swap_space_bytes": "0",
        }
        info_fam = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                     labels=list(cache_labels) + ["engine"])
        info_fam.add_metric(list(cache_labels.values()) + [self.engine_index], 1.0)
        cfg.out.append(info_fam)
        f.out.extend(cfg.out)
        f.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", state.running)
        # A KV consumer's requests waiting for their remote KV are in its waiting count (scheduler.py
        # get_request_counts: waiting + async_kv_waiting), broken down by vllm:num_requests_kv_fetch_by_stage.
        waiting = state.waiting + (state.kv_receiving + state.kv_arrived_waiting if self.role == "decode" else 0)
        f.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        f.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                state.kv_blocks_used / state.kv_blocks_total if state.kv_blocks_total else 0.0)
        f.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                  self.prefix_queries)
        f.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                  self.prefix_hits)
        f.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", self.preemptions)
        f.counter("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU "
                  "(for Model Flops Utilization calculations).", self.flops)
        f.counter("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU "
                  "(for Model Flops Utilization calculations).", self.read_bytes)
        f.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        f.counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", 0,
                  extra=[({"source": k}, float(v)) for k, v in self.prompt_by_source.items()])
        f.counter("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens)
        f.counter("vllm:request_success", "Count of successfully processed requests.", 0,
                  extra=[({"finished_reason": r}, float(v)) for r, v in self.success.items()])
        h = self.h
        f.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", h["prompt"])
        f.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", h["generation"])
        f.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", h["iteration"])
        f.histogram("vllm:request_max_num_generation_tokens",
                    "Histogram of maximum number of requested generation tokens.", h["max_gen"])
        f.histogram("vllm:request_params_n", "Histogram of the n request parameter.", h["params_n"])
        f.histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                    h["params_max_tokens"])
        f.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", h["ttft"])
        f.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", h["itl"])
        f.histogram("vllm:request_time_per_output_token_seconds",
                    "Histogram of time_per_output_token_seconds per request.", h["tpot"])
        f.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", h["e2e"])
        f.histogram("vllm:request_queue_time_seconds",
                    "Histogram of time spent in WAITING phase for request.", h["queue"])
        f.histogram("vllm:request_inference_time_seconds",
                    "Histogram of time spent in RUNNING phase for request.", h["inference"])
        f.histogram("vllm:request_prefill_time_seconds",
                    "Histogram of time spent in PREFILL phase for request.", h["prefill"])
        f.histogram("vllm:request_decode_time_seconds",
                    "Histogram of time spent in DECODE phase for request.", h["decode"])
        if self.role != "both":
            self.block_size = state.block_size
            self._pd_families(f, state)
        return f.out

    def _pd_families(self, f: _Families, state: EngineState) -> None:
        """A NixlConnector instance: the connector's families on both (created per engine, so at 0 on
        the producer), the KV-fetch stages on the consumer only (loggers.py, `is_kv_consumer`)."""
        if self.role == "decode":
            stages = GaugeMetricFamily(
                "vllm:num_requests_kv_fetch_by_stage",
                "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs "
                "an async KV load that has not started; 'in_progress' = load started and not yet reported "
                "finished; 'completed_waiting' = load finished, request not running yet.",
                labels=f.names + ["stage"])
            for stage, value in zip(VLLM_KV_FETCH_STAGES, (0, state.kv_receiving, state.kv_arrived_waiting),
                                    strict=True):
                stages.add_metric(f.values + [stage], value)
            f.out.append(stages)
        n = self.nixl
        f.histogram("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.",
                    n["xfer"])
        f.histogram("vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers.",
                    n["post"])
        f.histogram("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.",
                    n["bytes"])
        f.histogram("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL  KV Cache transfers.",
                    n["descriptors"])
        f.counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers, including handshake "
                  "and notification failures. NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
                  0)
        f.counter("vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications. Retained "
                  "for compatibility; these failures are also included in vllm:nixl_num_failed_transfers.", 0)
        f.counter("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire. NOTE: This "
                  "metric is tracked on the P instance.", 0)
        f.counter("vllm:nixl_num_notifications_after_expiry", "Number of completion notifications for requests "
                  "that were no longer tracked, usually because their KV lease expired. The KV blocks may have "
                  "been reused before the transfer finished. Counted per notification (one per remote rank), "
                  "not per request.", 0)


class SglangRecorder(Recorder):
    """SGLang (python/sglang/srt/metrics/collector.py, 2026)."""

    fmt = "sglang"

    def __init__(self, model_name: str, created_epoch: float, epoch_offset: float, *, role: str = "both") -> None:
        super().__init__(model_name, created_epoch, epoch_offset)
        self.role = role  # PD: --disaggregation-mode prefill | decode; engine_type as upstream sets it
        self.kv = {"latency": Hist(SGLANG_KV_TRANSFER_LATENCY_MS), "mb": Hist(SGLANG_KV_TRANSFER_TOTAL_MB),
                   "speed": Hist(SGLANG_KV_TRANSFER_SPEED_GB_S)}
        self.h = {"ttft": Hist(SGLANG_TTFT), "itl": Hist(SGLANG_ITL), "tpot": Hist(SGLANG_ITL), "e2e": Hist(SGLANG_E2E),
                  "queue": Hist(SGLANG_QUEUE), "retractions": Hist(SGLANG_RETRACTIONS)}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        self.retracted = 0
        self.aborted = 0
        self.retracted_in = 0
        self.retracted_out = 0
        self.recent_retracted = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._gen_window: deque[tuple[float, int]] = deque(maxlen=40)  # SGLang logs every 40 decode steps

    def on_step(self, rec: StepRecord) -> None:
        if rec.decode_seqs:
            self._gen_window.append((rec.duration_s, rec.decode_seqs))

    def on_itl(self, value: float, count: int) -> None:
        # SGLang's quirk: the whole interval goes to _sum once per batch entry, count adds tokens.
        h = self.h["itl"]
        h.counts[bisect_left(h.bounds, value)] += count
        h.sum += value * count
        h.count += count

    def on_first_token(self, req: Request, now: float) -> None:
        self.h["ttft"].observe(now - req.arrival)
        self.h["queue"].observe(req.first_scheduled - req.ready_at)

    def on_finish(self, req: Request, now: float, reason: str) -> None:
        self.prompt_tokens += req.prompt
        self.generation_tokens += req.generated
        self.cached_tokens += req.cached
        self.requests += 1
        self.h["e2e"].observe(now - req.arrival)
        self.h["retractions"].observe(req.preemptions)
        if req.generated > 1:  # 0.5.x: per request, (finish - first token) / (tokens - 1)
            self.h["tpot"].observe((now - req.first_token) / (req.generated - 1))

    def on_preempt(self, req: Request, now: float) -> None:
        self.retracted += 1
        self.recent_retracted += 1
        self.retracted_in += req.prompt
        self.retracted_out += req.generated

    def on_prefix_cache(self, queries: int, hits: int) -> None:
        self.prefix_queries += queries
        self.prefix_hits += hits

    def on_abort(self, req: Request, now: float) -> None:
        self.aborted += 1

    def on_kv_sent(self, req: Request, now: float) -> None:
        # req_time_stats.compute_and_observe_kv_transfer_metrics: from the inflight-queue entry to done.
        latency_s = now - req.kv_handoff_at
        if latency_s <= 0:
            return
        total_mb = req.kv_bytes / MiB
        self.kv["latency"].observe(latency_s * 1000)
        self.kv["mb"].observe(total_mb)
        self.kv["speed"].observe(total_mb / 1024 / latency_s)

    def render(self, state: EngineState, info: dict[str, str]) -> str:
        engine_type = {"both": "unified", "prefill": "prefill", "decode": "decode"}[self.role]
        labels = {"model_name": self.model_name, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0",
                  "moe_ep_rank": "0"}
        f = _Families(labels, self.created)
        capacity = state.kv_blocks_total * state.block_size
        secs = sum(d for d, _ in self._gen_window)
        gen_tp = sum(n for _, n in self._gen_window) / secs if secs else 0.0
        f.gauge("sglang:num_running_reqs", "The number of running requests.", state.running)
        f.gauge("sglang:num_used_tokens", "The number of used tokens.", state.kv_tokens_used)
        f.gauge("sglang:token_usage", "The token usage.", state.kv_tokens_used / capacity if capacity else 0.0)
        f.gauge("sglang:gen_throughput", "The generation throughput (token/s).", gen_tp)
        f.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", state.waiting)
        f.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.",
                self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0)
        f.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", capacity)
        f.gauge("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode.",
                state.decode_context_tokens)
        f.gauge("sglang:num_retracted_reqs", "The number of retracted requests.", self.recent_retracted)
        f.gauge("sglang:page_size", "The page size of the KV cache.", 1)
        f.counter("sglang:num_retracted_requests", "Total number of retracted requests.", self.retracted)
        f.counter("sglang:num_retracted_input_tokens", "Total number of retracted input tokens.", self.retracted_in)
        f.counter("sglang:num_retracted_output_tokens", "Total number of retracted output tokens.",
                  self.retracted_out)
        f.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        f.counter("sglang:generation_tokens", "Number of generation tokens processed.", self.generation_tokens)
        f.counter("sglang:cached_tokens", "Number of cached prompt tokens.", self.cached_tokens)
        f.counter("sglang:num_requests", "Number of requests processed.", self.requests)
        f.counter("sglang:num_aborted_requests", "Number of requests aborted.", self.aborted)
        f.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                    self.h["ttft"], created=False)
        f.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                    self.h["itl"], created=False)
        f.histogram("sglang:request_time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.", self.h["tpot"], created=False)
        f.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                    self.h["e2e"], created=False)
        f.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", self.h["queue"],
                    created=False)
        f.histogram("sglang:num_retractions", "Histogram of retraction counts per request.",
                    self.h["retractions"], created=False)
        if self.role != "both":
            self._pd_families(f, state)
        self.recent_retracted = 0  # the gauge is per log interval
        return f.render()


    def _pd_families(self, f: _Families, state: EngineState) -> None:
        """SGLang logs every PD queue gauge on every scheduler (the other role's at 0); the transfer
        histograms are observed on the prefill instance only, so a decode page has none of their
        series, and the failure counters have none until a first failure (labels() on increment)."""
        prefill = self.role == "prefill"
        f.gauge("sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue.",
                0)
        f.gauge("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.",
                state.kv_sending if prefill else 0)
        f.gauge("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.", 0)
        f.gauge("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.",
                0 if prefill else state.kv_receiving)
        if prefill:
            f.histogram("sglang:kv_transfer_speed_gb_s", "Histogram of KV cache transfer speed in GB/s.",
                        self.kv["speed"], created=False)
            f.histogram("sglang:kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.",
                        self.kv["latency"], created=False)
            f.histogram("sglang:kv_transfer_total_mb", "Histogram of KV cache transfer size in MB.",
                        self.kv["mb"], created=False)


def _rust_f64(v: float) -> str:
    """Rust's f64 Display: no exponent, integers without a fractional part."""
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    if float(v).is_integer() and abs(v) < 1e16:
        return str(int(v))
    return repr(float(v))


class TgiRecorder(Recorder):
    """Hugging Face TGI 3.x (router/src, metrics-exporter-prometheus): no model label, no `_total`,
    per-batch histograms with `method`, a summary for skipped tokens, no TTFT."""

    fmt = "tgi"

    def __init__(self, model_name: str, created_epoch: float, epoch_offset: float, *, max_total_tokens: int) -> None:
        super().__init__(model_name, created_epoch, epoch_offset)
        max_input = max(2, max_total_tokens - 1)
        self.max_total_tokens = max_total_tokens
        self.h = {k: Hist(TGI_DURATION) for k in ("duration", "validation", "queue", "inference", "mean_tpt")}
        self.batch = {(k, m): Hist(TGI_DURATION) for k in ("forward", "inference", "decode")
                      for m in ("prefill", "decode")}
        self.input_length = Hist(linear_buckets(max_input))
        self.generated = Hist(linear_buckets(max_total_tokens))
        self.max_new = Hist(linear_buckets(max_total_tokens))
        self.request_count = 0
        self.success = 0
        self.batch_count = {"prefill": 0, "decode": 0}

    def on_arrival(self, req: Request, now: float) -> None:
        self.request_count += 1

    def on_step(self, rec: StepRecord) -> None:
        method = "prefill" if rec.prefill_tokens else "decode"
        self.batch_count[method] += 1
        self.batch[("forward", method)].observe(rec.cost.time_s)
        self.batch[("inference", method)].observe(rec.duration_s)
        self.batch[("decode", method)].observe(rec.duration_s - rec.cost.time_s + 20e-6 * rec.running)

    def on_finish(self, req: Request, now: float, reason: str) -> None:
        self.success += 1
        inference = now - req.first_scheduled
        self.h["duration"].observe(now - req.arrival)
        self.h["validation"].observe(req.ready_at - req.arrival)
        self.h["queue"].observe(req.first_scheduled - req.ready_at)
        self.h["inference"].observe(inference)
        self.h["mean_tpt"].observe(inference / max(1, req.generated))  # includes prefill, as TGI's does
        self.input_length.observe(req.prompt)
        self.generated.observe(req.generated)
        self.max_new.observe(req.max_tokens)

    def render(self, state: EngineState, info: dict[str, str]) -> str:
        lines: list[str] = []

        def counter(name: str, value: float, labels: str = "") -> None:
            lines.append(f"# TYPE {name} counter")
            lines.append(f"{name}{labels} {int(value)}")

        def gauge(name: str, value: float) -> None:
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {_rust_f64(value)}")

        def hist(name: str, series: list[tuple[str, Hist]]) -> None:
            lines.append(f"# TYPE {name} histogram")
            for labels, h in series:
                sep = "," if labels else ""
                for bound, cum in h.cumulative():
                    le = "+Inf" if bound == float("inf") else _rust_f64(bound)
                    lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {cum}')
                lab = f"{{{labels}}}" if labels else ""
                lines.append(f"{name}_sum{lab} {_rust_f64(h.sum)}")
                lines.append(f"{name}_count{lab} {h.count}")

        counter("tgi_request_count", self.request_count)
        counter("tgi_request_success", self.success)
        lines.append("# TYPE tgi_batch_inference_count counter")
        for m, v in self.batch_count.items():
            lines.append(f'tgi_batch_inference_count{{method="{m}"}} {v}')
        lines.append("# TYPE tgi_batch_inference_success counter")
        for m, v in self.batch_count.items():
            lines.append(f'tgi_batch_inference_success{{method="{m}"}} {v}')
        gauge("tgi_batch_current_size", state.running)
        gauge("tgi_queue_size", state.waiting)
        gauge("tgi_batch_current_max_tokens", state.kv_tokens_used)
        gauge("tgi_batch_max_total_tokens", state.kv_blocks_total * state.block_size)
        hist("tgi_request_duration", [("", self.h["duration"])])
        hist("tgi_request_validation_duration", [("", self.h["validation"])])
        hist("tgi_request_queue_duration", [("", self.h["queue"])])
        hist("tgi_request_inference_duration", [("", self.h["inference"])])
        hist("tgi_request_mean_time_per_token_duration", [("", self.h["mean_tpt"])])
        for kind in ("forward", "inference", "decode"):
            hist(f"tgi_batch_{kind}_duration",
                 [(f'method="{m}"', self.batch[(kind, m)]) for m in ("prefill", "decode")])
        hist("tgi_request_input_length", [("", self.input_length)])
        hist("tgi_request_generated_tokens", [("", self.generated)])
        hist("tgi_request_max_new_tokens", [("", self.max_new)])
        # No buckets are configured for skipped tokens, so the exporter renders a summary.
        lines.append("# TYPE tgi_request_skipped_tokens summary")
        for q in TGI_SUMMARY_QUANTILES:
            lines.append(f'tgi_request_skipped_tokens{{quantile="{_rust_f64(q)}"}} 0')
        lines.append("tgi_request_skipped_tokens_sum 0")
        lines.append(f"tgi_request_skipped_tokens_count {self.success}")
        return "\n".join(lines) + "\n"


class LlamaCppRecorder(Recorder):
    """llama.cpp server (tools/server, --metrics): no labels, seconds counters instead of histograms,
    two "counters" that are not counters, throughput gauges over the interval since the last scrape."""

    fmt = "llamacpp"

    def __init__(self, model_name: str, created_epoch: float, epoch_offset: float) -> None:
        super().__init__(model_name, created_epoch, epoch_offset)
        self.prompt_tokens = 0
        self.prompt_seconds = 0.0
        self.predicted = 0
        self.predicted_seconds = 0.0
        self.n_decode = 0
        self.n_tokens_max = 0
        self.busy_slots_sum = 0
        # The "bucket" the two throughput gauges average over; reset by every /metrics call.
        self.bucket_prompt_tokens = 0
        self.bucket_prompt_s = 0.0
        self.bucket_pred_tokens = 0
        self.bucket_pred_s = 0.0

    def on_step(self, rec: StepRecord) -> None:
        self.n_decode += 1
        self.n_tokens_max = max(self.n_tokens_max, rec.decode_seqs + rec.prefill_tokens)
        self.busy_slots_sum += rec.running

    def on_first_token(self, req: Request, now: float) -> None:
        processed = req.prompt - req.cached
        seconds = now - req.first_scheduled
        self.prompt_tokens += processed
        self.prompt_seconds += seconds
        self.bucket_prompt_tokens += processed
        self.bucket_prompt_s += seconds

    def on_finish(self, req: Request, now: float, reason: str) -> None:
        seconds = now - req.first_token
        self.predicted += req.generated
        self.predicted_seconds += seconds
        self.bucket_pred_tokens += req.generated
        self.bucket_pred_s += seconds

    def headers(self) -> dict[str, str]:
        return {"Process-Start-Time-Unix": str(int(self.created))}

    def render(self, state: EngineState, info: dict[str, str]) -> str:
        def num(v: float) -> str:
            return str(int(v)) if float(v).is_integer() else format(v, ".6g")

        busy = self.busy_slots_sum / self.n_decode if self.n_decode else 0.0
        rows = (
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", self.prompt_tokens),
            ("prompt_seconds_total", "counter", "Prompt process time", self.prompt_seconds),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.", self.predicted),
            ("tokens_predicted_seconds_total", "counter", "Predict process time", self.predicted_seconds),
            ("n_decode_total", "counter", "Total number of llama_decode() calls", self.n_decode),
            ("n_tokens_max", "counter", "Largest observed n_tokens.", self.n_tokens_max),
            ("n_busy_slots_per_decode", "counter", "Average number of busy slots per llama_decode() call", busy),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
             self.bucket_prompt_tokens / self.bucket_prompt_s if self.bucket_prompt_s else 0.0),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
             self.bucket_pred_tokens / self.bucket_pred_s if self.bucket_pred_s else 0.0),
            ("requests_processing", "gauge", "Number of requests processing.", state.running),
            ("requests_deferred", "gauge", "Number of requests deferred.", state.waiting),
        )
        lines = []
        for name, kind, doc, value in rows:
            lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {num(value)}"]
        self.bucket_prompt_tokens = self.bucket_pred_tokens = 0
        self.bucket_prompt_s = self.bucket_pred_s = 0.0
        return "\n".join(lines) + "\n"


def make_recorder(fmt: str, model_name: str, created_epoch: float, epoch_offset: float, *,
                  max_model_len: int, kv_capacity_tokens: int, rank: int = 0, role: str = "both") -> Recorder:
    if role != "both" and fmt not in ("vllm", "sglang"):
        raise ValueError(f"prefill/decode disaggregation is modelled in the vllm and sglang formats, not {fmt!r}")
    if fmt == "vllm":
        return VllmRecorder(model_name, created_epoch, epoch_offset, max_model_len=max_model_len,
                            engine_index=str(rank), role=role)
    if fmt == "sglang":
        return SglangRecorder(model_name, created_epoch, epoch_offset, role=role)
    if fmt == "tgi":
        return TgiRecorder(model_name, created_epoch, epoch_offset,
                           max_total_tokens=min(max_model_len, kv_capacity_tokens))
    if fmt == "llamacpp":
        return LlamaCppRecorder(model_name, created_epoch, epoch_offset)
    raise ValueError(f"unknown engine format {fmt!r}; one of {', '.join(FORMATS)}")
