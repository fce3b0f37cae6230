"""Derived families: what no single source has, computed from each snapshot.

`build_deriver(config)` returns the Deriver the Collector calls once per cycle as
`deriver(snapshot, previous) -> tuple[Sample, ...]`. Each family (throughput, kv, quantiles,
roofline, energy, bottleneck) is a pure function of the snapshot view plus the Deriver's small
bounded state (rate windows, histogram checkpoints, verdict hysteresis); it never changes its
input. A family that raises is dropped for that target and cycle only, logged once, and named in
`diagnosis()`; the other families still go out.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from exporter.catalog.derived import RESOURCES
from exporter.config import Config
from exporter.derive import bottleneck, energy, kv, quantiles, roofline, throughput
from exporter.derive.bottleneck import Hysteresis, Signals
from exporter.derive.view import EngineView, GpuView, SnapshotView, ViewCache, build_view
from exporter.derive.window import HistogramWindow, RateWindow, Scopes
from exporter.snapshot import Sample, Snapshot
from exporter.specs.gpus import GpuSpec, lookup_gpu, pcie_bytes_per_s
from exporter.specs.models import ModelShape, UnsupportedModel, kv_cache_dtype_bytes, load_model

log = logging.getLogger("llm_exporter.derive")

FAMILY_STAGES = ("throughput", "kv", "quantiles", "roofline", "energy", "bottleneck")
DEFAULT_RATE_WINDOW_S = 15.0
MAX_CACHED_SHAPES = 32



class TargetResult(NamedTuple):
    """Everything derived for one target in one cycle (None: not computable or failed)."""

    engine: EngineView
    gpus: tuple[GpuView, ...]
    thr: throughput.Throughput | None
    kv: kv.KvCache | None
    tails: Mapping[str, quantiles.Tail]
    roof: roofline.Roofline | None
    energy: energy.Energy | None
    signals: Signals | None
    scores: Mapping[str, float] | None  # per resource (the evidence is worded for the diagnosis only)
    verdict: str | None
    rule: str
    omitted: tuple[str, ...]


def assign_gpus(targets: Sequence[str], gpus: Sequence[GpuView], tp: int | None,
                explicit: Mapping[str, Sequence[str]] | None = None,
                ranks: Mapping[str, int] | None = None) -> tuple[dict[str, tuple[GpuView, ...]], str]:
    """Which GPUs serve which target. Explicit `target_gpus` wins; one target gets the first
    TP x DP GPUs (all by default; DP: the target's data-parallel ranks, `ranks`); several targets
    get consecutive slices of that size in name order, or all share every GPU when there are not
    enough for a slice each."""
    by_index = {g.gpu: g for g in gpus}
    out: dict[str, tuple[GpuView, ...]] = {}
    note = ""
    rest = [t for t in targets if not (explicit and t in explicit)]
    for t in targets:
        if explicit and t in explicit:
            out[t] = tuple(by_index[str(i)] for i in explicit[t] if str(i) in by_index)
    if not rest:
        return out, note
    if not gpus:
        sizes = dict.fromkeys(rest, 0)
    elif tp:
        sizes = {t: tp * max(1, (ranks or {}).get(t, 1)) for t in rest}
    else:
        sizes = dict.fromkeys(rest, max(1, len(gpus) // len(rest)))
    if len(rest) == 1:
        size = sizes[rest[0]]
        out[rest[0]] = tuple(gpus[:size]) if size else tuple(gpus)
    elif sum(sizes.values()) <= len(gpus):
        start = 0
        for t in rest:
            out[t] = tuple(gpus[start:start + sizes[t]])
            start += sizes[t]
        each = set(sizes.values())
        what = f"{each.pop()} each" if len(each) == 1 else "tensor_parallel x data-parallel ranks each"
        note = f"GPUs assigned to targets in name order, {what} (set target_gpus to say which)"
    else:
        for t in rest:
            out[t] = tuple(gpus)
        note = "fewer GPUs than targets x tensor_parallel: every target is shown against all GPUs"
    return out, note


class Deriver:
    """Callable `(snapshot, previous) -> samples`; keeps only bounded windows and verdict state."""

    def __init__(self, config: Config, *, hold_cycles: int | None = None, rate_window_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        extra = config.extra or {}
        self.hold_cycles = int(hold_cycles or extra.get("verdict_hold_cycles", bottleneck.HOLD_CYCLES))
        rate_window = float(rate_window_s or extra.get("rate_window_s",
                                                        max(DEFAULT_RATE_WINDOW_S, 5 * config.interval_s)))
        forget = max(config.quantile_window_s, rate_window) * 2
        self._rates = Scopes(lambda: RateWindow(rate_window), forget)
        self._gpu_rates = Scopes(lambda: RateWindow(rate_window), forget)
        self._hists = Scopes(lambda: HistogramWindow(config.quantile_window_s), forget)
        self._verdicts: dict[str, Hysteresis] = {}
        self._shapes: dict[str, tuple[ModelShape | None, str]] = {}
        self._specs: dict[str, GpuSpec | None] = {}
        self._logged: set[str] = set()
        self._clock = clock
        self._diagnosis: dict[str, Any] | None = None
        self._pending: tuple | None = None
        self._views = ViewCache()
        self.last_cost_s = 0.0
        # The KV-cache dtype the engine runs with (vLLM --kv-cache-dtype), when it is not the
        # model's own: `kv_cache_dtype` in the config's extra settings, next to `model`.
        self._kv_bytes: float | None = None
        self._kv_note = ""
        kv_dtype = extra.get("kv_cache_dtype")
        if kv_dtype is not None:
            try:
                self._kv_bytes = kv_cache_dtype_bytes(str(kv_dtype))
            except ValueError as error:
                self._kv_note = f"kv_cache_dtype ignored ({error}); KV bytes use the model's KV dtype"
                log.warning("%s", self._kv_note)
        # Tests swap a stage for one that raises to check isolation.
        self.stages: dict[str, Callable[..., Any]] = {
            "throughput": self._throughput, "kv": self._kv, "quantiles": self._quantiles,
            "roofline": self._roofline, "energy": self._energy, "bottleneck": self._bottleneck,
        }

    # --- inputs ---------------------------------------------------------------------------

    def shape_for(self, engine_model: str) -> tuple[ModelShape | None, str]:
        """The model shape and, when there is none, why (for the diagnosis)."""
        key = self.config.model or engine_model
        if key in self._shapes:
            return self._shapes[key]
        if not key:
            found: tuple[ModelShape | None, str] = (None, "model shape unknown: set --model (a built-in name or "
                                                              "a config.json path)")
        else:
            try:
                found = (load_model(key), "")
            except UnsupportedModel as error:
                found = (None, f"model shape unsupported: {error}")
            except KeyError:
                how = "--model" if self.config.model else f"the engine reports {key!r}, not a built-in shape: set --model"
                found = (None, f"model shape unknown: {how} (a built-in name or a config.json path)")
            except (OSError, ValueError) as error:
                found = (None, f"model shape unreadable ({key}): {error}")
        if found[0] is not None and self._kv_bytes is not None:
            found = (dataclasses.replace(found[0], kv_dtype_bytes=self._kv_bytes), found[1])
        if len(self._shapes) >= MAX_CACHED_SHAPES:
            self._shapes.clear()
        self._shapes[key] = found
        return found

    def spec_for(self, gpu_name: str) -> GpuSpec | None:
        if gpu_name not in self._specs:
            overrides = (self.config.extra or {}).get("gpu_spec") or None
            try:
                self._specs[gpu_name] = lookup_gpu(gpu_name, overrides)
            except ValueError as error:
                self._note_once("gpu_spec", f"GPU spec override rejected: {error}")
                self._specs[gpu_name] = lookup_gpu(gpu_name)
        return self._specs[gpu_name]

    def _note_once(self, key: str, message: str, exc: bool = False) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s", message, exc_info=exc)

    # --- stages -----------------------------------------------------------------------------

    def _throughput(self, ctx: _Ctx) -> throughput.Throughput:
        window = self._rates.get(ctx.engine.target)
        throughput.observe(window, ctx.engine, ctx.now)
        return throughput.compute(ctx.engine, window)

    def _kv(self, ctx: _Ctx) -> kv.KvCache:
        return kv.compute(ctx.engine, ctx.thr, ctx.shape)

    def _quantiles(self, ctx: _Ctx) -> dict[str, quantiles.Tail]:
        tails = {}
        thresholds = {"ttft": self.config.slo_ttft_s, "tbt": self.config.slo_tbt_s, "e2e": None}
        for hist_name, _, _, kind in quantiles.SERIES:
            hist = ctx.engine.histograms.get(hist_name)
            if hist is None:
                continue
            window: HistogramWindow = self._hists.get(f"{ctx.engine.target}\0{kind}")
            delta = window.observe(ctx.now, hist.bounds, hist.counts, hist.series)
            if delta is None:
                continue
            tails[kind] = quantiles.tail(kind, hist.bounds, delta, thresholds[kind])
        return tails

    def _roofline(self, ctx: _Ctx) -> roofline.Roofline:
        specs = [self.spec_for(g.name) for g in ctx.gpus]
        return roofline.compute(ctx.gpus, specs, ctx.shape, ctx.tp, ctx.thr, ctx.kv, ctx.dp)

    def _energy(self, ctx: _Ctx) -> energy.Energy:
        def rate(gpu: GpuView) -> float | None:
            return self._gpu_rates.get(gpu.key).rate(energy.ENERGY)

        decode = ctx.thr.decode_tps if ctx.thr is not None else None
        return energy.compute(ctx.gpus, rate, decode, self.config.gpu_price_per_hour,
                              len(ctx.gpus) or ctx.tp * ctx.dp)

    def _bottleneck(self, ctx: _Ctx) -> tuple[Signals, dict[str, float], str, str]:
        signals = self.signals(ctx)
        scores = bottleneck.scores(signals)
        state = self._verdicts.get(ctx.engine.target) or Hysteresis()
        raw, rule = bottleneck.raw_verdict(signals, scores, state.verdict)
        if not raw:
            raise _NotYet(rule)
        state = bottleneck.settle(state, raw, ctx.now, self.hold_cycles)
        self._verdicts[ctx.engine.target] = state
        assert state.verdict is not None
        if state.verdict != raw:
            rule = f"held: {raw} must win {self.hold_cycles} cycles in a row first"
        return signals, scores, state.verdict, rule

    # --- signals for the verdict ------------------------------------------------------------

    def signals(self, ctx: _Ctx) -> Signals:
        thr, kvc, roof, tails, gpus = ctx.thr, ctx.kv, ctx.roof, ctx.tails, ctx.gpus
        host = ctx.view.host
        values: dict[str, Any] = _gpu_health(gpus, self.spec_for)
        values["tp"] = ctx.tp
        values["gpus_known"] = bool(gpus)
        if thr is not None:
            values["running"], values["waiting"], values["mean_batch"] = thr.running, thr.waiting, thr.mean_batch
            values["prefill_tps"], values["decode_tps"] = thr.prefill_tps, thr.decode_tps
            values["prefill_share"], values["time_source"] = thr.prefill_share, thr.time_source
            values["preemptions_per_s"] = thr.preemptions_per_s
            values["prefix_hit_share"] = thr.prefix_hit_share
        if kvc is not None:
            values["kv_usage"], values["kv_headroom"] = kvc.usage_ratio, kvc.headroom_sequences
        if roof is not None:
            values["hbm_gpm"] = _mean([g.gpm_ratio for g in roof.gpus])
            values["hbm_model"] = _mean([g.model_ratio for g in roof.gpus])
            values["mfu"] = roof.mfu
        values["tensor_active"] = _mean([g.values.get("llm_gpu_tensor_active_ratio") for g in gpus])
        values["gpu_util"] = _mean([g.values.get("llm_gpu_utilization_ratio") for g in gpus])
        values["busiest_thread"] = host.get("llm_engine_process_busiest_thread_cpu_ratio")
        values["cpu_all"] = host.get("cpu_all")
        if "llm_engine_numa_mismatch" in host:
            values["numa_mismatch"] = host["llm_engine_numa_mismatch"] >= 0.5
        for kind, p99, attainment, bound in (("ttft", "ttft_p99", "ttft_attainment", "ttft_bound"),
                                             ("tbt", "tbt_p99", "tbt_attainment", "tbt_bound")):
            tail = tails.get(kind)
            if tail is not None:
                values[p99], values[attainment], values[bound] = tail.quantile(0.99), tail.slo_attainment, tail.slo_bound
        return Signals(**values)

    # --- the cycle --------------------------------------------------------------------------

    def _run(self, stage: str, ctx: _Ctx, omitted: list[str]) -> Any:
        try:
            return self.stages[stage](ctx)
        except _NotYet as why:
            omitted.append(f"{stage}: {why}")
            return None
        except Exception as error:  # noqa: BLE001 - one failing family must not take the others down
            self._note_once(f"stage:{stage}", f"derived family {stage} failed; dropping it: {error!r}", exc=True)
            omitted.append(f"{stage} failed this cycle: {type(error).__name__}: {error}")
            return None

    def __call__(self, snapshot: Snapshot, previous: Snapshot | None = None) -> tuple[Sample, ...]:
        started = self._clock()
        view = build_view(snapshot, self._views)
        now = snapshot.taken_at
        for gpu in view.gpus:
            joules = gpu.values.get(energy.ENERGY)
            if joules is not None:
                self._gpu_rates.get(gpu.key).observe(now, {energy.ENERGY: joules}, {})
        assignment, note = assign_gpus([e.target for e in view.engines], view.gpus, self.config.tensor_parallel,
                                       (self.config.extra or {}).get("target_gpus"),
                                       {e.target: e.ranks for e in view.engines})
        out: list[Sample] = []
        results: list[TargetResult] = []
        for engine in view.engines:
            result, samples = self._target(view, engine, assignment.get(engine.target, ()))
            results.append(result)
            out.extend(samples)
        for scopes in (self._rates, self._gpu_rates, self._hists):
            scopes.sweep(now)
        live = {e.target for e in view.engines} | {d.target for d in view.engines_down}
        for target in [t for t in self._verdicts if t not in live]:
            del self._verdicts[target]
        self.last_cost_s = self._clock() - started
        # The diagnosis is built when asked for (HTTP, doctor), not every cycle: the inputs are
        # immutable records, only the verdict states are copied.
        self._pending = (view, tuple(results), dict(self._verdicts), note, self.last_cost_s)
        self._diagnosis = None
        return tuple(out)

    def _target(self, view: SnapshotView, engine: EngineView, gpus: tuple[GpuView, ...]
                ) -> tuple[TargetResult, list[Sample]]:
        omitted: list[str] = []
        shape, why = self.shape_for(engine.model)
        if shape is None:
            omitted.append(why + "; KV bytes, modelled HBM bandwidth and prefill MFU are omitted")
        if not gpus:
            omitted.append("no GPU source or no GPUs seen: per-GPU roofline, GPM bandwidth and energy are omitted"
                           if view.gpu_source in ("", "ok") else f"GPU source failing ({view.gpu_source})")
        else:
            unknown = sorted({g.name for g in gpus if self.spec_for(g.name) is None})
            if unknown:
                omitted.append(f"no peak spec for {', '.join(unknown)}: set gpu_spec overrides for efficiency ratios")
        if self.config.gpu_price_per_hour is None:
            omitted.append("cost per million tokens: set --gpu-price-per-hour")
        # Data-parallel ranks each hold a full copy of the model on TP GPUs of their own.
        dp = max(1, engine.ranks)
        tp = self.config.tensor_parallel or max(1, len(gpus) // dp)
        if self._kv_note:
            omitted.append(self._kv_note)
        ctx = _Ctx(view, engine, gpus, shape, tp, now=view.taken_at, dp=dp)
        labels = (("model", engine.model), ("target", engine.target))  # labels_of(): sorted by name
        samples: list[Sample] = []
        ctx.thr = self._run("throughput", ctx, omitted)
        ctx.kv = self._run("kv", ctx, omitted)
        ctx.tails = self._run("quantiles", ctx, omitted) or {}
        ctx.roof = self._run("roofline", ctx, omitted) if gpus or shape is not None else None
        ctx.energy = self._run("energy", ctx, omitted)
        decided = self._run("bottleneck", ctx, omitted)
        signals, scores, verdict, rule = decided if decided is not None else (None, None, None, "")
        for stage, fn in (("throughput", lambda: throughput.samples(ctx.thr, labels) if ctx.thr else []),
                          ("kv", lambda: kv.samples(ctx.kv, labels) if ctx.kv else []),
                          ("quantiles", lambda: _tail_samples(ctx.tails, labels)),
                          ("roofline", lambda: roofline.samples(ctx.roof, engine.target, engine.model)
                           if ctx.roof else []),
                          ("energy", lambda: energy.samples(ctx.energy, labels) if ctx.energy else []),
                          ("bottleneck", lambda: bottleneck.samples(engine.target, verdict, scores)
                           if verdict and scores else [])):
            try:
                samples.extend(fn())
            except Exception as error:  # noqa: BLE001 - same isolation for rendering a family's samples
                self._note_once(f"samples:{stage}", f"derived family {stage} failed; dropping it: {error!r}", exc=True)
                omitted.append(f"{stage} failed this cycle: {type(error).__name__}: {error}")
        for tail in ctx.tails.values():
            if tail.note:
                omitted.append(tail.note)
        result = TargetResult(engine, gpus, ctx.thr, ctx.kv, ctx.tails, ctx.roof, ctx.energy, signals, scores,
                              verdict, rule, tuple(omitted))
        return result, samples

    def diagnosis(self) -> dict[str, Any]:
        """The last cycle's verdicts with evidence and remedies (JSON-ready)."""
        if self._diagnosis is None:
            if self._pending is None:
                return {"ready": False, "status": "unknown", "targets": {}, "unreachable": [],
                        "notes": ["no collection cycle finished yet"]}
            self._diagnosis = build_diagnosis(*self._pending)
        return self._diagnosis


class _NotYet(Exception):
    """A stage has nothing to say yet (not a failure: not logged)."""


class _Ctx:
    """Per-target inputs handed from stage to stage within one cycle (never kept)."""

    __slots__ = ("view", "engine", "gpus", "shape", "tp", "dp", "now", "thr", "kv", "tails", "roof", "energy")

    def __init__(self, view: SnapshotView, engine: EngineView, gpus: tuple[GpuView, ...], shape: ModelShape | None,
                 tp: int, now: float, dp: int = 1) -> None:
        self.view, self.engine, self.gpus, self.shape, self.tp, self.now = view, engine, gpus, shape, tp, now
        self.dp = dp
        self.thr: throughput.Throughput | None = None
        self.kv: kv.KvCache | None = None
        self.tails: dict[str, quantiles.Tail] = {}
        self.roof: roofline.Roofline | None = None
        self.energy: energy.Energy | None = None


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


_IGNORED_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost",
                              "none"})


