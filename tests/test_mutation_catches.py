"""Numbers users act on, checked where a planted bug went unseen (issue 46): each test here failed
with that bug in place and passes without it.

- KV bytes per token with tensor parallelism: vLLM says how much memory its KV cache holds per
  worker; the bytes per token are that x the TP workers / the capacity in tokens. Ignoring the
  workers reported 1/TP of the truth at every TP > 1 (tests/test_derive_*.py only ran TP 1). The
  twin's side of the same physics: each GPU holds its share of the KV heads (all of them at TP 1,
  one each once TP reaches the head count, replicated beyond), so the capacity in tokens it shows
  follows min(TP, kv_heads), not TP.
- The quantile window's monotonic guard (quantiles.tail raising each cumulative count to the
  largest below it, as histogram_quantile() does): without it the SLO attainment of a window whose
  bucket deltas are not monotonic read 0.50 instead of 0.83.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import httpx
import pytest

from exporter.config import Config
from exporter.derive import build_deriver
from exporter.derive.quantiles import attainment, histogram_quantile, notes, slo_bound, tail
from exporter.derive.window import HistogramWindow, RateWindow, Scopes
from exporter.physics.costs import Batch, Hardware, step_cost
from exporter.simulator.engine import EngineConfig, kv_pool_blocks
from exporter.simulator.twin import Twin, TwinConfig
from exporter.snapshot import Sample, Snapshot, SourceKind, SourceResult, labels_of
from exporter.sources.engines.normalize import normalize
from exporter.specs.gpus import lookup_gpu
from exporter.specs.models import load_model, weight_bytes, weight_bytes_read_per_step
from tests.support import exporter_run, fake_engine, wait_until

GiB = 1024**3
LLAMA_8B_KV = 2 * 32 * 8 * 128 * 2  # 131,072 B/token: 32 layers x 8 KV heads x head_dim 128 x BF16, K and V
WORKER_KV = 40 * GiB  # what each TP worker allocates to its KV cache


def vllm_kv_page(tp: int, kv_heads: int = 8, full_bytes: int = LLAMA_8B_KV, usage: float = 0.25) -> str:
    """A vLLM page whose cache_config_info says what a TP group really holds: each worker has
    WORKER_KV bytes of its share of the heads, min(tp, kv_heads) shares make one token's KV."""
    per_worker_token = full_bytes / min(tp, kv_heads)
    tokens = int(WORKER_KV // per_worker_token)
    blocks = tokens // 16
    return ("# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{blocks}",'
            f'kv_cache_size_tokens="{blocks * 16}",kv_cache_memory_bytes="{WORKER_KV}"}} 1\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {usage}\n')


def derived(page: str, tp: int, cycles: int = 2) -> dict[str, float]:
    """The page through the real normalizer and a Deriver at `tp` GPUs per replica: name -> value
    of the normalized and the derived samples, as /metrics shows them."""
    deriver = build_deriver(Config(interval_s=1.0, model="llama-3.1-8b", tensor_parallel=tp))
    out: list = []
    previous = None
    for t in range(cycles):
        samples = normalize(page, target="a", kind="vllm").samples
        snap = Snapshot(1_000.0 + t, MappingProxyType({"engine:a": SourceResult(
            "engine:a", True, 0.0, float(t), tuple(samples), kind=SourceKind.ENGINE,
            attrs=MappingProxyType({"kind": "engine", "target": "a", "engine": "vllm", "model": "llama-3.1-8b"}))}))
        out = [*samples, *deriver(snap, previous)]
        previous = snap
    return {s.name: s.value for s in out}


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_kv_bytes_per_token_from_the_engine_counts_every_tp_worker(tp):
    # Llama 3.1 8B holds 131,072 B of KV per token whatever the TP: the engine's per-worker
    # memory x TP / the capacity in tokens. Ignoring the workers reads 65,536 at TP 2, 16,384 at TP 8.
    values = derived(vllm_kv_page(tp), tp)
    capacity = values["llm_kv_cache_capacity_tokens"]
    assert capacity == pytest.approx(WORKER_KV * min(tp, 8) / LLAMA_8B_KV, rel=1e-3)
    assert values["llm_kv_cache_bytes_per_token"] == pytest.approx(LLAMA_8B_KV, rel=1e-3)
    # The pool in bytes is every worker's allocation together.
    assert values["llm_kv_cache_capacity_bytes"] == pytest.approx(WORKER_KV * tp, rel=1e-3)
    assert values["llm_kv_cache_used_bytes"] == pytest.approx(0.25 * WORKER_KV * tp, rel=1e-3)


def test_kv_bytes_per_token_reported_by_the_running_exporter_at_tp_8():
    """The same through `llm-exporter run --tensor-parallel 8` scraping a vLLM page."""
    with fake_engine(vllm_kv_page(8).encode()) as (url, _), exporter_run(
            "--engine", f"{url},kind=vllm,name=a", "--model", "llama-3.1-8b", "--tensor-parallel", "8") as (base, _, _):
        def bytes_per_token() -> float | None:
            for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
                if line.startswith("llm_kv_cache_bytes_per_token{"):
                    return float(line.rsplit(" ", 1)[1])
            return None
        assert wait_until(lambda: bytes_per_token() is not None, timeout=30)
        assert bytes_per_token() == pytest.approx(LLAMA_8B_KV, rel=1e-3)


def twin_capacity_tokens(model: str, tp: int) -> float:
    """The KV capacity in tokens a twin of `model` on `tp` H100s shows, read from its vLLM page by
    the exporter's normalizer (what llm_kv_cache_capacity_tokens says)."""
    twin = Twin(TwinConfig(scenario="decode-heavy", model=model, gpus=tp, epoch=1_700_000_000.0))
    samples = normalize(twin.metrics_text(), target="t", kind="vllm").samples
    return next(s.value for s in samples if s.name == "llm_kv_cache_capacity_tokens")


@pytest.mark.parametrize(("model", "kv_heads"), [("llama-3.1-8b", 8), ("qwen2.5-7b", 4)])
def test_twin_kv_capacity_follows_the_kv_heads_each_gpu_holds(model, kv_heads):
    # Per GPU: 0.9 x 80 GB - weights / TP - the activation reserve, in blocks of 16 tokens of
    # (bytes per token / min(TP, kv_heads)): heads split over the ranks up to their count, one
    # head per GPU (replicated) beyond it.
    shape, gpu, cfg = load_model(model), lookup_gpu("h100-sxm"), EngineConfig()
    full = 2 * shape.layers * shape.kv_heads * shape.head_dim * shape.kv_dtype_bytes
    for tp in (1, 2, 8):
        budget = gpu.memory_bytes * cfg.gpu_memory_utilization
        free = budget - weight_bytes(shape) / tp - cfg.activation_reserve_bytes
        per_gpu_token = full / min(tp, kv_heads)
        expected_blocks = math.floor(free / (cfg.block_size * per_gpu_token))
        assert kv_pool_blocks(Hardware(gpu, tp=tp), shape, cfg) == expected_blocks
        assert twin_capacity_tokens(model, tp) == expected_blocks * cfg.block_size


@pytest.mark.parametrize(("model", "kv_heads"), [("llama-3.1-8b", 8), ("qwen2.5-7b", 4)])
def test_step_kv_bytes_per_gpu_split_over_the_heads_and_replicated_beyond(model, kv_heads):
    # A decode step of 64 sequences x 1,024 context tokens: each GPU reads its weights' share and
    # the KV of its heads for every context token (and writes one new token per sequence).
    shape, gpu = load_model(model), lookup_gpu("h100-sxm")
    full = 2 * shape.layers * shape.kv_heads * shape.head_dim * shape.kv_dtype_bytes
    batch = Batch(decode_seqs=64, decode_context=64 * 1024, logits_tokens=64)
    kv = {}
    for tp in (1, 2, 4, 8):
        cost = step_cost(Hardware(gpu, tp=tp), shape, batch)
        kv[tp] = cost.bytes_per_gpu - weight_bytes_read_per_step(shape, 64) / tp
        assert kv[tp] == pytest.approx(full / min(tp, kv_heads) * (64 * 1024 + 64), rel=1e-9)
    assert kv[8] == pytest.approx(kv[kv_heads])  # at TP >= kv_heads each GPU holds one head


# --- the quantile window's monotonic guard -------------------------------------------------

BOUNDS = (0.1, 0.5, 1.0, float("inf"))
# Two valid pages (cumulative counts rise with `le`) whose difference is not monotonic: the 0.5 s
# bucket's own count fell from 10 to 8 while every cumulative count rose. Window deltas: 5, 3, 5, 6.
PAGE1 = (10.0, 20.0, 25.0, 30.0)
PAGE2 = (15.0, 23.0, 30.0, 36.0)


def test_window_attainment_raises_each_count_to_the_largest_below_it():
    delta = tuple(b - a for a, b in zip(PAGE1, PAGE2, strict=True))
    t = tail("ttft", BOUNDS, delta, 0.5)
    # 5 of 6 at or below 0.5 s once 3 is raised to the 5 below it, as histogram_quantile() does;
    # without the guard 3/6 = 0.50.
    assert t.slo_bound == 0.5
    assert t.slo_attainment == pytest.approx(5 / 6)
    assert t.count == 6
    # Quantiles interpolate in the raised counts: p50 is rank 3 of 6, inside the first bucket.
    assert t.quantile(0.5) == pytest.approx(0.1 * 3 / 5)
    assert t.quantile(0.95) == pytest.approx(1.0)  # rank 5.7 in the +Inf bucket: the highest finite bound
    assert t.quantile(0.99) == pytest.approx(1.0)


def ttft_page(counts: tuple[float, ...]) -> bytes:
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    labels = 'model_name="m"'
    for bound, count in zip(BOUNDS, counts, strict=True):
        le = "+Inf" if bound == float("inf") else f"{bound}"
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {count:g}')
    lines.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} {counts[-1]:g}")
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} {counts[-1] * 0.3:g}")
    lines.append("# TYPE vllm:num_requests_running gauge")
    lines.append(f"vllm:num_requests_running{{{labels}}} 1")
    return ("\n".join(lines) + "\n").encode()


