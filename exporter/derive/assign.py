"""Which GPUs serve which target (the GPU source sees GPUs, not which engine runs on them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from exporter.derive.view import GpuView


def assign_gpus(targets: Sequence[str], gpus: Sequence[GpuView], tp: int | None,
                explicit: Mapping[str, Sequence[int | str]] | None = None,
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
