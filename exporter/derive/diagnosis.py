"""The diagnosis JSON (/api/v1/diagnosis, `llm-exporter doctor`, the status page): per target the
verdict with its evidence and remedies, the stages' numbers, and what was omitted and why.

Built when asked for, not every cycle, from the last cycle's immutable results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import exporter.derive.bottleneck as bottleneck
from exporter.catalog.derived import RESOURCES
from exporter.derive.stage import Stage, rounded
from exporter.derive.view import EngineView, GpuView, SnapshotView
from exporter.slo import human_duration, latency_text

# Per SLO kind: its name, what its histogram counts, and what "no recent traffic" means for it.
SLO_WORDS = {"ttft": ("TTFT", "requests", "no requests finished"),
             "tbt": ("TBT", "token gaps", "no tokens streamed")}


class TargetResult(NamedTuple):
    """Everything derived for one target in one cycle."""

    engine: EngineView
    gpus: tuple[GpuView, ...]
    results: Mapping[str, Any]  # stage name -> result (absent: none, failed or not yet)
    omitted: tuple[str, ...]


class Cycle(NamedTuple):
    """What the last cycle leaves for the diagnosis."""

    view: SnapshotView
    targets: tuple[TargetResult, ...]
    note: str  # how the GPUs were assigned, when that is a guess
    cost_s: float
    gpu_faults: tuple[Any, ...] = ()  # every GPU's faults this cycle (health.Fault), assigned or not
    never_answered: tuple[str, ...] = ()  # unreachable targets that have not given one scrape yet


def _numbers(r: TargetResult, stages: Sequence[Stage]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in stages:
        result = r.results.get(stage.name)
        if stage.numbers is not None and result is not None:
            out.update(stage.numbers(result))
    return out


def _gpu_rows(r: TargetResult) -> list[dict[str, Any]]:
    roof = r.results.get("roofline")
    if roof is None:
        return [{"gpu": g.gpu, "name": g.name} for g in r.gpus]
    return [{
        "gpu": g.gpu, "name": g.name, "peak_bandwidth_bytes_per_second": g.peak_bandwidth,
        "peak_flops": g.peak_flops, "model_bandwidth_bytes_per_second": rounded(g.model_bandwidth, 0),
        "model_ratio": rounded(g.model_ratio), "gpm_bandwidth_bytes_per_second": rounded(g.gpm_bandwidth, 0),
        "gpm_ratio": rounded(g.gpm_ratio), "intensity_flops_per_byte": rounded(g.intensity, 3),
        "achieved_flops": rounded(g.achieved_flops, 0),
    } for g in roof.gpus]


def slo_states(tails: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per SLO with a bucket bound: met, missed, or no recent traffic (nothing measured in the
    window: the attainment is absent and degrades nothing). The window is the one the quantiles,
    the boards and the burn-rate rules read (quantiles.py): across a restart, the requests before it
    count until they leave it, and the words say how many came after it."""
    out: dict[str, dict[str, Any]] = {}
    for kind, (title, what, none) in SLO_WORDS.items():
        tail = tails.get(kind)
        if tail is not None and tail.not_applicable:
            out[kind] = {"state": "not_applicable", "attainment": None, "bound_seconds": None,
                         "threshold_seconds": tail.slo_threshold, "count": 0,
                         "words": f"{title} SLO: not applicable: {tail.not_applicable}"}
            continue
        if tail is None or tail.slo_bound is None:
            continue
        attained = tail.slo_attainment
        window = f"the last {human_duration(tail.window_s)}" if tail.window_s else "the window"
        if tail.no_recent_traffic or attained is None:
            state, words = "no_recent_traffic", f"{title} SLO: no recent traffic ({none} in {window})"
        else:
            state = "met" if attained >= bottleneck.SLO_TARGET else "missed"
            words = (f"{title} SLO: {bottleneck.pct(attained)} of {tail.slo_count:.0f} {what} in {window} within "
                     f"{latency_text(tail.slo_bound, kind)}" + ("" if state == "met" else
                                               f" (under {bottleneck.pct(bottleneck.SLO_TARGET)}: missed)"))
            if tail.restarted_s_ago is not None and tail.since_restart is not None:
                words += (f"; the engine restarted {human_duration(round(tail.restarted_s_ago))} ago and "
                          f"{tail.since_restart:.0f} of them came after it (the others leave the window, as in "
                          "Prometheus' rate())")
        out[kind] = {"state": state, "attainment": rounded(attained), "bound_seconds": tail.slo_bound,
                     "threshold_seconds": tail.slo_threshold, "count": tail.slo_count, "words": words}
    return out


def _faults(r: TargetResult) -> tuple[list[dict[str, Any]], list[str]]:
    """The target's GPU faults (health stage) as JSON and as words."""
    found = r.results.get("health")
    if found is None:
        return [], []
    return [f.json(found.now) for f in found.faults], [f.words(found.now) for f in found.faults]