def test_slo_attainment_of_a_non_monotonic_window_from_the_running_exporter():
    """The issue's example through `llm-exporter run`: 0.83 with the guard, 0.50 without."""
    with fake_engine(ttft_page(PAGE1)) as (url, engine), exporter_run(
            "--engine", f"{url},kind=vllm,name=a", "--slo-ttft", "0.5s") as (base, _, _):
        seen = engine.requests
        assert wait_until(lambda: engine.requests >= seen + 2, timeout=30)  # PAGE1 checkpointed
        engine.body = ttft_page(PAGE2)

        def attainment() -> float | None:
            for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
                if line.startswith("llm_ttft_slo_attainment_ratio{"):
                    assert 'bound="0.5"' in line
                    return float(line.rsplit(" ", 1)[1])
            return None
        assert wait_until(lambda: attainment() is not None, timeout=30)
        assert attainment() == pytest.approx(5 / 6, abs=1e-6)


# --- quantile and attainment edges that `make mutation` found untested ----------------------

INF = float("inf")


@pytest.mark.parametrize(("q", "bounds", "cumulative", "expected"), [
    (0.5, (0.1, 0.5, INF), (0.0, 1.0, 1.0), 0.3),  # one observation in the window is enough
    (0.5, (0.1, 0.5, INF), (0.0, 10.0, 10.0), 0.3),  # second bucket: from its lower bound 0.1
    (0.5, (0.1, 0.5, INF), (4.0, 10.0, 10.0), 0.1 + 0.4 * 1 / 6),  # ... past the 4 below it
    (0.99, (0.1, 0.5, INF), (1.0, 2.0, 10.0), 0.5),  # in +Inf: the highest finite bound
    (0.99, (0.5, INF), (1.0, 3.0), 0.5),
    (0.25, (-1.0, 1.0, INF), (10.0, 20.0, 20.0), -1.0),  # first bucket at or below 0: its bound
    (0.5, (0.0, 1.0, INF), (2.0, 10.0, 10.0), 0.375),  # ... but the next bucket interpolates
    (0.0, (0.1, 0.5, INF), (0.0, 4.0, 4.0), 0.1),  # rank 0 in an empty bucket: its bound
])
def test_histogram_quantile_interpolates_as_promql(q, bounds, cumulative, expected):
    assert histogram_quantile(q, bounds, cumulative) == pytest.approx(expected)


def test_histogram_quantile_and_attainment_without_data_are_absent():
    assert histogram_quantile(0.5, (), (1.0,)) is None
    assert histogram_quantile(0.5, (INF,), (3.0,)) is None  # only +Inf: no finite bound to name
    assert histogram_quantile(0.5, (0.5, INF), (0.0, 0.0)) is None
    assert attainment((0.5, INF), (), 0.5) is None
    assert attainment((0.5, INF), (1.0, 1.0), 0.5) == 1.0  # one request, within the SLO
    assert attainment((0.5, INF), (0.0, 1.0), 0.5) == 0.0  # one request, late
    assert slo_bound((0.0, 1.0, INF), 0.0) == 0.0  # "at or below": a bound equal to the threshold
    empty = tail("ttft", (), (), 0.5)
    assert (empty.kind, empty.count, empty.slo_threshold, empty.slo_attainment) == ("ttft", 0.0, 0.5, None)
    judged = tail("tbt", BOUNDS, (5.0, 5.0, 5.0, 6.0), 0.5)
    assert (judged.kind, judged.slo_threshold, judged.note) == ("tbt", 0.5, "")
    assert notes({"tbt": judged}) == []
    unjudged = tail("tbt", BOUNDS, (5.0, 5.0, 5.0, 6.0), 0.05)
    assert notes({"tbt": unjudged}) == ["no tbt bucket bound at or below the SLO 0.05s: attainment omitted"]


# --- the quantiles stage through a Deriver: roles, partial targets, ranks, restarts ----------
# What `make mutation` left alive in quantiles._compute and quantiles.numbers: the diagnosis'
# per-kind numbers (doctor and /debug/diagnosis print them) read whole, on the paths the fast
# tests never fed the stage.

STAGE_BOUNDS = (("0.5", 0.5), ("2.5", 2.5), ("5", 5.0), ("+Inf", INF))
TTFT, TBT, E2E = ("llm_time_to_first_token_seconds", "llm_inter_token_latency_seconds",
                  "llm_e2e_request_latency_seconds")