def _gpu_health(gpus: Sequence[GpuView], spec_for: Callable[[str], GpuSpec | None]) -> dict[str, Any]:
    """Link state, link load, throttle reasons, clocks and temperature of the target's GPUs."""
    degraded, throttles, capped = [], [], []
    clock_ratios, temps = [], []
    link_util, link_what = None, ""
    severe, power_cap = bottleneck.SEVERE_REASONS, bottleneck.POWER_CAP
    for g in gpus:
        get = g.values.get  # g.get() without a Python call per name
        busy = (get("llm_gpu_utilization_ratio") or 0.0) >= 0.05 or "gpu_idle" not in g.reasons_active
        gen = g.link.get(("llm_gpu_pcie_link_generation", "current"))
        gen_max = g.link.get(("llm_gpu_pcie_link_generation", "max"))
        width = g.link.get(("llm_gpu_pcie_link_width", "current"))
        width_max = g.link.get(("llm_gpu_pcie_link_width", "max"))
        if busy and gen is not None and width is not None and gen_max is not None and width_max is not None \
                and (gen < gen_max or width < width_max):
            degraded.append(f"GPU{g.gpu} gen{gen:.0f} x{width:.0f} (max gen{gen_max:.0f} x{width_max:.0f})")
        if gen is not None and width is not None and 1 <= gen <= 6 and width > 0:
            capacity = pcie_bytes_per_s(int(gen), int(width))
            traffic = max(get("llm_gpu_pcie_tx_bytes_per_second") or 0.0, get("llm_gpu_pcie_rx_bytes_per_second") or 0.0)
            if traffic > 0 and (link_util is None or traffic / capacity > link_util):
                link_util, link_what = traffic / capacity, f"GPU{g.gpu} PCIe traffic"
        spec = spec_for(g.name)
        nvlink_cap = spec.nvlink_unidirectional_bytes_per_s if spec is not None else None
        nvl = max(get("llm_gpu_nvlink_tx_bytes_per_second") or 0.0, get("llm_gpu_nvlink_rx_bytes_per_second") or 0.0)
        if nvlink_cap and nvl > 0 and (link_util is None or nvl / nvlink_cap > link_util):
            link_util, link_what = nvl / nvlink_cap, f"GPU{g.gpu} NVLink traffic"
        for reason in g.reasons_active:
            if reason in severe and busy:
                throttles.append(f"GPU{g.gpu} {reason}")
            elif reason == power_cap and busy:
                capped.append(f"GPU{g.gpu}")
        clock, clock_max = get("llm_gpu_sm_clock_hertz"), get("llm_gpu_sm_clock_max_hertz")
        if busy and clock and clock_max:
            clock_ratios.append(clock / clock_max)
        temp = get("llm_gpu_temperature_celsius")
        if temp is not None:
            temps.append(temp)
    return {"degraded_links": tuple(degraded), "throttles": tuple(throttles), "power_capped": tuple(capped),
            "clock_ratio": min(clock_ratios) if clock_ratios else None, "temperature": max(temps) if temps else None,
            "link_util": link_util, "link_util_what": link_what}


