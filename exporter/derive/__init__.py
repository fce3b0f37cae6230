"""Derived families: what no single source has, computed from each snapshot.

`build_deriver(config)` returns the Deriver the Collector calls once per cycle as
`deriver(snapshot, previous) -> tuple[Sample, ...]`. The families come from STAGES, run in that
order per target (stage.py has the contract; each family module declares its STAGE). A stage
is a pure function of the snapshot view, the earlier stages' results and its own small bounded
state (rate windows, histogram checkpoints, verdict hysteresis); it never changes its input. A
stage that raises is dropped for that target and cycle only, logged once, and named in
`diagnosis()`; the other stages still go out.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from exporter.config import Config
from exporter.derive import (
    energy,
    health,
    kv,
    modelcheck,
    probe,
    quantiles,
    roofline,
    routing,
    scaling,
    signals,
    throughput,
    transfer,
)
from exporter.derive.assign import assign_gpus
from exporter.derive.diagnosis import Cycle, TargetResult, build_diagnosis, not_ready
from exporter.derive.settings import DeriveSettings, derive_settings
from exporter.derive.stage import Ctx, NotYet, Stage, StageState, TargetKey, check_order, view_needs
from exporter.derive.view import EngineView, GpuView, SnapshotView, ViewCache, build_view
from exporter.snapshot import Sample, Snapshot, labels_of
from exporter.specs.gpus import GpuSpec, lookup_gpu
from exporter.specs.models import ModelShape, UnsupportedModel, kv_cache_dtype_bytes, load_model

log = logging.getLogger("llm_exporter.derive")

# In the order they run: a stage reads only the results of stages before it (check_order). The
# diagnosis lists their numbers in this order too.
STAGES: tuple[Stage, ...] = (health.STAGE, routing.STAGE, throughput.STAGE, kv.STAGE, roofline.STAGE, energy.STAGE,
                             modelcheck.STAGE, scaling.STAGE,
                             quantiles.STAGE, transfer.STAGE, signals.STAGE, probe.STAGE)
check_order(STAGES)
MAX_CACHED_SHAPES = 32
_SHAPE_HOW = "(a built-in name or a config.json path)"


class ShapeLookup(NamedTuple):
    shape: ModelShape | None
    why: str  # why there is no shape ("" when there is one)


class Deriver:
    """Callable `(snapshot, previous) -> samples`; keeps only bounded windows and verdict state."""

    def __init__(self, config: Config, *, clock: Callable[[], float] = time.perf_counter,
                 stages: Sequence[Stage] = STAGES) -> None:
        self.settings: DeriveSettings = derive_settings(config)
        check_order(stages)
        self.stages = tuple(stages)
        self.state: dict[str, StageState] = {s.name: s.state(self.settings) for s in self.stages if s.state}
        self._views = ViewCache(view_needs(self.stages))
        self._shapes: dict[str, ShapeLookup] = {}
        self._specs: dict[str, GpuSpec | None] = {}
        self._logged: set[str] = set()
        self._clock = clock
        # Engine targets that gave a scrape at least once (bounded by the snapshot's targets): one
        # that never did is a dead target, and an exporter none of whose targets ever answered
        # cannot tell anything (doctor's exit 3, as `doctor --engine` on the same URL; docs/cli.md).
        self._answered: set[str] = set()
        self._diagnosis: dict[str, Any] | None = None
        self._cycle: Cycle | None = None
        self.last_cost_s = 0.0
        # The KV-cache dtype the engine runs with (vLLM --kv-cache-dtype), when it is not the
        # model's own: `kv_cache_dtype` next to `model`.
        self._kv_bytes: float | None = None
        self._kv_note = ""
        if self.settings.kv_cache_dtype is not None:
            try:
                self._kv_bytes = kv_cache_dtype_bytes(self.settings.kv_cache_dtype)
            except ValueError as error:
                self._kv_note = f"kv_cache_dtype ignored ({error}); KV bytes use the model's KV dtype"
                log.warning("%s", self._kv_note)

    # --- inputs ---------------------------------------------------------------------------

    def shape_for(self, engine_model: str) -> ShapeLookup:
        """The model shape and, when there is none, why (for the diagnosis)."""
        configured = self.settings.model
        key = configured or engine_model
        if key in self._shapes:
            return self._shapes[key]
        if not key:
            found = ShapeLookup(None, f"model shape unknown: set --model {_SHAPE_HOW}")
        else:
            try:
                found = ShapeLookup(load_model(key), "")
            except UnsupportedModel as error:
                found = ShapeLookup(None, f"model shape unsupported: {error}")
            except KeyError:
                how = "--model" if configured else \
                    f"the engine reports {key!r}, not a built-in shape: set --model"
                found = ShapeLookup(None, f"model shape unknown: {how} {_SHAPE_HOW}")
            except (OSError, ValueError) as error:
                found = ShapeLookup(None, f"model shape unreadable ({key}): {error}")
        if found.shape is not None and self._kv_bytes is not None:
            found = ShapeLookup(dataclasses.replace(found.shape, kv_dtype_bytes=self._kv_bytes), found.why)
        if len(self._shapes) >= MAX_CACHED_SHAPES:
            self._shapes.clear()
        self._shapes[key] = found
        return found

    def spec_for(self, gpu_name: str) -> GpuSpec | None:
        if gpu_name not in self._specs:
            try:
                self._specs[gpu_name] = lookup_gpu(gpu_name, self.settings.gpu_spec)
            except ValueError as error:
                self._note_once("gpu_spec", f"GPU spec override rejected: {error}")
                self._specs[gpu_name] = lookup_gpu(gpu_name)
        return self._specs[gpu_name]

    def _note_once(self, key: str, message: str, exc: bool = False) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s", message, exc_info=exc)

    def _failed(self, what: str, stage: str, error: Exception, omitted: list[str]) -> None:
        self._note_once(f"{what}:{stage}", f"derived family {stage} failed; dropping it: {error!r}", exc=True)
        omitted.append(f"{stage} failed this cycle: {type(error).__name__}: {error}")

    # --- the cycle --------------------------------------------------------------------------

    def __call__(self, snapshot: Snapshot, previous: Snapshot | None = None) -> tuple[Sample, ...]:
        started = self._clock()
        view = build_view(snapshot, self._views)
        for state in self.state.values():
            state.begin(view)
        settings = self.settings
        assignment, note = assign_gpus([e.target for e in view.engines], view.gpus, settings.tensor_parallel,
                                       settings.target_gpus, {e.target: e.ranks for e in view.engines})
        out: list[Sample] = []
        results: list[TargetResult] = []
        for engine in view.engines:
            result, samples = self._target(view, engine, assignment.get(engine.target, ()))
            results.append(result)
            out.extend(samples)
        routes = self.state.get(routing.STAGE.name)
        if isinstance(routes, routing.RoutingState) and view.routers:
            medians = {(r.engine.target, kind): p50 for r in results
                       for kind, tail in (r.results.get(quantiles.STAGE.name) or {}).items()
                       if (p50 := tail.quantile(0.5)) is not None}
            out.extend(routing.router_samples(routes, view.now, medians))
        for state in self.state.values():
            state.end(view)
        self.last_cost_s = self._clock() - started
        # The diagnosis is built when asked for (HTTP, doctor), not every cycle: its inputs are
        # immutable records.
        seen = {e.target for e in view.engines}
        self._answered = (self._answered | seen) & (seen | {d.target for d in view.engines_down})
        never = tuple(d.target for d in view.engines_down if d.target not in self._answered)
        health_state = self.state.get(health.STAGE.name)
        faults = health_state.all_faults() if isinstance(health_state, health.HealthState) else ()
        self._cycle = Cycle(view, tuple(results), note, self.last_cost_s, faults, never)
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
        if self.settings.gpu_price_per_hour is None:
            omitted.append("cost per million tokens: set --gpu-price-per-hour")
        # Data-parallel ranks each hold a full copy of the model on TP GPUs of their own.
        dp = max(1, engine.ranks)
        tp = self.settings.tensor_parallel or max(1, len(gpus) // dp)
        if self._kv_note:
            omitted.append(self._kv_note)
        key = TargetKey(engine.target, engine.model,
                        labels_of(engine=engine.engine, model=engine.model, target=engine.target), engine.engine)
        ctx = Ctx(view, engine, gpus, shape, tp, dp, key, self.settings, self.spec_for)
        for stage in self.stages:
            ctx.results[stage.name] = self._compute(stage, ctx, omitted)
        found = {name: result for name, result in ctx.results.items() if result is not None}
        samples: list[Sample] = []
        for stage in self.stages:
            if stage.name in found:
                try:
                    rendered = stage.samples(found[stage.name], key)
                except Exception as error:  # noqa: BLE001 - same isolation for rendering a stage's samples
                    self._failed("samples", stage.name, error, omitted)
                    continue
                # A derived value is never NaN or infinite: a bounded input can still meet a tiny divisor.
                kept = [s for s in rendered if s.value - s.value == 0.0]
                if len(kept) < len(rendered):
                    names = sorted({s.name for s in rendered if s.value - s.value != 0.0})
                    omitted.append(f"{stage.name}: dropped {len(rendered) - len(kept)} non-finite value(s) of "
                                   + ", ".join(names[:4]))
                samples.extend(kept)
        for stage in self.stages:
            if stage.notes is not None and stage.name in found:
                omitted.extend(stage.notes(found[stage.name]))
        return TargetResult(engine, gpus, found, tuple(omitted)), samples

    def _compute(self, stage: Stage, ctx: Ctx, omitted: list[str]) -> Any:
        try:
            return stage.compute(ctx, self.state.get(stage.name))
        except NotYet as why:
            omitted.append(f"{stage.name}: {why}")
        except Exception as error:  # noqa: BLE001 - one failing stage must not take the others down
            self._failed("stage", stage.name, error, omitted)
        return None

    def diagnosis(self) -> dict[str, Any]:
        """The last cycle's verdicts with evidence and remedies (JSON-ready)."""
        if self._diagnosis is None:
            if self._cycle is None:
                return not_ready()
            self._diagnosis = build_diagnosis(self._cycle, self.stages)
        return self._diagnosis


def build_deriver(config: Config) -> Deriver:
    return Deriver(config)


__all__ = ["STAGES", "Deriver", "DeriveSettings", "Stage", "TargetResult", "assign_gpus", "build_deriver",
           "derive_settings"]
