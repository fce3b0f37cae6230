"""The Stage contract: what each derived family module declares, and the one way it is run.

A stage names what it reads: engine samples and histograms, GPU and host families (the view
keeps exactly the union of these: view_needs()), and the earlier stages whose results it reads.
Per target and cycle the Deriver calls `compute(ctx, state)`, then `samples(result, key)` and
puts `numbers(result)` into the diagnosis (a stage does one or both: the probe stage only
feeds the diagnosis). compute returns None when it has nothing to say, and
raises NotYet (with the reason, shown in the diagnosis) when it cannot say it yet; any other
exception drops only this stage's families for that target and cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from exporter.derive.settings import DeriveSettings
from exporter.derive.view import EngineView, GpuView, SnapshotView, ViewNeeds
from exporter.derive.window import Scopes
from exporter.snapshot import Labels, Sample
from exporter.specs.gpus import GpuSpec
from exporter.specs.models import ModelShape


class NotYet(Exception):
    """A stage has nothing to say yet (not a failure: not logged)."""


class TargetKey(NamedTuple):
    target: str
    model: str
    # (("engine", engine), ("model", model), ("target", target)): labels_of(), sorted by name. The
    # engine label is the one every engine series of the target carries, so derived series and the
    # alerts built on them name the engine as the target's other series do.
    labels: Labels
    engine: str = ""


class StageState:
    """State one stage keeps between cycles (one per Deriver). `begin` runs once per cycle before
    any target, `end` after all of them (to forget targets and GPUs that went)."""

    def begin(self, view: SnapshotView) -> None:
        pass

    def end(self, view: SnapshotView) -> None:
        pass


class ScopedWindows(StageState):
    """One window per scope (a target, a target and series kind), made by `window()` when first
    asked for and forgotten a while after its scope was last seen, so targets that go leak nothing."""

    def __init__(self, settings: DeriveSettings, window: Callable[[], Any]) -> None:
        self.windows = Scopes(window, settings.forget_after_s)

    def end(self, view: SnapshotView) -> None:
        self.windows.sweep(view.now)


class Ctx:
    """One target's inputs in one cycle, and the results of the stages run so far (never kept)."""

    __slots__ = ("view", "engine", "gpus", "shape", "tp", "dp", "now", "key", "settings", "spec_for",
                 "results")

    def __init__(self, view: SnapshotView, engine: EngineView, gpus: tuple[GpuView, ...],
                 shape: ModelShape | None, tp: int, dp: int, key: TargetKey, settings: DeriveSettings,
                 spec_for: Callable[[str], GpuSpec | None]) -> None:
        self.view, self.engine, self.gpus, self.shape, self.tp, self.dp = view, engine, gpus, shape, tp, dp
        self.now = view.now  # steady: windows and verdict hold times
        self.key, self.settings, self.spec_for = key, settings, spec_for
        self.results: dict[str, Any] = {}  # stage name -> result (None: none, failed or not yet)

    def get(self, stage: str) -> Any:
        """An earlier stage's result (it must be in this stage's `after`)."""
        return self.results.get(stage)


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    compute: Callable[[Ctx, Any], Any]  # (ctx, this stage's state or None) -> result
    # (result, target) -> samples; result is not None. A sequence: the Deriver reads it twice.
    samples: Callable[[Any, TargetKey], Sequence[Sample]]
    emits: tuple[str, ...]  # the derived families its samples belong to
    engine: tuple[str, ...] = ()  # engine sample names (view.EngineView.sums and its KV/prefix fields)
    histograms: tuple[str, ...] = ()  # engine histogram families (view.EngineView.histograms)
    gpu: tuple[str, ...] = ()  # GPU families (view.GpuView)
    host: tuple[str, ...] = ()  # host families (view.SnapshotView.host)
    after: tuple[str, ...] = ()  # earlier stages whose results compute reads
    numbers: Callable[[Any], Mapping[str, Any]] | None = None  # its part of the diagnosis' numbers
    notes: Callable[[Any], Iterable[str]] | None = None  # what the diagnosis lists as omitted
    state: Callable[[DeriveSettings], StageState] | None = None  # made once per Deriver


def rounded(value: float | None, digits: int = 4) -> float | None:
    """A number as the diagnosis shows it."""
    return None if value is None else round(value, digits)


def check_order(stages: Sequence[Stage]) -> None:
    """Each stage's `after` names only stages listed before it (so one pass computes them all)."""
    seen: set[str] = set()
    for stage in stages:
        if stage.name in seen:
            raise ValueError(f"stage {stage.name} listed twice")
        later = [name for name in stage.after if name not in seen]
        if later:
            raise ValueError(f"stage {stage.name} needs {', '.join(later)}, not listed before it")
        seen.add(stage.name)


def view_needs(stages: Sequence[Stage]) -> ViewNeeds:
    """What the view must keep: the union of the stages' needs."""
    return ViewNeeds.of({n for s in stages for n in s.engine}, {n for s in stages for n in s.histograms},
                        {n for s in stages for n in s.gpu}, {n for s in stages for n in s.host})
