"""The per-cycle view of a snapshot (exporter/derive/view.py) and its layout cache."""

from __future__ import annotations

import math
import random
from types import MappingProxyType

from exporter.derive import STAGES
from exporter.derive import view as view_module
from exporter.derive.stage import view_needs
from exporter.derive.view import ViewCache, build_view
from exporter.snapshot import Labels, Sample, Snapshot, SourceKind, SourceResult

TTFT = "llm_time_to_first_token_seconds"
NEEDS = view_needs(STAGES)


def fresh_view(snap: Snapshot):
    """The view of a snapshot from an empty cache."""
    return build_view(snap, ViewCache(NEEDS))


def labels(rank: str, **extra: str) -> Labels:
    return tuple(sorted({"engine": "vllm", "model": "m", "rank": rank, "target": "a", **extra}.items()))


def engine_samples(t: float, ranks=("0", "1"), les=("0.1", "0.5", "+Inf")) -> list[Sample]:
    out = []
    for rank in ranks:
        out += [Sample("llm_prompt_tokens_total", labels(rank), 100.0 * t),
                Sample("llm_requests_running", labels(rank), 3.0),
                Sample("llm_kv_cache_usage_ratio", labels(rank), 0.25),
                Sample("llm_kv_cache_capacity_tokens", labels(rank), 1000.0),
                Sample("llm_unrelated_total", labels(rank), 1.0)]
        out += [Sample(TTFT + "_bucket", labels(rank, le=le), (i + 1) * t) for i, le in enumerate(les)]
        out.append(Sample(TTFT + "_sum", labels(rank), 0.3 * t))
    return out


def gpu_samples(t: float, active: str = "sw_power_cap", up: float = 1.0) -> list[Sample]:
    out = []
    for i in range(2):
        device = (("gpu", str(i)), ("name", "NVIDIA H100 80GB HBM3"), ("uuid", f"GPU-{i}"))
        out += [Sample("llm_gpu_clock_event_active", tuple(sorted(device + (("reason", r),))), float(r == active))
                for r in ("gpu_idle", "sw_power_cap", "hw_slowdown")]
        out += [Sample("llm_gpu_utilization_ratio", device, 0.5 + t / 100), Sample("llm_gpu_up", device, up),
                Sample("llm_gpu_pcie_link_width", tuple(sorted(device + (("state", "current"),))), 16.0)]
    return out


def snapshot(t: float, engine: list[Sample], gpu: list[Sample], *, sources: tuple[str, ...] = ("a",)) -> Snapshot:
    results = {f"engine:{s}": SourceResult(f"engine:{s}", True, 0.0, t, tuple(engine), kind=SourceKind.ENGINE,
                                           attrs=MappingProxyType({"kind": "engine", "target": s}))
               for s in sources}
    results["gpu"] = SourceResult("gpu", True, 0.0, t, tuple(gpu), kind=SourceKind.GPU)
    return Snapshot(t, MappingProxyType(results))


def test_view_sums_ranks_and_buckets():
    view = fresh_view(snapshot(2.0, engine_samples(2.0), gpu_samples(2.0)))
    engine = view.engines[0]
    assert engine.model == "m"
    assert engine.get("llm_prompt_tokens_total") == 400.0 and engine.get("llm_requests_running") == 6.0
    assert engine.get("llm_unrelated_total") is None
    hist = engine.histograms[TTFT]
    assert hist.bounds == (0.1, 0.5, math.inf) and hist.counts == (4.0, 8.0, 12.0)
    assert engine.kv_used_tokens == 500.0 and engine.kv_usage_ratio == 0.25
    assert [(g.gpu, g.reasons_active, g.link) for g in view.gpus] == [
        ("0", ("sw_power_cap",), {("llm_gpu_pcie_link_width", "current"): 16.0}),
        ("1", ("sw_power_cap",), {("llm_gpu_pcie_link_width", "current"): 16.0})]


def test_sums_start_from_zero_like_a_loop_over_the_samples():
    # 0.0 + v: a lone -0.0 sums to 0.0 and an int becomes a float, as the per-sample loop did.
    samples = [Sample("llm_requests_running", labels("0"), -0.0), Sample("llm_requests_waiting", labels("0"), 3)]
    engine = fresh_view(snapshot(1.0, samples, [])).engines[0]
    running, waiting = engine.get("llm_requests_running"), engine.get("llm_requests_waiting")
    assert math.copysign(1.0, running) == 1.0
    assert type(waiting) is float and waiting == 3.0


def test_a_bucket_missing_on_one_rank_still_sums_the_others():
    samples = engine_samples(1.0, ranks=("0",)) + engine_samples(1.0, ranks=("1",), les=("0.5", "+Inf"))
    hist = fresh_view(snapshot(1.0, samples, [])).engines[0].histograms[TTFT]
    assert hist.bounds == (0.1, 0.5, math.inf) and hist.counts == (1.0, 3.0, 5.0)