def _tail_samples(tails: Mapping[str, quantiles.Tail], labels) -> list[Sample]:
    out = []
    for _, window_name, slo_name, kind in quantiles.SERIES:
        if kind in tails:
            out.extend(quantiles.samples(tails[kind], window_name, slo_name, labels))
    return out


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _numbers(r: TargetResult) -> dict[str, Any]:
    thr, kvc, en, roof = r.thr, r.kv, r.energy, r.roof
    out: dict[str, Any] = {}
    if thr is not None:
        out.update(prefill_tokens_per_second=_round(thr.prefill_tps, 2), decode_tokens_per_second=_round(thr.decode_tps, 2),
                   prefill_time_share=_round(thr.prefill_share), mean_batch=_round(thr.mean_batch, 2),
                   decode_steps_per_second=_round(thr.steps_per_s, 2), running=thr.running, waiting=thr.waiting,
                   preemptions_per_second=_round(thr.preemptions_per_s),
                   prefill_computed_tokens_per_second=_round(thr.prefill_computed_tps, 2),
                   prefix_cache_hit_share=_round(thr.prefix_hit_share))
    if kvc is not None:
        out.update(kv_usage_ratio=_round(kvc.usage_ratio), kv_used_tokens=_round(kvc.used_tokens, 0),
                   kv_capacity_tokens=kvc.capacity_tokens, kv_bytes_per_token=kvc.bytes_per_token,
                   kv_headroom_sequences=kvc.headroom_sequences)
    if roof is not None:
        out["prefill_mfu"] = _round(roof.mfu)
    if en is not None:
        out.update(power_watts=_round(en.power_watts, 1), joules_per_token=_round(en.joules_per_token),
                   cost_per_million_tokens=_round(en.cost_per_million))
    for kind, tail in r.tails.items():
        out[kind] = {"window_count": tail.count,
                     "quantiles": {quantiles.format_q(q): _round(v, 6) for q, v in tail.quantiles},
                     "slo_seconds": tail.slo_threshold, "slo_bound_used": tail.slo_bound,
                     "slo_attainment": _round(tail.slo_attainment)}
    return out


