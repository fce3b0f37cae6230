"""The planner's cost model against the running engine, live: its predicted decode TPOT and decode
tokens/s for the window's own batch and context, next to what the engine did.

Predicted: one step of the window's mean batch at its mean context, with the prompt tokens the window
computed per step riding along (chunked prefill), on the target's GPUs,
costed by the twin's roofline (exporter/physics/costs.py) at the planner's prior fractions of peak
(exporter/planner/model.py PRIOR_EFFICIENCY, PRIOR_OVERHEAD_S): TPOT = that step; tokens/s = batch /
step. Observed: TPOT = mean batch / decode tokens/s (every running sequence gains one token a step).
The error ratio predicted / observed - 1 is what `llm-exporter plan` would have to calibrate away: a
steady value is this deployment's efficiency (the planner fits it), a drifting one is the model or the
deployment changing. Prefill sharing steps with decodes makes observed TPOT longer than a pure
decode step: a negative error under prompt-heavy load is that, not the roofline. Needs the model's
shape and a GPU the spec table knows; omitted otherwise (a CPU engine).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from exporter.derive.stage import Ctx, Stage, TargetKey, rounded
from exporter.snapshot import Sample


class ModelCheck(NamedTuple):
    predicted_tpot_s: float
    observed_tpot_s: float
    predicted_tps: float
    observed_tps: float
    bound: str  # what the roofline says sets the step: memory, compute, interconnect

    @property
    def tpot_error(self) -> float:
        return self.predicted_tpot_s / self.observed_tpot_s - 1.0

    @property
    def tps_error(self) -> float:
        return self.predicted_tps / self.observed_tps - 1.0


def compute(ctx: Ctx) -> ModelCheck | None:
    from exporter.physics.costs import PRIOR_EFFICIENCY, PRIOR_OVERHEAD_S, Hardware, decode_batch, step_cost

    thr, kv = ctx.get("throughput"), ctx.get("kv")
    if ctx.shape is None or not ctx.gpus or thr is None or not thr.decode_tps or not thr.mean_batch:
        return None
    specs = [ctx.spec_for(g.name) for g in ctx.gpus]
    gpu = specs[0]
    if gpu is None or any(s is None for s in specs) or thr.mean_batch < 0.5:
        return None
    ranks = max(1, ctx.dp)
    batch = max(1, round(thr.mean_batch / ranks))
    context = int((kv.mean_context if kv is not None else None) or 0)
    hw = Hardware(gpu=gpu, tp=max(1, ctx.tp), bw_efficiency=PRIOR_EFFICIENCY["bw"],
                  compute_efficiency=PRIOR_EFFICIENCY["compute"], step_overhead_s=PRIOR_OVERHEAD_S["gpu"])
    step = decode_batch(batch, context)
    # The prompt tokens computed per step ride along with the decodes (chunked prefill): the observed
    # TPOT includes them, so the predicted step does too.
    prefill_tps = thr.prefill_computed_tps if thr.prefill_computed_tps is not None else thr.prefill_tps
    if prefill_tps and thr.steps_per_s:
        chunk = int(prefill_tps / thr.steps_per_s / ranks)
        if chunk > 0:
            step = dataclasses.replace(step, prefill_tokens=chunk, prefill_context=chunk * (context + chunk / 2.0))
    cost = step_cost(hw, ctx.shape, step)
    if cost.time_s <= 0:
        return None
    observed_tpot = thr.mean_batch / thr.decode_tps
    return ModelCheck(cost.time_s, observed_tpot, thr.mean_batch / cost.time_s, thr.decode_tps, cost.bound)


def samples(check: ModelCheck, key: TargetKey) -> list[Sample]:
    labels = key.labels
    return [Sample("llm_model_predicted_tpot_seconds", labels, check.predicted_tpot_s),
            Sample("llm_model_tpot_error_ratio", labels, check.tpot_error),
            Sample("llm_model_predicted_decode_tokens_per_second", labels, check.predicted_tps),
            Sample("llm_model_decode_throughput_error_ratio", labels, check.tps_error)]


def numbers(check: ModelCheck) -> dict[str, Any]:
    return {"model_tpot_predicted_s": rounded(check.predicted_tpot_s, 6),
            "model_tpot_observed_s": rounded(check.observed_tpot_s, 6),
            "model_tpot_error": rounded(check.tpot_error), "model_tps_error": rounded(check.tps_error),
            "model_bound": check.bound}


STAGE = Stage(
    name="modelcheck", compute=lambda ctx, state: compute(ctx), samples=samples, numbers=numbers,
    after=("throughput", "kv"),
    emits=("llm_model_predicted_tpot_seconds", "llm_model_tpot_error_ratio",
           "llm_model_predicted_decode_tokens_per_second", "llm_model_decode_throughput_error_ratio"),
)