def stage_snapshot(t: float, hists: dict[str, dict[str, tuple[float, ...]]], role: str = "",
                   layouts: dict[str, tuple[tuple[str, float], ...]] | None = None) -> Snapshot:
    """One vLLM target at `t` whose histograms are name -> rank -> cumulative counts over
    STAGE_BOUNDS or the name's `layouts` (one rank "": an unlabelled series)."""
    samples = []
    for name, ranks in hists.items():
        for rank, counts in ranks.items():
            labels = labels_of(target="a", engine="vllm", model="llama-3.1-8b", **({"rank": rank} if rank else {}))
            samples += [Sample(name + "_bucket", labels + (("le", le),), c)
                        for (le, _), c in zip((layouts or {}).get(name, STAGE_BOUNDS), counts, strict=True)]
    attrs = {"kind": "engine", "target": "a", "engine": "vllm", "model": "llama-3.1-8b", "role": role}
    results = {"engine:a": SourceResult("engine:a", True, 0.0, t, tuple(samples), kind=SourceKind.ENGINE,
                                        attrs=MappingProxyType(attrs))}
    return Snapshot(1_000.0 + t, MappingProxyType(results))


def stage_numbers(deriver, snap: Snapshot) -> tuple[dict, list[Sample]]:
    """The quantiles stage's numbers in the diagnosis (kind -> numbers), and the cycle's samples."""
    out = list(deriver(snap, None))
    numbers = deriver.diagnosis()["targets"]["a"]["numbers"]
    return {k: v for k, v in numbers.items() if k in ("ttft", "tbt", "e2e")}, out


def kind_numbers(count: float, quantiles: dict[str, float], slo: float | None, bound: float | None,
                 attainment: float | None, **extra) -> dict:
    return {"window_count": count, "quantiles": quantiles, "slo_seconds": slo, "slo_bound_used": bound,
            "slo_attainment": attainment, "slo_window_count": count, "slo_no_recent_traffic": False,
            "restarted_seconds_ago": None, "window_count_since_restart": None, "not_applicable": None} | extra


def test_quantiles_stage_numbers_of_a_prefill_instance_say_tbt_is_not_applicable():
    # A prefill instance exposes TBT too, but its token gaps are its decode partner's: no TBT
    # quantiles, no TBT SLO line, and the reason in the numbers; TTFT and E2E still count.
    deriver = build_deriver(Config(interval_s=5.0, slo_ttft_s=2.5, slo_tbt_s=0.5))
    for t in range(2):
        c = 10.0 * t
        numbers, out = stage_numbers(deriver, stage_snapshot(5.0 * t, {
            TTFT: {"": (0.0, c, c, c)}, TBT: {"": (c, c, c, c)}, E2E: {"": (0.0, 0.0, c, c)}}, role="prefill"))
    assert numbers["tbt"] == {
        "window_count": 0.0, "quantiles": {}, "slo_seconds": 0.5, "slo_bound_used": None, "slo_attainment": None,
        "slo_window_count": 0.0, "slo_no_recent_traffic": False, "restarted_seconds_ago": None,
        "window_count_since_restart": None,
        "not_applicable": "prefill role: the instance hands each request to its decode partner after the first "
                          "token, so the token gaps users see are the decode instance's"}
    # 10 requests in the window, all between 0.5 and 2.5 s to the first token.
    assert numbers["ttft"] == kind_numbers(10.0, {"0.5": 1.5, "0.95": 2.4, "0.99": 2.48}, 2.5, 2.5, 1.0)
    assert numbers["e2e"] == kind_numbers(10.0, {"0.5": 3.75, "0.95": 4.875, "0.99": 4.975}, None, None, None)
    assert not [s for s in out if s.name in ("llm_tbt_window_seconds", "llm_tbt_slo_attainment_ratio")]
    assert [s.value for s in out if s.name == "llm_ttft_slo_attainment_ratio"] == [1.0]


def test_quantiles_stage_reads_every_histogram_a_target_has_when_others_are_missing_or_new():
    # No TBT histogram at all (a server that does not stream): TTFT and E2E are still judged.
    # Then a TTFT histogram whose buckets changed (an engine upgrade) has no window yet: E2E,
    # after it, still has one.
    deriver = build_deriver(Config(interval_s=5.0, slo_ttft_s=2.5))
    for t in range(2):
        c = 4.0 * t
        numbers, _ = stage_numbers(deriver, stage_snapshot(5.0 * t, {TTFT: {"": (c, c, c, c)},
                                                                     E2E: {"": (0.0, c, c, c)}}))
    assert set(numbers) == {"ttft", "e2e"}
    assert numbers["e2e"]["window_count"] == 4.0 and numbers["e2e"]["quantiles"]["0.5"] == 1.5
    assert numbers["ttft"] == kind_numbers(4.0, {"0.5": 0.25, "0.95": 0.475, "0.99": 0.495}, 2.5, 2.5, 1.0)
    # TTFT on a 0.5 / 1 / 5 / +Inf layout now: no checkpoint on it yet, so no TTFT numbers;
    # E2E, after it in the stage's order and on its old layout, still has its window.
    upgraded = (("0.5", 0.5), ("1", 1.0), ("5", 5.0), ("+Inf", INF))
    numbers, _ = stage_numbers(deriver, stage_snapshot(10.0, {TTFT: {"": (8.0,) * 4}, E2E: {"": (0.0, 8.0, 8.0, 8.0)}},
                                                       layouts={TTFT: upgraded}))
    assert set(numbers) == {"e2e"} and numbers["e2e"]["window_count"] == 8.0


def test_quantiles_stage_counts_a_restart_of_one_rank_and_says_it_at_once():
    # Two data-parallel ranks, 10 requests each per 5 s, all within 0.5 s; rank 1 restarts
    # between t=10 and t=15 (20 -> 4). The window holds what either rank served: rank 0's 30 and
    # rank 1's 20 + 4 = 54 at t=15 (the restart read on the summed counts, 40 -> 34, would add
    # rank 0's 30 again: 74); the numbers say the restart 0 s after it was seen, with the 10 + 4
    # requests since.
    deriver = build_deriver(Config(interval_s=5.0, slo_ttft_s=0.5))
    for t, r0, r1 in ((0, 0.0, 0.0), (5, 10.0, 10.0), (10, 20.0, 20.0), (15, 30.0, 4.0)):
        numbers, out = stage_numbers(deriver, stage_snapshot(float(t), {TTFT: {
            "0": (r0, r0, r0, r0), "1": (r1, r1, r1, r1)}}))
    assert numbers["ttft"] == kind_numbers(54.0, {"0.5": 0.25, "0.95": 0.475, "0.99": 0.495}, 0.5, 0.5, 1.0,
                                           restarted_seconds_ago=0.0, window_count_since_restart=14.0)
    assert [s.value for s in out if s.name == "llm_ttft_slo_attainment_ratio"] == [1.0]
    numbers, _ = stage_numbers(deriver, stage_snapshot(20.0, {TTFT: {"0": (40.0,) * 4, "1": (14.0,) * 4}}))
    assert numbers["ttft"]["window_count"] == 74.0
    assert numbers["ttft"]["restarted_seconds_ago"] == 5.0 and numbers["ttft"]["window_count_since_restart"] == 34.0


# --- the windows themselves (exporter/derive/window.py): what `make mutation` left alive ------


def rate_window(points: list[tuple[float, float, float]], window_s: float = 10.0, **kw) -> RateWindow:
    """A RateWindow fed (ts, counter c, gauge g) points."""
    w = RateWindow(window_s, **kw)
    for ts, c, g in points:
        w.observe(ts, {"c": c}, {"g": g})
    return w


