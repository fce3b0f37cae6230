"""GPU health: the faults that take a GPU out of service, before any bottleneck.

A GPU that needs a reset is the worst bottleneck there is, and no resource score says so: the
engine may still run (and compute wrong results) on a GPU with an uncorrected ECC error. So the
diagnosis reads the GPU's fault families on their own and marks a target UNHEALTHY while one of
its GPUs has a fault; the verdict still shows below it.

Two kinds of fault (the table of XIDs and actions: exporter/specs/gpu_faults.py):
- events, from counters (uncorrected ECC errors, XIDs whose action is not none, rows remapped
  after an uncorrectable error): a fault from the cycle the count grows, and from the first sight
  of a count already above 0 (errors from before the exporter watched, as LLMGPUUncorrectableECCErrors
  pages for them), until FAULT_WINDOW_S after the last growth. The counts are volatile (a GPU reset
  or driver reload clears them): a drop is a reset, not a fault.
- states, from gauges: a pending or failed row remap, a recovery action other than none, a GPU the
  source reports lost (llm_gpu_up 0): a fault while they last, dated from the cycle they started.

The state keeps per GPU its last counts and the events' times: a few numbers per GPU, forgotten
a while after the GPU leaves the snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, Stage, StageState, TargetKey
from exporter.derive.view import GpuView, SnapshotView
from exporter.snapshot import Sample, labels_of
from exporter.specs.gpu_faults import (
    BY_CODE,
    FAULT_WINDOW_S,
    RECOVERY_NAMES,
    RECOVERY_WORDS,
    RESET_GPU,
    RMA,
    Action,
    window_text,
)

ECC = "llm_gpu_ecc_errors_total"
REMAP = "llm_gpu_remapped_rows"
RECOVERY = "llm_gpu_recovery_action"
XID = "llm_gpu_xid_errors_total"
GPU_FAMILIES = (ECC, REMAP, RECOVERY, XID)
LOST_ACTION = Action("check", "drain the engine, check the GPU with nvidia-smi and dmesg (XID 79: fallen off the "
                              "bus), then reboot the node")
MAX_COUNTERS_PER_GPU = 64  # XID codes beyond 32 are folded into "other" by the source; bound it here too


class Fault(NamedTuple):
    """One fault on one GPU, with what to do about it."""

    gpu: str
    uuid: str
    name: str
    fault: str  # ecc_uncorrected, xid_48, remap_uncorrectable, remap_pending, remap_failed, recovery_action, lost
    what: str
    action: Action
    since: float  # events: when the count last grew; states: when the state began (wall clock, Unix seconds)
    count: float  # type: ignore[assignment]  # events in the window (0 for states); hides tuple.count, never called
    runbook: str  # the alert whose docs/runbooks.md section says more

    def words(self, now: float) -> str:
        who = f"GPU {self.gpu}" + (f" ({self.uuid})" if self.uuid else "")
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        ago = max(0.0, now - self.since)
        ago_words = f"{ago:.0f} s ago" if ago < 120 else f"{ago / 60:.0f} min ago"
        since = "last" if self.count else "since"  # an event's last growth; a state's start
        return (f"{who}: {self.what}, {since} {when} ({ago_words}): {self.action.words} "
                f"(docs/runbooks.md#{self.runbook.lower()})")

    def json(self, now: float) -> dict[str, Any]:
        return {"gpu": self.gpu, "uuid": self.uuid, "name": self.name, "fault": self.fault, "what": self.what,
                "action": self.action.name, "since": self.since, "count": self.count,
                "runbook": f"docs/runbooks.md#{self.runbook.lower()}", "words": self.words(now)}


class _Counter(NamedTuple):
    value: float
    last_growth: float | None  # when the count last grew (or was first seen above 0)
    grown: float  # how much it grew while the fault holds


class _Gpu:
    __slots__ = ("counters", "states", "seen")

    def __init__(self) -> None:
        self.counters: dict[tuple[str, str], _Counter] = {}
        self.states: dict[str, float] = {}  # state fault -> since
        self.seen = 0.0


def _events(gpu: GpuView) -> Iterable[tuple[tuple[str, str], str, str, Action, str]]:
    """(counter key, fault name, words, action, runbook) for each fault counter the GPU has."""
    for family, label in gpu.link:
        if family == ECC and label == "uncorrected":
            yield (family, label), "ecc_uncorrected", "uncorrected (double-bit) ECC errors", RESET_GPU, \
                "LLMGPUUncorrectableECCErrors"
        elif family == REMAP and label == "uncorrectable":
            yield (family, label), "remap_uncorrectable", "a memory row remapped after an uncorrectable error", \
                RESET_GPU, "LLMGPURowRemapPending"
        elif family == XID:
            xid = BY_CODE.get(int(label)) if label.isdigit() else None
            if xid is not None and xid.action.name != "none":
                yield (family, label), f"xid_{xid.code}", f"XID {xid.code} ({xid.what})", xid.action, \
                    "LLMGPUXidCritical" if xid.severity == "critical" else "LLMGPUXidWarning"


def _states(gpu: GpuView, lost: bool) -> Iterable[tuple[str, str, Action, str]]:
    """(fault name, words, action, runbook) for each state fault the GPU is in."""
    if lost:
        yield "lost", "lost: the GPU source cannot read it (llm_gpu_up 0)", LOST_ACTION, "LLMGPULost"
    if (gpu.link.get((REMAP, "pending")) or 0.0) > 0:
        yield "remap_pending", "a memory row remap waits for a GPU reset", RESET_GPU, "LLMGPURowRemapPending"
    if (gpu.link.get((REMAP, "failed")) or 0.0) > 0:
        yield "remap_failed", "a memory row remap failed: no spare rows left", RMA, "LLMGPURowRemapFailure"
    code = gpu.get(RECOVERY)
    if code is not None and code != 0:
        action = RECOVERY_WORDS.get(int(code), Action(RECOVERY_NAMES.get(int(code), f"code_{code:g}"),
                                                      "drain the engine and do what the driver asks"))
        yield "recovery_action", f"the driver asks for recovery action {action.name} ({code:g})", action, \
            "LLMGPURecoveryActionRequired"


class HealthState(StageState):
    """The faults of every GPU in the snapshot, updated once per cycle (begin)."""

    def __init__(self, settings: DeriveSettings) -> None:
        self.window_s = FAULT_WINDOW_S
        self.forget_after_s = max(settings.forget_after_s, FAULT_WINDOW_S)
        self._gpus: dict[str, _Gpu] = {}
        self.faults: dict[str, tuple[Fault, ...]] = {}  # by GpuView.key, this cycle

    def begin(self, view: SnapshotView) -> None:
        self.faults = {}
        for gpu, lost in [*((g, False) for g in view.gpus), *((g, True) for g in view.lost_gpus)]:
            found = self._update(gpu, lost, view)
            if found:
                self.faults[gpu.key] = found

    def _update(self, gpu: GpuView, lost: bool, view: SnapshotView) -> tuple[Fault, ...]:
        # The window runs on the steady clock; a fault shows its wall-clock time as of this cycle.
        now, wall = view.now, view.wall
        state = self._gpus.get(gpu.key)
        if state is None:
            state = self._gpus[gpu.key] = _Gpu()
        state.seen = now
        out: list[Fault] = []
        for key, fault, what, action, runbook in _events(gpu):
            value = gpu.link[key]
            before = state.counters.get(key)
            if before is None:
                if len(state.counters) >= MAX_COUNTERS_PER_GPU:
                    continue
                # First sight: a count already above 0 is a fault now (errors from before we watched).
                counter = _Counter(value, now if value > 0 else None, value)
            elif value > before.value:
                held = before.last_growth is not None and now - before.last_growth <= self.window_s
                counter = _Counter(value, now, (before.grown if held else 0.0) + value - before.value)
            elif value < before.value:
                counter = _Counter(value, None, 0.0)  # volatile count cleared: the GPU was reset
            else:
                counter = before
            state.counters[key] = counter
            if counter.last_growth is not None and now - counter.last_growth <= self.window_s:
                out.append(Fault(gpu.gpu, gpu.uuid, gpu.name, fault, f"{what}: {counter.grown:g} in the last "
                                 f"{window_text(self.window_s)}", action, wall(counter.last_growth), counter.grown,
                                 runbook))
        current = {}
        for fault, what, action, runbook in _states(gpu, lost):
            since = current[fault] = state.states.get(fault, now)
            out.append(Fault(gpu.gpu, gpu.uuid, gpu.name, fault, what, action, wall(since), 0.0, runbook))
        state.states = current
        # Lost: the source's other series are gone with the GPU; its counts wait for it to come back.
        return tuple(out)

    def end(self, view: SnapshotView) -> None:
        for key in [k for k, g in self._gpus.items() if view.now - g.seen > self.forget_after_s]:
            del self._gpus[key]

    def all_faults(self) -> tuple[Fault, ...]:
        return tuple(f for faults in self.faults.values() for f in faults)


class Health(NamedTuple):
    """One target's GPU health this cycle."""

    faults: tuple[Fault, ...]
    gpus: int  # GPUs the target is shown against, lost ones included
    now: float  # the wall clock, which the faults' times are on

    @property
    def unhealthy_gpus(self) -> int:
        return len({f.gpu for f in self.faults})