def test_view_keeps_each_ranks_series_for_per_rank_reset_handling():
    samples = engine_samples(1.0, ranks=("0",)) + engine_samples(2.0, ranks=("1",), les=("0.5", "+Inf"))
    engine = fresh_view(snapshot(1.0, samples, [])).engines[0]
    assert engine.ranks == 2
    assert engine.get("llm_prompt_tokens_total") == 300.0
    assert engine.series["llm_prompt_tokens_total", "model=m,rank=0"] == 100.0
    assert engine.series["llm_prompt_tokens_total", "model=m,rank=1"] == 200.0
    hist = engine.histograms[TTFT]
    # Rank 1 has no 0.1 bucket: 0.0 there, as in the sum (1 + 0, 2 + 2, 3 + 4).
    assert hist.counts == (1.0, 4.0, 7.0)
    assert hist.series == (("model=m,rank=0", (1.0, 2.0, 3.0)), ("model=m,rank=1", (0.0, 2.0, 4.0)))
    single = fresh_view(snapshot(1.0, engine_samples(1.0, ranks=("0",)), [])).engines[0]
    assert single.ranks == 1 and single.histograms[TTFT].series == (("model=m,rank=0", (1.0, 2.0, 3.0)),)
    assert dict(single.series) == {("llm_prompt_tokens_total", "model=m,rank=0"): 100.0,
                                   ("llm_requests_running", "model=m,rank=0"): 3.0,
                                   ("llm_kv_cache_capacity_tokens", "model=m,rank=0"): 1000.0,
                                   ("llm_time_to_first_token_seconds_sum", "model=m,rank=0"): 0.3}


def _changed(rng: random.Random, samples: list[Sample]) -> list[Sample]:
    """The same engine page with one change a layout must notice."""
    out = list(samples)
    i = rng.randrange(len(out))
    name, labels_, value = out[i]
    change = rng.randrange(5)
    if change == 0:  # a series renamed in place
        out[i] = Sample(rng.choice(["llm_requests_waiting", TTFT + "_sum", "llm_unrelated_total"]), labels_, value)
    elif change == 1:  # a label changed in place (new bucket bound, other rank)
        key = "le" if name.endswith("_bucket") else "rank"
        out[i] = Sample(name, tuple(sorted({**dict(labels_), key: rng.choice(["0.25", "2", "7"])}.items())), value)
    elif change == 2:
        rng.shuffle(out)
    elif change == 3 and len(out) > 5:
        del out[i]
    else:  # equal labels in a new tuple: nothing changes
        out[i] = Sample(name, tuple(list(labels_)), value)
    return out


def test_a_cached_layout_gives_the_view_a_fresh_one_gives():
    rng = random.Random(7)
    cache = ViewCache(NEEDS)
    engine, gpu = engine_samples(1.0), gpu_samples(1.0)
    for cycle in range(300):
        t = float(cycle)
        if rng.random() < 0.3:
            engine = _changed(rng, engine)
        elif rng.random() < 0.05:  # the engine restarted with a fresh page
            engine = engine_samples(t, ranks=rng.choice([("0",), ("0", "1")]))
        engine = [Sample(name, pairs, value + 1.0) for name, pairs, value in engine]
        gpu = gpu_samples(t, active=rng.choice(["gpu_idle", "sw_power_cap", "none"]),
                          up=0.0 if rng.random() < 0.1 else 1.0)
        snap = snapshot(t, engine, gpu)
        assert build_view(snap, cache) == fresh_view(snap), cycle


def test_view_cache_keeps_only_live_sources_and_stays_bounded():
    cache = ViewCache(NEEDS, max_sources=4)
    engine, gpu = engine_samples(1.0), gpu_samples(1.0)
    for i in range(20):
        sources = tuple(f"t{i}-{j}" for j in range(3))
        build_view(snapshot(float(i), engine, gpu, sources=sources), cache)
        assert len(cache) <= 4
    build_view(snapshot(99.0, engine, gpu, sources=("only",)), cache)
    assert len(cache) == 2  # engine:only and gpu
    for i in range(20):  # more sources in one snapshot than the bound: the oldest layouts go
        assert len(cache) <= 4
        cache.read(f"engine:x{i}", tuple(engine), lambda samples: _Layout())


def test_view_cache_reuses_every_layout_when_there_are_more_sources_than_its_bound(monkeypatch):
    builds = []
    real = view_module._engine_layout
    monkeypatch.setattr(view_module, "_engine_layout",
                        lambda samples, needs: builds.append(1) or real(samples, needs))
    cache = ViewCache(NEEDS, max_sources=4)
    engine, gpu = engine_samples(1.0), gpu_samples(1.0)
    sources = tuple(f"t{j}" for j in range(10))
    for cycle in range(3):
        view = build_view(snapshot(float(cycle), engine, gpu, sources=sources), cache)
        assert len(view.engines) == 10
    assert len(builds) == 10  # built in the first cycle, reused in the next two


class _Layout:
    @staticmethod
    def pick(samples):
        return ()