def test_rate_window_baseline_is_the_newest_point_at_or_before_the_window_start():
    # 10 s window: at t=20 the point at t=15 is inside, the one at t=10 is exactly the start
    # (the baseline), t=0 goes: 100 over 10 s = 10/s (t=0 as baseline: 250/20 = 12.5/s).
    w = rate_window([(0, 0, 0), (10, 150, 0), (20, 250, 0)], window_s=10)
    assert w.increase("c") == (100, 10) and w.rate("c") == 10
    w = rate_window([(0, 0, 0), (15, 150, 0), (20, 250, 0)], window_s=5)
    assert w.increase("c") == (100, 5)
    # A repeated snapshot (same ts) adds nothing: the rate stays 10/s, not 20/s.
    w = rate_window([(0, 0, 0), (10, 100, 0), (10, 200, 0)], window_s=60)
    assert w.rate("c") == 10
    # At most 64 points: of 100 one-second points in a long window the oldest kept is t=36.
    w = rate_window([(float(t), 10.0 * t, 0) for t in range(100)], window_s=1e9)
    assert w.increase("c") == (630.0, 63.0)
    short = rate_window([(float(t), 10.0 * t, 0) for t in range(10)], window_s=1e9, max_points=3)
    assert short.increase("c") == (20, 2)


@pytest.mark.parametrize("stat", ["max", "mean"])
def test_rate_window_gauge_stats_leave_out_the_baseline_unless_it_is_alone(stat):
    one = rate_window([(0, 0, 7)])
    assert getattr(one, stat)("g") == 7  # a single point is the window
    two = rate_window([(0, 0, 100), (5, 0, 1)])
    assert getattr(two, stat)("g") == 1  # the baseline's 100 is before the window
    three = rate_window([(0, 0, 100), (5, 0, 3), (8, 0, 2)])
    assert getattr(three, stat)("g") == {"max": 3, "mean": 2.5}[stat]
    assert getattr(three, stat)("other") is None


def test_histogram_window_first_cycle_has_no_delta_and_a_new_layout_starts_again():
    w = HistogramWindow(30.0)
    assert w.observe(0.0, (0.5, INF), (1.0, 1.0)) is None  # one checkpoint: no window yet
    assert w.observe(1.0, (0.5, INF), (2.0, 3.0)) == (1.0, 2.0)  # a delta of 1 is kept, not dropped
    assert w.fresh == (1.0, 2.0) and w.restarted_at is None
    # Same number of buckets, other bounds (an engine upgrade): no delta against the old layout.
    assert w.observe(2.0, (1.0, INF), (5.0, 6.0)) is None
    assert w.observe(3.0, (1.0, INF), (6.0, 8.0)) == (1.0, 2.0)


def test_histogram_window_keeps_one_checkpoint_per_thirtieth_of_the_window():
    # 30 s window: a checkpoint at most once a second. At t=0.98 none (0.98 s after the last), so
    # at t=31 the baseline is still t=0's: delta 2. (A checkpoint at 0.98 would be the baseline: 1.)
    w = HistogramWindow(30.0)
    for ts, c in ((0.0, 0.0), (0.98, 1.0), (31.0, 2.0)):
        delta = w.observe(ts, (INF,), (c,))
    assert delta == (2.0,)


def test_histogram_window_restart_at_the_window_start_is_out_of_the_window():
    # Restart seen at t=10 (20 -> 1): one request since it, kept (not rounded away). At t=40 the
    # restart's checkpoint is the baseline, so the whole delta is the running process's (4, not 5
    # against the counts before the restart) and no restart is said.
    w = HistogramWindow(30.0)
    for ts, c in ((0.0, 10.0), (5.0, 20.0), (10.0, 1.0)):
        w.observe(ts, (INF,), (c,))
    assert w.restarted_at == 10.0 and w.fresh == (1.0,)
    assert w.observe(11.0, (INF,), (3.0,)) == (13.0,) and w.fresh == (3.0,)
    assert w.observe(40.0, (INF,), (5.0,)) == (4.0,)
    assert w.restarted_at is None and w.fresh == (4.0,)


class Seen:
    def __init__(self, last_seen: float | None = None) -> None:
        if last_seen is not None:
            self.last_seen = last_seen


def test_scopes_forget_stale_windows_and_evict_the_least_recently_seen():
    scopes = Scopes(lambda: RateWindow(10.0), forget_after_s=60.0)
    scopes.get("never-observed")  # last_seen -inf: stale at once
    scopes.get("edge").observe(40.0, {}, {})  # exactly forget_after_s old: kept
    scopes.sweep(100.0)
    assert len(scopes) == 1 and scopes.get("edge").last_seen == 40.0
    hist = Scopes(lambda: HistogramWindow(30.0), forget_after_s=60.0)
    hist.get("h")
    hist.sweep(0.0)
    assert len(hist) == 0
    # Something without last_seen is never stale, and goes first when one must go.
    seen = {"b": Seen(5.0), "a": Seen(9.0), "c": Seen()}
    bounded = Scopes(lambda: seen[order.pop(0)], forget_after_s=1.0, max_items=2)
    order = ["b", "a", "c", "d"]
    bounded.get("b")
    bounded.get("a")
    bounded.get("c")  # "b" (seen at 5, before "a" at 9) goes, not the alphabetical first
    assert sorted(bounded._items) == ["a", "c"]
    seen["d"] = Seen(1.0)
    bounded.get("d")  # "c" has no last_seen: it goes
    assert sorted(bounded._items) == ["a", "d"]
    bounded.sweep(1e9)
    assert sorted(bounded._items) == []
    unseen = Scopes(lambda: Seen(), forget_after_s=1.0)
    unseen.get("x")
    unseen.sweep(1e9)
    assert len(unseen) == 1


def test_quantiles_stage_numbers_keep_their_digits_and_the_note_names_the_kind():
    # p50 of 8 requests (1 under 0.5 s, 7 in 0.5-2.5 s): 0.5 + 2 x 3/7 = 1.357142857..., shown to
    # 6 digits; the restart 2.3456 s ago to 0.1 s. No TTFT bound at or below a 0.1 s SLO: the
    # note says which histogram lacks it.
    deriver = build_deriver(Config(interval_s=5.0, slo_ttft_s=0.1))
    for t, counts in ((0.0, (0.0,) * 4), (5.0, (1.0, 7.0, 7.0, 7.0)), (10.0, (0.0, 1.0, 1.0, 1.0)),
                      (12.3456, (0.0, 1.0, 1.0, 1.0))):
        numbers, _ = stage_numbers(deriver, stage_snapshot(t, {TTFT: {"": counts}}))
    assert numbers["ttft"]["quantiles"]["0.5"] == 1.357143
    assert numbers["ttft"]["restarted_seconds_ago"] == 2.3
    assert "no ttft bucket bound at or below the SLO 0.1s: attainment omitted" in (
        deriver.diagnosis()["targets"]["a"]["omitted"])


# --- KV occupancy and headroom (exporter/derive/kv.py): what `make mutation` left alive ---------


def kv_view(used: float | None = 4_000.0, capacity: float | None = 10_000.0, running: float | None = 3.0,
            memory: float | None = None, ratio: float | None = 0.4):
    from exporter.derive.view import KV_CAPACITY, EngineView

    sums = {k: v for k, v in ((KV_CAPACITY, capacity), ("llm_requests_running", running),
                              ("llm_kv_cache_memory_bytes", memory)) if v is not None}
    return EngineView("a", "engine:a", "vllm", "m", MappingProxyType(sums), MappingProxyType({}), used, ratio)