def target_diagnosis(r: TargetResult, stages: Sequence[Stage]) -> dict[str, Any]:
    decision = r.results.get("bottleneck")
    slo = slo_states(r.results.get("quantiles") or {})
    faults, fault_words = _faults(r)
    out: dict[str, Any] = {"target": r.engine.target, "engine": r.engine.engine, "model": r.engine.model,
                           "verdict": decision.verdict if decision else None,
                           "rule": decision.rule if decision else "", "omitted": list(r.omitted),
                           "numbers": _numbers(r, stages), "gpus": _gpu_rows(r), "slo": slo,
                           "notes": [s["words"] for s in slo.values() if s["state"] == "no_recent_traffic"],
                           "unaccounted_families": list(r.engine.unaccounted),
                           "gpu_faults": faults, "unhealthy_because": fault_words}
    check = r.results.get("probe")
    if check is not None:
        out["probe"] = {"words": check.words(), "failing": check.failing, "gap_too_large": check.gap_too_large}
    if decision is None:
        out.update(status="unhealthy" if faults else "unknown", scores={}, evidence=fault_words, remedies=[],
                   degraded_because=[])
        return out
    # The verdict's own evidence first, then the context, then what the other resources show.
    verdict, signals = decision.verdict, decision.signals
    also = bottleneck.co_equal(verdict, decision.scores)  # as limiting: named beside it, with their fixes
    evidence: list[str] = list(fault_words)  # a GPU that needs service comes before any resource
    assessment = bottleneck.assess(signals)  # the same scores, now with their words
    rest = [assessment.evidence.get(res, ()) for res in RESOURCES if res != verdict and res not in also]
    for group in (assessment.evidence.get(verdict, ()), *(assessment.evidence.get(r, ()) for r in also),
                  assessment.context, *rest):
        evidence.extend(e for e in group if e not in evidence)
    degraded = bottleneck.is_degraded(verdict, signals)
    degraded += [f"limited by {r} as much, not by the GPU's own roof" for r in also]
    if check is not None:
        degraded = [*degraded, *check.degraded()]
    remedies = list(bottleneck.remedies(verdict, signals))
    for other in also:
        remedies += [line for line in bottleneck.remedies(other, signals) if line not in remedies]
    out.update(status="unhealthy" if faults else "degraded" if degraded else "healthy", degraded_because=degraded,
               scores=dict(decision.scores), evidence=evidence, also_limiting=also,
               remedies=remedies, since=decision.state.since)
    return out


MAX_BAD_PATHS = 8


def finite(value: Any, path: str, bad: list[str]) -> Any:
    """`value` (a JSON-ready tree) with every non-finite float replaced by None, and the paths of
    those appended to `bad`: JSON has no NaN or Infinity, and one target's must not refuse the page."""
    if isinstance(value, float):
        if value - value == 0.0:
            return value
        if len(bad) < MAX_BAD_PATHS:
            bad.append(path)
        return None
    if isinstance(value, dict):
        return {k: finite(v, f"{path}.{k}" if path else str(k), bad) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v, f"{path}[{i}]", bad) for i, v in enumerate(value)]
    return value


def _safe_target(r: TargetResult, stages: Sequence[Stage]) -> dict[str, Any]:
    """One target's diagnosis, finite by construction; a target whose diagnosis cannot be built says
    why and leaves the others be."""
    try:
        out = target_diagnosis(r, stages)
    except Exception as error:  # noqa: BLE001 - one target's data must not blind the others
        return {"target": r.engine.target, "engine": r.engine.engine, "model": r.engine.model, "verdict": None,
                "rule": "", "status": "unknown", "scores": {}, "evidence": [], "remedies": [],
                "degraded_because": [], "numbers": {}, "gpus": [], "slo": {}, "notes": [],
                "unaccounted_families": [], "gpu_faults": [], "unhealthy_because": [],
                "omitted": [f"diagnosis failed: {type(error).__name__}: {str(error)[:200]}"]}
    bad: list[str] = []
    out = finite(out, "", bad)
    if bad:
        out["omitted"].append("not a finite number, shown as null: " + ", ".join(bad))
    return out


def build_diagnosis(cycle: Cycle, stages: Sequence[Stage]) -> dict[str, Any]:
    view = cycle.view
    targets = {r.engine.target: _safe_target(r, stages) for r in cycle.targets}
    unreachable = [{"target": d.target, "reason": d.reason, "message": d.message} for d in view.engines_down]
    statuses = [t["status"] for t in targets.values()]
    # A fault on a GPU no target is shown against still needs someone (the exporter's GPUs are the
    # node's it was given): listed apart, and the exporter is unhealthy.
    shown = {(f["uuid"], f["gpu"], f["fault"]) for t in targets.values() for f in t.get("gpu_faults", ())}
    now = view.taken_at
    other = [f.json(now) for f in cycle.gpu_faults if (f.uuid, f.gpu, f.fault) not in shown]
    # An unreachable target is a finding (degraded, doctor's exit 1), also when it is the only one.
    # Every target unreachable and none ever answered: nothing is known about any engine (a wrong
    # URL, an engine not started yet), the same "cannot tell" as doctor --engine on that URL.
    dead = bool(unreachable) and not targets and set(cycle.never_answered) >= {d["target"] for d in unreachable}
    if "unhealthy" in statuses or other:
        status = "unhealthy"
    elif dead:
        status = "unknown"
    elif "degraded" in statuses or unreachable:
        status = "degraded"
    elif not targets or "unknown" in statuses:
        status = "unknown"
    else:
        status = "healthy"
    notes = [cycle.note] if cycle.note else []
    if dead:
        notes.append("no engine target has answered a scrape yet: cannot tell (check each target's URL and "
                      "that its engine runs)")
    if not targets and not unreachable:
        notes.append("no engine target configured or seen")
    return {"ready": True, "taken_at": view.taken_at, "status": status, "targets": targets,
            "unreachable": unreachable, "gpu_faults_unassigned": other, "notes": notes,
            "derive_seconds": round(cycle.cost_s, 6)}



def not_ready() -> dict[str, Any]:
    return {"ready": False, "status": "unknown", "targets": {}, "unreachable": [],
            "notes": ["no collection cycle finished yet"]}