def serves_lost(ctx: Ctx, gpu: GpuView) -> bool:
    """Whether a lost GPU (not in the assignment, which only sees GPUs up) is one of the target's:
    named for it in target_gpus, or the target is the only one, or it is shown against all GPUs."""
    explicit = ctx.settings.target_gpus
    if explicit and ctx.engine.target in explicit:
        return gpu.gpu in {str(i) for i in explicit[ctx.engine.target]}
    return len(ctx.view.engines) == 1 or len(ctx.gpus) == len(ctx.view.gpus)


def targets_faults(ctx: Ctx, state: HealthState) -> tuple[Fault, ...]:
    lost = tuple(g for g in ctx.view.lost_gpus if serves_lost(ctx, g))
    return tuple(f for g in (*ctx.gpus, *lost) for f in state.faults.get(g.key, ()))


def _compute(ctx: Ctx, state: HealthState) -> Health | None:
    lost = sum(1 for g in ctx.view.lost_gpus if serves_lost(ctx, g))
    if not ctx.gpus and not lost:
        return None
    return Health(targets_faults(ctx, state), len(ctx.gpus) + lost, ctx.view.taken_at)


def _samples(health: Health, key: TargetKey) -> list[Sample]:
    target = (("engine", key.engine), ("target", key.target))
    return [Sample("llm_unhealthy_gpus", target, float(health.unhealthy_gpus)),
            *(Sample("llm_gpu_fault", labels_of(**dict(target), gpu=f.gpu, uuid=f.uuid, fault=f.fault,
                                                action=f.action.name), 1.0) for f in health.faults)]


def numbers(health: Health) -> Mapping[str, Any]:
    return {"unhealthy_gpus": health.unhealthy_gpus}


STAGE = Stage(name="health", compute=_compute, samples=_samples, emits=("llm_unhealthy_gpus", "llm_gpu_fault"),
              gpu=GPU_FAMILIES, numbers=numbers, state=HealthState)