@pytest.mark.parametrize(("used", "running", "fallback", "expected"), [
    (100.0, 1.0, None, 100.0),  # one sequence holds every used token
    (1.0, 1.0, None, 1.0),
    (0.0, 2.0, 50.0, 50.0),  # nothing held: the finished requests' mean length
    (100.0, 0.0, 50.0, 50.0),
    (None, None, 1.0, 1.0),
    (None, None, 0.0, None),  # a mean length of 0 is no length
    (None, None, None, None),
])
def test_mean_context_per_running_sequence_or_the_finished_requests_length(used, running, fallback, expected):
    from exporter.derive.kv import mean_context

    assert mean_context(used, running, fallback) == expected


@pytest.mark.parametrize(("capacity", "used", "context", "expected"), [
    (10_000.0, 4_000.0, 1_000.0, 6.0),
    (10.0, 0.0, 1.0, 10.0),
    (10.0, 10.0, 0.5, 0.0),  # a full pool has room for nothing, however short the sequences
    (10.0, 11.0, 2.0, 0.0),  # over-committed (a usage ratio read before a resize): never negative
    (10.0, 0.0, 0.0, 0.0),  # no context length known: no sequences, no division
])
def test_headroom_is_whole_sequences_in_the_free_tokens(capacity, used, context, expected):
    from exporter.derive.kv import headroom_sequences

    assert headroom_sequences(capacity, used, context) == expected


def test_kv_numbers_name_every_figure_and_where_the_bytes_came_from():
    from exporter.derive.kv import compute, numbers
    from exporter.derive.throughput import Throughput
    from exporter.specs.models import kv_bytes_per_token

    shape = load_model("llama-3.1-8b")
    # The engine's own allocation, at the default of one worker: memory / capacity.
    kv = compute(kv_view(used=1_234.6, memory=1_000.0 * LLAMA_8B_KV), None, shape)
    assert numbers(kv) == dict(kv_usage_ratio=0.4, kv_used_tokens=1235.0, kv_capacity_tokens=10_000.0,
                               kv_bytes_per_token=LLAMA_8B_KV / 10.0, kv_bytes_per_token_from="engine",
                               kv_headroom_sequences=21.0)  # (10,000 - 1,234.6) / (1,234.6 / 3 running)
    assert type(numbers(kv)["kv_used_tokens"]) is float  # round(x, 0), never an int in the JSON
    # From the model shape without the engine's figure; nothing from neither.
    by_shape = numbers(compute(kv_view(), None, shape))
    assert by_shape["kv_bytes_per_token"] == kv_bytes_per_token(shape) == LLAMA_8B_KV
    assert by_shape["kv_bytes_per_token_from"] == "model shape"
    assert compute(kv_view(), None, None).bytes_source == ""
    assert numbers(compute(kv_view(), None, None))["kv_bytes_per_token_from"] is None
    # The throughput stage's running count and the finished requests' mean length come first.
    window = Throughput(running=8.0, mean_request_tokens=500.0)
    assert compute(kv_view(), window, None).mean_context == 500.0  # 4,000 tokens over 8 sequences
    assert compute(kv_view(used=0.0), window, None).mean_context == 500.0  # the fallback
    assert compute(kv_view(used=0.0), window, None).headroom_sequences == 20.0
    assert compute(kv_view(used=0.0), None, None).mean_context is None


def test_the_kv_stage_reads_the_window_s_finished_requests_when_nothing_runs():
    # Nothing running now; 10 requests of 300 + 200 tokens finished in the window: headroom is
    # the free pool over 500-token sequences, which only the throughput stage knows.
    def page(t: int) -> str:
        n = 10 * t
        return ("# TYPE vllm:cache_config_info gauge\n"
                'vllm:cache_config_info{block_size="16",num_gpu_blocks="625",kv_cache_size_tokens="10000"} 1\n'
                'vllm:num_requests_running{model_name="m"} 0\nvllm:kv_cache_usage_perc{model_name="m"} 0.0\n'
                + "".join(f'# TYPE vllm:request_{k}_tokens histogram\n'
                          f'vllm:request_{k}_tokens_bucket{{le="1000.0",model_name="m"}} {n}\n'
                          f'vllm:request_{k}_tokens_bucket{{le="+Inf",model_name="m"}} {n}\n'
                          f'vllm:request_{k}_tokens_count{{model_name="m"}} {n}\n'
                          f'vllm:request_{k}_tokens_sum{{model_name="m"}} {n * size}\n'
                          for k, size in (("prompt", 300), ("generation", 200))))
    deriver = build_deriver(Config(interval_s=1.0))
    previous = None
    for t in range(3):
        samples = normalize(page(t), target="a", kind="vllm").samples
        snap = Snapshot(1_000.0 + t, MappingProxyType({"engine:a": SourceResult(
            "engine:a", True, 0.0, float(t), tuple(samples), kind=SourceKind.ENGINE,
            attrs=MappingProxyType({"kind": "engine", "target": "a", "engine": "vllm", "model": "m"}))}))
        out = {s.name: s.value for s in deriver(snap, previous)}
        previous = snap
    assert out["llm_kv_cache_headroom_sequences"] == 20.0


# --- phase split, rates and batch (exporter/derive/throughput.py): what `make mutation` left alive


def tp_window(points: list[tuple[float, dict, dict]], window_s: float = 30.0) -> RateWindow:
    w = RateWindow(window_s)
    for ts, counters, gauges in points:
        w.observe(ts, counters, gauges)
    return w


def tp_engine(sums: dict[str, float], role: str = ""):
    from exporter.derive.view import EngineView

    return EngineView("a", "engine:a", "vllm", "m", MappingProxyType(sums), MappingProxyType({}), None, None,
                      role=role)


def _counters(scale: float, names: dict[str, float]) -> dict[str, float]:
    return {name: scale * total for name, total in names.items()}


VLLM_TEN_SECONDS = {  # increases over the 10 s between the first and last points
    "llm_prompt_tokens_total": 1000.0, "llm_generation_tokens_total": 2000.0,
    "llm_batch_prefill_time_seconds_sum": 2.0, "llm_batch_decode_time_seconds_sum": 6.0,
    "llm_request_prefill_time_seconds_sum": 1.0, "llm_request_decode_time_seconds_sum": 1.0,
    "llm_preemptions_total": 5.0,
    "llm_request_prompt_tokens_sum": 1000.0, "llm_request_prompt_tokens_count": 4.0,
    "llm_request_generation_tokens_sum": 2000.0, "llm_request_generation_tokens_count": 4.0,
    "llm_prefix_cache_hits_total": 400.0,
    "llm_spec_decode_draft_tokens_total": 100.0, "llm_spec_decode_accepted_tokens_total": 60.0,
    "llm_engine_estimated_flops_total": 1e13, "llm_engine_estimated_read_bytes_total": 1e11,
    "llm_engine_estimated_write_bytes_total": 1e10,
}


