"""KV cache occupancy in tokens and bytes, and headroom in sequences.

bytes/token: where the engine says how much memory its KV cache holds (vLLM's
kv_cache_memory_bytes, per worker), that x tensor-parallel workers / capacity in tokens, which
follows whatever dtype the engine really runs (`--dtype float32` with `--kv-cache-dtype auto`
holds 4-byte elements, which no config.json says). Otherwise 2 (K and V) x layers x kv_heads x
head_dim x bytes per element from the model shape (specs.models), omitted without one. Used
tokens come from the engine (usage ratio x capacity). Headroom = free tokens / the current mean
context per running sequence.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from exporter.derive.stage import Ctx, Stage, TargetKey, rounded
from exporter.derive.throughput import Throughput
from exporter.derive.view import KV_CAPACITY, KV_USAGE, EngineView
from exporter.snapshot import Sample
from exporter.specs.models import ModelShape, kv_bytes_per_token

KV_MEMORY = "llm_kv_cache_memory_bytes"


class KvCache(NamedTuple):
    usage_ratio: float | None = None
    used_tokens: float | None = None
    capacity_tokens: float | None = None
    bytes_per_token: float | None = None
    mean_context: float | None = None
    headroom_sequences: float | None = None
    bytes_source: str = ""  # "engine" (its KV memory / capacity) or "model shape"

    @property
    def used_bytes(self) -> float | None:
        if self.used_tokens is None or self.bytes_per_token is None:
            return None
        return self.used_tokens * self.bytes_per_token

    @property
    def capacity_bytes(self) -> float | None:
        if self.capacity_tokens is None or self.bytes_per_token is None:
            return None
        return self.capacity_tokens * self.bytes_per_token


def mean_context(used_tokens: float | None, running: float | None, fallback: float | None) -> float | None:
    """Tokens held per running sequence now; with nothing running, the mean length (prompt +
    output) of the requests that finished in the window."""
    if used_tokens is not None and running is not None and running >= 1 and used_tokens > 0:
        return used_tokens / running
    return fallback if fallback is not None and fallback > 0 else None


def headroom_sequences(capacity: float, used: float, context: float) -> float:
    """Whole sequences of `context` tokens that fit in the free part of the pool."""
    return float(math.floor(max(0.0, capacity - used) / context)) if context > 0 else 0.0


def bytes_per_token(engine: EngineView, shape: ModelShape | None, workers: int) -> tuple[float | None, str]:
    """(KV bytes per token, where it came from): the engine's own allocation first."""
    memory, capacity = engine.get(KV_MEMORY), engine.get(KV_CAPACITY)
    if memory and capacity:
        return memory * max(1, workers) / capacity, "engine"
    if shape is not None:
        return kv_bytes_per_token(shape), "model shape"
    return None, ""


def compute(engine: EngineView, tp: Throughput | None, shape: ModelShape | None, workers: int = 1) -> KvCache:
    capacity = engine.get(KV_CAPACITY)
    used = engine.kv_used_tokens
    running = tp.running if tp is not None else engine.get("llm_requests_running")
    fallback = tp.mean_request_tokens if tp is not None else None
    context = mean_context(used, running, fallback)
    headroom = None
    if capacity is not None and used is not None and context is not None:
        headroom = headroom_sequences(capacity, used, context)
    per_token, source = bytes_per_token(engine, shape, workers)
    return KvCache(
        usage_ratio=engine.kv_usage_ratio,
        used_tokens=used,
        capacity_tokens=capacity,
        bytes_per_token=per_token,
        mean_context=context,
        headroom_sequences=headroom,
        bytes_source=source,
    )


def samples(kv: KvCache, key: TargetKey) -> list[Sample]:
    labels = key.labels
    out: list[Sample] = []
    for name, value in (("llm_kv_cache_bytes_per_token", kv.bytes_per_token),
                        ("llm_kv_cache_used_tokens", kv.used_tokens),
                        ("llm_kv_cache_used_bytes", kv.used_bytes),
                        ("llm_kv_cache_capacity_bytes", kv.capacity_bytes),
                        ("llm_kv_cache_headroom_sequences", kv.headroom_sequences)):
        if value is not None:
            out.append(Sample(name, labels, value))
    return out


def numbers(kv: KvCache) -> dict[str, Any]:
    return dict(kv_usage_ratio=rounded(kv.usage_ratio), kv_used_tokens=rounded(kv.used_tokens, 0),
                kv_capacity_tokens=kv.capacity_tokens, kv_bytes_per_token=kv.bytes_per_token,
                kv_bytes_per_token_from=kv.bytes_source or None,
                kv_headroom_sequences=kv.headroom_sequences)


def _compute(ctx: Ctx, state: None) -> KvCache:
    return compute(ctx.engine, ctx.get("throughput"), ctx.shape, ctx.tp)


STAGE = Stage(
    name="kv", compute=_compute, samples=samples, numbers=numbers, after=("throughput",),
    emits=("llm_kv_cache_bytes_per_token", "llm_kv_cache_used_tokens", "llm_kv_cache_used_bytes",
           "llm_kv_cache_capacity_bytes", "llm_kv_cache_headroom_sequences"),
    engine=(KV_CAPACITY, KV_USAGE, KV_MEMORY, "llm_requests_running"),
)