def _gpu_rows(r: TargetResult) -> list[dict[str, Any]]:
    if r.roof is None:
        return [{"gpu": g.gpu, "name": g.name} for g in r.gpus]
    return [{
        "gpu": g.gpu, "name": g.name, "peak_bandwidth_bytes_per_second": g.peak_bandwidth,
        "peak_flops": g.peak_flops, "model_bandwidth_bytes_per_second": _round(g.model_bandwidth, 0),
        "model_ratio": _round(g.model_ratio), "gpm_bandwidth_bytes_per_second": _round(g.gpm_bandwidth, 0),
        "gpm_ratio": _round(g.gpm_ratio), "intensity_flops_per_byte": _round(g.intensity, 3),
        "achieved_flops": _round(g.achieved_flops, 0),
    } for g in r.roof.gpus]


def target_diagnosis(r: TargetResult, state: Hysteresis | None) -> dict[str, Any]:
    out: dict[str, Any] = {"target": r.engine.target, "engine": r.engine.engine, "model": r.engine.model,
                           "verdict": r.verdict, "rule": r.rule, "omitted": list(r.omitted),
                           "numbers": _numbers(r), "gpus": _gpu_rows(r)}
    if r.verdict is None or r.scores is None or r.signals is None:
        out.update(status="unknown", scores={}, evidence=[], remedies=[], degraded_because=[])
        return out
    # The verdict's own evidence first, then the context, then what the other resources show.
    evidence: list[str] = []
    assessment = bottleneck.assess(r.signals)  # the same scores, now with their words
    rest = [assessment.evidence.get(res, ()) for res in RESOURCES if res != r.verdict]
    for group in (assessment.evidence.get(r.verdict, ()), assessment.context, *rest):
        evidence.extend(e for e in group if e not in evidence)
    degraded = bottleneck.is_degraded(r.verdict, r.signals)
    out.update(status="degraded" if degraded else "healthy", degraded_because=degraded,
               scores=dict(r.scores), evidence=evidence,
               remedies=list(bottleneck.REMEDIES[r.verdict]), since=state.since if state else None)
    return out


def build_diagnosis(view: SnapshotView, results: Sequence[TargetResult], verdicts: Mapping[str, Hysteresis],
                    note: str, cost_s: float) -> dict[str, Any]:
    targets = {r.engine.target: target_diagnosis(r, verdicts.get(r.engine.target)) for r in results}
    unreachable = [{"target": d.target, "reason": d.reason} for d in view.engines_down]
    statuses = [t["status"] for t in targets.values()]
    if not targets:
        status = "unknown"
    elif "degraded" in statuses or unreachable:
        status = "degraded"
    elif "unknown" in statuses:
        status = "unknown"
    else:
        status = "healthy"
    notes = [note] if note else []
    if not targets and not unreachable:
        notes.append("no engine target configured or seen")
    return {"ready": True, "taken_at": view.taken_at, "status": status, "targets": targets,
            "unreachable": unreachable, "notes": notes, "derive_seconds": round(cost_s, 6)}


def build_deriver(config: Config) -> Deriver:
    return Deriver(config)


__all__ = ["FAMILY_STAGES", "Deriver", "TargetResult", "assign_gpus", "build_deriver"]