def test_throughput_of_a_vllm_window_field_by_field():
    from exporter.derive.throughput import compute

    gauges = [{"llm_requests_running": r, "llm_requests_waiting": w, "probe:in_flight": 0.0}
              for r, w in ((4.0, 1.0), (6.0, 2.0), (10.0, 4.0))]
    window = tp_window([(100.0 + 5 * i, _counters(i / 2, VLLM_TEN_SECONDS) | {"probe:tokens": 0.0}, gauges[i])
                        for i in range(3)])
    engine = tp_engine({"llm_requests_running": 10.0, "llm_requests_waiting": 4.0, "llm_requests_running_max": 16.0})
    got = compute(engine, window)._asdict()
    assert got.pop("time_source") == "per-batch forward time"
    assert got == pytest.approx(dict(
        prefill_tps=100.0, decode_tps=200.0, prefill_share=0.25, mean_batch=8.0, steps_per_s=25.0,
        preemptions_per_s=0.5, running=10.0, waiting=4.0, mean_waiting=3.0, peak_running=10.0, running_cap=16.0,
        mean_request_tokens=750.0, mean_prompt_tokens=250.0, prefill_computed_tps=60.0, prefix_hit_share=0.4,
        spec_acceptance=0.6, engine_flops_per_gpu=1e12, engine_bytes_per_gpu=1.1e10, probe_tps=0.0,
        probe_running=0.0, probe_mean_running=0.0, requests_per_s=0.4))
    # The real observe(): without a probe its in-flight gauge is 0, not 1.
    from exporter.derive.throughput import observe

    w = RateWindow(30.0)
    for ts in (0.0, 1.0):
        observe(w, engine, ts)
    assert compute(engine, w).probe_mean_running == 0.0


def test_throughput_without_token_counters_by_request_times_on_a_decode_instance():
    from exporter.derive.throughput import compute

    tgi = {k: v for k, v in VLLM_TEN_SECONDS.items()
           if k.startswith("llm_request_") and "time" not in k} | {
        "llm_request_prefill_time_seconds_sum": 3.0, "llm_request_decode_time_seconds_sum": 1.0}
    window = tp_window([(0.0, _counters(0.0, tgi), {}), (10.0, _counters(1.0, tgi), {})])
    got = compute(tp_engine({}), window)
    assert (got.prefill_tps, got.decode_tps, got.prefill_share, got.time_source) == (
        100.0, 200.0, 0.75, "per-request prefill/decode time")
    assert (got.mean_batch, got.steps_per_s, got.running, got.running_cap, got.spec_acceptance,
            got.engine_bytes_per_gpu) == (None, None, None, None, None, None)
    slots = {"llm_prefill_seconds_total": 1.0, "llm_decode_seconds_total": 3.0, "llm_generation_tokens_total": 50.0,
             "llm_prompt_tokens_total": 20.0}
    window = tp_window([(0.0, _counters(0.0, slots), {}), (10.0, _counters(1.0, slots), {})])
    decode = compute(tp_engine({}, role="decode"), window)
    assert (decode.prefill_tps, decode.prefill_computed_tps, decode.decode_tps) == (None, None, 5.0)
    assert (decode.prefill_share, decode.time_source) == (0.25, "per-slot time counters")
    assert compute(tp_engine({}), tp_window([(0.0, {}, {}), (10.0, {}, {})])).time_source == ""


@pytest.mark.parametrize(("prefill", "hits", "ratio", "expected"), [
    (100.0, 40.0, None, (60.0, 0.4)),
    (100.0, 100.0, None, (0.0, 1.0)),  # every prompt token from the cache
    (100.0, 150.0, 0.1, (0.0, 1.0)),  # more hits than prompts (a window edge): none computed
    (0.5, 0.0, None, (0.5, 0.0)),
    (0.0, 0.0, None, (0.0, None)),  # nothing prefilled: no share
    (100.0, None, 0.0, (100.0, 0.0)),
    (100.0, None, 1.0, (0.0, 1.0)),
    (100.0, None, 1.5, (100.0, None)),  # a ratio over 1 is not a ratio
    (None, 10.0, 0.5, (None, None)),
])
def test_computed_prefill_less_the_prefix_cache(prefill, hits, ratio, expected):
    from exporter.derive.throughput import computed_prefill

    assert computed_prefill(prefill, hits, ratio) == expected


@pytest.mark.parametrize(("decode", "batch", "expected"), [
    (200.0, 8.0, 25.0), (0.5, 0.5, 0.5), (0.0, 0.0, 0.0), (0.5, 0.0, None), (5.0, 0.0, None), (None, 1.0, None),
])
def test_decode_steps_per_second(decode, batch, expected):
    from exporter.derive.throughput import steps_per_second

    assert steps_per_second(decode, batch) == expected


def test_shares_means_and_acceptance_need_both_counters_and_something_counted():
    from exporter.derive.throughput import _mean_per_request, _share, compute

    def window(**increases: float) -> RateWindow:
        return tp_window([(0.0, dict.fromkeys(increases, 0.0), {}), (2.0, increases, {})])

    assert _share(window(p=0.5, d=0.5), "p", "d") == 0.5
    assert _share(window(p=0.0, d=0.0), "p", "d") is None
    assert _share(window(p=1.0), "p", "d") is None and _share(window(d=1.0), "p", "d") is None
    assert _mean_per_request(window(s=30.0, c=1.0), "s", "c") == 30.0
    assert _mean_per_request(window(s=30.0, c=0.0), "s", "c") is None
    assert _mean_per_request(window(s=30.0), "s", "c") is None and _mean_per_request(window(c=1.0), "s", "c") is None
    drafted, accepted = "llm_spec_decode_draft_tokens_total", "llm_spec_decode_accepted_tokens_total"
    assert compute(tp_engine({}), window(**{drafted: 1.0, accepted: 1.0})).spec_acceptance == 1.0
    assert compute(tp_engine({}), window(**{drafted: 10.0, accepted: 12.0})).spec_acceptance == 1.0
    assert compute(tp_engine({}), window(**{drafted: 0.0, accepted: 0.0})).spec_acceptance is None
    assert compute(tp_engine({}), window(**{accepted: 3.0})).spec_acceptance is None
    assert compute(tp_engine({}), window(**{drafted: 3.0})).spec_acceptance is None
    read, write = "llm_engine_estimated_read_bytes_total", "llm_engine_estimated_write_bytes_total"
    assert compute(tp_engine({}), window(**{read: 4.0})).engine_bytes_per_gpu == 2.0
    assert compute(tp_engine({}), window(**{write: 4.0})).engine_bytes_per_gpu == 2.0


def test_throughput_numbers_and_series_as_the_diagnosis_and_metrics_show_them():
    from exporter.derive.stage import TargetKey
    from exporter.derive.throughput import Throughput, numbers, samples

    tp = Throughput(prefill_tps=100.123, decode_tps=200.456, prefill_share=0.123456, mean_batch=7.891,
                    steps_per_s=25.4049, running=10.0, waiting=4.0, preemptions_per_s=0.123456,
                    prefill_computed_tps=60.006, prefix_hit_share=0.400049, spec_acceptance=0.612345,
                    probe_tps=3.14159)
    assert numbers(tp) == dict(
        prefill_tokens_per_second=100.12, decode_tokens_per_second=200.46, prefill_time_share=0.1235,
        mean_batch=7.89, decode_steps_per_second=25.4, running=10.0, waiting=4.0, preemptions_per_second=0.1235,
        prefill_computed_tokens_per_second=60.01, prefix_cache_hit_share=0.4, spec_decode_acceptance=0.6123,
        probe_tokens_per_second=3.14)
    labels = labels_of(target="a", engine="vllm", model="m")
    out = {(s.name, s.label("phase") or ""): s.value for s in samples(tp, TargetKey("a", "m", labels, "vllm"))}
    assert out == {("llm_prefill_tokens_per_second", ""): 100.123, ("llm_decode_tokens_per_second", ""): 200.456,
                   ("llm_mean_batch_size", ""): 7.891, ("llm_decode_steps_per_second", ""): 25.4049,
                   ("llm_spec_decode_acceptance_ratio", ""): 0.612345,
                   ("llm_phase_time_ratio", "prefill"): 0.123456, ("llm_phase_time_ratio", "decode"): 1 - 0.123456}


def test_each_target_has_its_own_rate_window_and_its_own_probe():
    # Two engines at 100 and 300 tokens/s; the probe of `a` (1 request in flight, 20 tokens/s of
    # its own) is a's alone.
    deriver = build_deriver(Config(interval_s=1.0))
    previous = None
    for t in range(3):
        results = {}
        for target, tps in (("a", 100.0), ("b", 300.0)):
            labels = labels_of(target=target, engine="vllm", model="m")
            results[f"engine:{target}"] = SourceResult(
                f"engine:{target}", True, 0.0, float(t), (
                    Sample("llm_generation_tokens_total", labels, tps * t),
                    Sample("llm_requests_running", labels, 2.0)), kind=SourceKind.ENGINE,
                attrs=MappingProxyType({"kind": "engine", "target": target, "engine": "vllm", "model": "m"}))
        probe_labels = labels_of(target="a")
        results["probe:a"] = SourceResult("probe:a", True, 0.0, float(t), tuple(
            Sample(name, probe_labels, value) for name, value in (
                ("llm_probe_up", 1.0), ("llm_probe_requests_total", float(t)),
                ("llm_probe_time_to_first_token_seconds_sum", 0.1 * t),
                ("llm_probe_time_to_first_token_seconds_count", float(t)),
                ("llm_probe_prompt_tokens_total", 5.0 * t), ("llm_probe_completion_tokens_total", 15.0 * t),
                ("llm_probe_in_flight", 1.0))), kind=SourceKind.PROBE, attrs=MappingProxyType({"target": "a"}))
        snap = Snapshot(1_000.0 + t, MappingProxyType(results))
        list(deriver(snap, previous))
        previous = snap
    targets = deriver.diagnosis()["targets"]
    assert targets["a"]["numbers"]["decode_tokens_per_second"] == 100.0
    assert targets["b"]["numbers"]["decode_tokens_per_second"] == 300.0
    assert targets["a"]["numbers"]["probe_tokens_per_second"] == 20.0
    assert targets["b"]["numbers"]["probe_tokens_per_second"] == 0.0
    from exporter.derive.throughput import compute
    from exporter.derive.view import ProbeView

    probe = ProbeView("a", 1.0, 3.0, MappingProxyType({}), 0.3, 3.0, tokens=60.0, in_flight=1.0)
    assert compute(tp_engine({}), RateWindow(30.0), probe).probe_running == 1.0


# --- the roofline position (exporter/derive/roofline.py): what `make mutation` left alive --------


def test_roofline_of_two_dp_ranks_field_by_field():
    from exporter.derive.kv import KvCache
    from exporter.derive.roofline import compute, decode_bytes_per_step, numbers, prefill_mfu
    from exporter.derive.throughput import Throughput
    from exporter.derive.view import GpuView
    from exporter.specs.models import flops_per_token, weight_bytes_read_per_step

    shape, spec = load_model("llama-3.1-8b"), lookup_gpu("h100-sxm")
    gpus = [GpuView(str(i), f"GPU-{i}", "NVIDIA H100 80GB HBM3", MappingProxyType({}), MappingProxyType({}), ())
            for i in range(4)]
    # 2 data-parallel ranks of TP 2: 12 sequences in all (6 a rank), 30 steps/s, 6,000 KV tokens of
    # 100,000 B (the engine's own figure, not the shape's 131,072).
    thr = Throughput(steps_per_s=30.0, mean_batch=12.0, prefill_tps=1_000.0, prefill_computed_tps=600.0,
                     prefix_hit_share=0.4, mean_prompt_tokens=500.0, engine_bytes_per_gpu=4e12,
                     engine_flops_per_gpu=2e14)
    kv = KvCache(used_tokens=6_000.0, bytes_per_token=100_000.0, mean_context=500.0)
    gpm = {"GPU-0": 0.5, "GPU-1": None, "GPU-2": 0.25, "GPU-3": 0.5}
    roof = compute(gpus, [spec] * 4, shape, 2, thr, kv, ranks=2, gpm=gpm)
    per_step = 2 * weight_bytes_read_per_step(shape, 6) + 6_000.0 * 100_000.0
    assert decode_bytes_per_step(shape, 12.0, 6_000.0, 2, 100_000.0) == per_step
    flops_step = 12.0 * flops_per_token(shape, 500.0)
    first = roof.gpus[0]
    assert (first.gpu, first.name) == ("0", "NVIDIA H100 80GB HBM3")
    assert [g.gpu for g in roof.gpus] == ["0", "1", "2", "3"]
    assert first.peak_bandwidth == spec.mem_bandwidth_bytes_per_s and first.peak_flops == spec.bf16_dense_flops
    assert first.model_bandwidth == pytest.approx(30.0 * per_step / 4)
    assert first.gpm_bandwidth == pytest.approx(0.5 * spec.mem_bandwidth_bytes_per_s) and first.gpm_ratio == 0.5
    assert roof.gpus[1].gpm_ratio is None and roof.gpus[1].gpm_bandwidth is None
    assert first.intensity == pytest.approx(flops_step / per_step)
    assert first.achieved_flops == pytest.approx(30.0 * flops_step / 4)
    assert (first.engine_bandwidth, first.engine_flops) == (2e12, 1e14)  # each rank's figure, summed by the view
    assert roof.mfu == pytest.approx(prefill_mfu(shape, 600.0, 4 * spec.bf16_dense_flops, 500.0, 0.4))
    assert numbers(roof) == {"prefill_mfu": round(roof.mfu, 4),
                             "engine_hbm_ratio": round(2e12 / spec.mem_bandwidth_bytes_per_s, 4),
                             "engine_flops_ratio": round(1e14 / spec.bf16_dense_flops, 4)}
    assert numbers(compute(gpus[:1], [None], shape, 1, thr, kv)) == {
        "prefill_mfu": None, "engine_hbm_ratio": None, "engine_flops_ratio": None}
    # Without the KV stage: the shape's bytes per token, a context of 0, no KV read.
    bare = compute(gpus[:1], [spec], shape, 1, thr, None)
    per_step_bare = weight_bytes_read_per_step(shape, 12)
    assert bare.gpus[0].model_bandwidth == pytest.approx(30.0 * per_step_bare)
    assert bare.gpus[0].achieved_flops == pytest.approx(30.0 * 12.0 * flops_per_token(shape, 0.0))
    assert compute(gpus[:1], [spec], shape, 1, thr._replace(mean_batch=0.5), kv).gpus[0].achieved_flops == (
        pytest.approx(30.0 * 1.0 * flops_per_token(shape, 500.0)))  # at least one sequence a step
    idle = compute(gpus[:1], [spec], shape, 1, thr._replace(mean_batch=0.0), kv).gpus[0]
    assert idle.achieved_flops is None and idle.intensity is None
    # A GPU of no known card: no peaks, no modelled figure.
    unknown = compute(gpus[:1], [None], shape, 1, thr, kv).gpus[0]
    assert (unknown.peak_bandwidth, unknown.peak_flops, unknown.model_bandwidth) == (None, None, None)
    with pytest.raises(ValueError):
        compute(gpus[:2], [spec], shape, 1, thr, kv)  # every GPU has its spec entry


def test_decode_bytes_and_prefill_flops_at_their_edges():
    import dataclasses

    from exporter.derive.roofline import decode_bytes_per_step, peak_flops, prefill_flops_per_token
    from exporter.specs.models import active_params, kv_bytes_per_token, prefill_flops, weight_bytes_read_per_step

    shape, spec = load_model("mixtral-8x7b"), lookup_gpu("h100-sxm")
    # MoE: the experts one rank's share of the batch routes to (4 of 8 sequences a rank).
    assert decode_bytes_per_step(shape, 8.0, 0.0, 2) == 2 * weight_bytes_read_per_step(shape, 4)
    assert decode_bytes_per_step(shape, 1.0, 0.0, 1) == weight_bytes_read_per_step(shape, 1)
    assert decode_bytes_per_step(shape, 0.2, 10.0, 1) == (weight_bytes_read_per_step(shape, 1)
                                                          + 10.0 * kv_bytes_per_token(shape))
    assert weight_bytes_read_per_step(shape, 1) != weight_bytes_read_per_step(shape, 2)
    two = 2.0 * active_params(shape)
    assert prefill_flops_per_token(shape, None) == prefill_flops_per_token(shape, 0.5) == two
    assert prefill_flops_per_token(shape, 1.0) == prefill_flops(shape, 1.0, start=0.0)
    assert prefill_flops_per_token(shape, 1.5) == prefill_flops(shape, 1.5, start=0.0) / 1.5
    assert prefill_flops_per_token(shape, 100.0, 0.5) == prefill_flops(shape, 50.0, start=50.0) / 50.0
    assert prefill_flops_per_token(shape, 100.0, 1.5) == prefill_flops(shape, 1.0, start=99.0)  # all cached: 1 new
    assert prefill_flops_per_token(shape, 100.0, 0.995) == prefill_flops(shape, 1.0, start=99.0)
    assert prefill_flops_per_token(shape, 100.0, 0.985) == pytest.approx(prefill_flops(shape, 1.5, start=98.5) / 1.5)
    fp4 = dataclasses.replace(shape, quantization="fp4")
    assert peak_flops(spec, fp4) == spec.fp8_dense_flops != spec.bf16_dense_flops


def test_roofline_without_a_shape_a_prefix_share_or_a_card_s_peak():
    import dataclasses

    from exporter.derive.roofline import compute, prefill_mfu, samples
    from exporter.derive.stage import TargetKey
    from exporter.derive.throughput import Throughput
    from exporter.derive.view import GpuView

    shape, spec = load_model("llama-3.1-8b"), lookup_gpu("h100-sxm")
    gpu = GpuView("0", "GPU-0", "NVIDIA H100 80GB HBM3", MappingProxyType({}), MappingProxyType({}), ())
    thr = Throughput(steps_per_s=30.0, mean_batch=4.0, prefill_tps=1_000.0, mean_prompt_tokens=500.0)
    assert compute([gpu], [spec], None, 1, thr, None).gpus[0].peak_flops == spec.bf16_dense_flops  # no shape
    fp8 = dataclasses.replace(shape, quantization="fp8")
    assert compute([gpu], [spec], fp8, 1, thr, None).gpus[0].peak_flops == spec.fp8_dense_flops  # W8A8's roof
    assert compute([gpu], [spec], shape, 1, thr, None).mfu == pytest.approx(
        prefill_mfu(shape, 1_000.0, spec.bf16_dense_flops, 500.0, 0.0))  # no prefix share known: none cached
    for peak in (0.0, 0.5):
        card = dataclasses.replace(spec, bf16_dense_flops=peak)
        mfu = compute([gpu], [card], shape, 1, thr, None).mfu
        assert mfu is None if peak == 0.0 else mfu == pytest.approx(prefill_mfu(shape, 1_000.0, 0.5, 500.0))
    # GPM's ratio stands without a card's peak (no bytes/s to give); the model's needs the peak.
    roof = compute([gpu], [None], shape, 1, thr, None, gpm={"GPU-0": 0.5})
    key = TargetKey("a", "m", labels_of(target="a", engine="vllm", model="m"), "vllm")
    out = [(s.name, s.label("source"), s.value) for s in samples(roof, key)]
    assert out == [("llm_hbm_bandwidth_efficiency_ratio", "gpm", 0.5)]


def test_the_roofline_stage_averages_each_target_s_gpm_over_its_window():
    # Targets a (GPU 0) and b (GPU 1); GPM's DRAM bandwidth ratio moves each second. The figure is
    # the mean over the rate window (the baseline left out, as the rates), per target, not this
    # second's value.
    def snap(t: float, ratios: tuple[float, float]) -> Snapshot:
        results = {}
        for target in ("a", "b"):
            labels = labels_of(target=target, engine="vllm", model="llama-3.1-8b")
            results[f"engine:{target}"] = SourceResult(
                f"engine:{target}", True, 0.0, t, (Sample("llm_requests_running", labels, 4.0),
                                                   Sample("llm_generation_tokens_total", labels, 100.0 * t)),
                attrs=MappingProxyType({"target": target, "engine": "vllm", "model": "llama-3.1-8b"}),
                kind=SourceKind.ENGINE)
        gpus = []
        for index, ratio in enumerate(ratios):
            g = labels_of(gpu=str(index), uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3")
            gpus += [Sample("llm_gpu_up", g, 1.0), Sample("llm_gpu_dram_bandwidth_utilization_ratio", g, ratio)]
        results["gpu"] = SourceResult("gpu", True, 0.0, t, tuple(gpus), kind=SourceKind.GPU)
        return Snapshot(1_000.0 + t, MappingProxyType(results))

    deriver = build_deriver(Config(model="llama-3.1-8b", target_gpus={"a": ["0"], "b": ["1"]}))
    previous = None
    for t, ratios in enumerate(((0.2, 0.1), (0.6, 0.3), (0.4, 0.2))):
        out = list(deriver(snap(float(t), ratios), previous))
        previous = snap(float(t), ratios)
    gpm = {s.label("target"): s.value for s in out
           if s.name == "llm_hbm_bandwidth_efficiency_ratio" and s.label("source") == "gpm"}
    assert gpm == pytest.approx({"a": 0.5, "b": 0.25})
    numbers = deriver.diagnosis()["targets"]["a"]["numbers"]
    assert "prefill_mfu" in numbers  # a target with GPUs has a roofline entry
    bare = build_deriver(Config())
    labels = labels_of(target="a", engine="vllm", model="m")
    list(bare(Snapshot(1_000.0, MappingProxyType({"engine:a": SourceResult(
        "engine:a", True, 0.0, 0.0, (Sample("llm_requests_running", labels, 1.0),), kind=SourceKind.ENGINE,
        attrs=MappingProxyType({"target": "a", "engine": "vllm", "model": "m"}))})), None))
    assert "prefill_mfu" not in bare.diagnosis()["targets"]["a"]["numbers"]  # nothing to place: no entry
