"""The load test's conclusion: the knee and the max-concurrency recommendation.

Reads only the step records (the JSON of docs/loadtest.md: steps[]), so it judges a finished
sweep and a saved report alike: the knee is the first step where a latency tail crosses its SLO,
too many requests fail, or throughput stops rising while latency rises; the recommendation is
the last step before the knee or the largest step under the KV watermark, the smaller of the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporter.probe.loadtest_stats import rounded

KV_WATERMARK = 0.8  # size concurrency so the KV cache peaks below 80%: room for longer contexts
PLATEAU_GAIN = 0.10  # throughput that rises by less than this from one step to the next has stopped
LATENCY_RISE = 0.10  # ... while a latency median rose by more than this
FAILED_SHARE_KNEE = 0.10  # a step that fails this share of its requests is past the knee
NO_SUCCESS = "no successful request: no knee"


def dig(step: Mapping[str, Any], *path: str) -> Any:
    """step[path[0]][path[1]]..., None where a level is missing (a step's JSON may lack a part)."""
    value: Any = step
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def step_verdict(step: Mapping[str, Any]) -> str | None:
    return dig(step, "server", "verdict")


def level_words(step: Mapping[str, Any]) -> str:
    if step.get("mode") == "rate":
        return f"rate {step['level']:g}/s"
    return f"concurrency {step['level']:g}"


def tbt_p95(step: Mapping[str, Any]) -> tuple[float | None, str]:
    """The step's time-between-tokens tail: ITL p95 (token gaps), else TPOT p95 (per request)."""
    itl = dig(step, "latency_s", "itl", "p95")
    if itl is not None:
        return itl, "ITL"
    return dig(step, "latency_s", "tpot", "p95"), "TPOT"


def _rose(before: float | None, after: float | None, by: float) -> bool:
    return before is not None and after is not None and after > before * (1 + by)


def knee_reasons(prev: Mapping[str, Any] | None, step: Mapping[str, Any], ttft_slo_s: float,
                 tbt_slo_s: float) -> list[str]:
    """Why `step` is past the knee (empty: it is not)."""
    reasons = []
    tbt, what = tbt_p95(step)
    if tbt is not None and tbt > tbt_slo_s:
        reasons.append(f"TBT ({what}) p95 crossed {tbt_slo_s * 1000:g} ms ({tbt * 1000:.0f} ms)")
    ttft = dig(step, "latency_s", "ttft", "p95")
    if ttft is not None and ttft > ttft_slo_s:
        reasons.append(f"TTFT p95 crossed {ttft_slo_s * 1000:g} ms ({ttft * 1000:.0f} ms)")
    ok, failed = dig(step, "requests", "ok") or 0, dig(step, "requests", "failed") or 0
    if ok + failed and failed / (ok + failed) > FAILED_SHARE_KNEE:
        reasons.append(f"{failed} of {ok + failed} requests failed")
    if prev is not None:
        before = dig(prev, "throughput", "output_tokens_per_s")
        after = dig(step, "throughput", "output_tokens_per_s")
        slower = [name for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"))
                  if _rose(dig(prev, "latency_s", key, "p50"), dig(step, "latency_s", key, "p50"), LATENCY_RISE)]
        if before and after is not None and after < before * (1 + PLATEAU_GAIN) and slower:
            reasons.append(f"output throughput rose only {(after / before - 1) * 100:+.0f}% "
                           f"({before:.0f} -> {after:.0f} tok/s) while {' and '.join(slower)} p50 rose")
    return reasons


def find_knee(steps: Sequence[Mapping[str, Any]], ttft_slo_s: float, tbt_slo_s: float) -> dict[str, Any] | None:
    """The first step past the knee, with why, and how the verdict moved across it."""
    measured = [s for s in steps if _recorded(s)]
    for i, step in enumerate(measured):
        prev = measured[i - 1] if i else None
        reasons = knee_reasons(prev, step, ttft_slo_s, tbt_slo_s)
        if not reasons:
            continue
        before, at = (step_verdict(prev) if prev else None), step_verdict(step)
        if prev is None:
            moved = f"verdict {at}" if at else "no verdict from the exporter"
        elif before == at:
            moved = f"verdict stayed {at}" if at else "no verdict from the exporter"
        else:
            moved = f"verdict moved {before or 'unknown'} -> {at or 'unknown'}"
        text = f"at {level_words(step)} {'; '.join(reasons)}; {moved}"
        return {"index": steps.index(step), "level": step["level"], "reasons": reasons, "verdict_before": before,
                "verdict_at": at, "text": text}
    return None


def _recorded(step: Mapping[str, Any]) -> bool:
    """The step has requests to judge (ok or failed); one without says nothing about the knee."""
    return bool((dig(step, "requests", "ok") or 0) + (dig(step, "requests", "failed") or 0))


def _sequences(step: Mapping[str, Any]) -> float | None:
    """Concurrent sequences the engine held in a step: its running max from the exporter, else
    the client's in-flight max."""
    running = dig(step, "server", "running_max")
    if running:
        return float(running)
    flight = dig(step, "in_flight", "max")
    return float(flight) if flight else None


def _step_capacity(step: Mapping[str, Any]) -> int | None:
    """A step as a max-concurrency figure: its concurrency (closed loop), else its sequences."""
    if step.get("mode") == "concurrency":
        return int(step["level"])
    seqs = _sequences(step)
    return int(seqs) if seqs else None


def kv_recommendation(steps: Sequence[Mapping[str, Any]], watermark: float = KV_WATERMARK) -> dict[str, Any]:
    """Max concurrency that keeps the KV cache under `watermark`: measured (the largest step whose
    KV watermark stayed under it) when some step reached it, else extrapolated linearly from KV
    usage per running sequence (least squares through the origin over the steps)."""
    known = [s for s in steps if dig(s, "server", "kv_usage_max") is not None]
    if not known:
        return {"method": None, "max_concurrency": None, "kv_per_sequence": None,
                "text": "no KV usage from the exporter: no KV-based limit"}
    reached = [s for s in known if s["server"]["kv_usage_max"] >= watermark]
    under = [s for s in known if s["server"]["kv_usage_max"] < watermark]
    if reached:
        if not under:
            return {"method": "measured", "max_concurrency": None, "kv_per_sequence": None,
                    "text": f"every step reached {watermark:.0%} KV usage: below the first step tested"}
        best = max(under, key=lambda s: s["level"])
        limit = _step_capacity(best)
        return {"method": "measured", "max_concurrency": limit, "kv_per_sequence": None,
                "text": f"{level_words(best)} is the largest step whose KV usage watermark stayed under "
                        f"{watermark:.0%} ({best['server']['kv_usage_max']:.0%})"}
    points = [(seqs, s["server"]["kv_usage_max"]) for s in known if (seqs := _sequences(s))]
    sxx = sum(x * x for x, _ in points)
    slope = sum(x * y for x, y in points) / sxx if sxx else 0.0
    if slope <= 0:
        return {"method": "extrapolated", "max_concurrency": None, "kv_per_sequence": 0.0,
                "text": "KV usage did not grow with running sequences: no KV-based limit"}
    limit = int(watermark / slope)
    peak = max(known, key=lambda s: s["server"]["kv_usage_max"])
    return {"method": "extrapolated", "max_concurrency": limit, "kv_per_sequence": rounded(slope, 6),
            "text": f"no step reached {watermark:.0%} KV usage (peak {peak['server']['kv_usage_max']:.0%}); "
                    f"at {slope:.2%} of the cache per running sequence, {watermark:.0%} is about {limit} "
                    "sequences (linear extrapolation)"}


def slo_recommendation(steps: Sequence[Mapping[str, Any]], knee: Mapping[str, Any] | None) -> dict[str, Any]:
    """Max concurrency from the knee: the last step before it."""
    steps = [s for s in steps if _recorded(s)]
    if not steps:
        return {"max_concurrency": None, "bounded": False, "text": "no step recorded a request"}
    if knee is None:
        top = max(steps, key=lambda s: s["level"])
        return {"max_concurrency": _step_capacity(top), "bounded": False,
                "text": f"no knee up to {level_words(top)}: at least that much meets the SLOs"}
    at = next(i for i, s in enumerate(steps) if s["level"] == knee["level"])
    if at == 0:
        return {"max_concurrency": None, "bounded": True,
                "text": f"the first step ({level_words(steps[0])}) is already past the knee: test lower"}
    prev = steps[at - 1]
    return {"max_concurrency": _step_capacity(prev), "bounded": True,
            "text": f"{level_words(prev)}, the last step before the knee"}


def recommend(steps: Sequence[Mapping[str, Any]], knee: Mapping[str, Any] | None,
              watermark: float = KV_WATERMARK) -> dict[str, Any]:
    """The max concurrency that follows from what was measured: a knee (the last step before it), or
    a step whose KV usage reached the watermark (the largest one under it); the smaller when both.
    An extrapolated KV figure alone is no limit: no step ran there. Without a measured limit there is
    no number, only what the sweep showed and which levels to test next."""
    kv = kv_recommendation(steps, watermark)
    slo = slo_recommendation(steps, knee)
    measured = [(kv["max_concurrency"], "KV watermark")] if kv["method"] == "measured" and kv["max_concurrency"] \
        else []
    if slo["bounded"] and slo["max_concurrency"]:
        measured.append((slo["max_concurrency"], "SLO knee"))
    next_levels = _next_levels(steps, slo, kv)
    if measured:
        best = min(limit for limit, _ in measured)
        which = " and ".join(name for limit, name in measured if limit == best)
        text = (f"max concurrency {best} per replica (vLLM --max-num-seqs {best}, SGLang --max-running-requests "
                f"{best}), set by the {which}. KV: {kv['text']}. SLO: {slo['text']}.")
        return {"max_concurrency": best, "max_num_seqs": best, "kv": kv, "slo": slo, "next_levels": [],
                "text": text}
    if slo["max_concurrency"] and not slo["bounded"]:
        text = (f"none yet: every step up to {slo['max_concurrency']} met the SLOs and no step reached "
                f"{watermark:.0%} KV usage, so the limit is above what was tested. KV: {kv['text']}. "
                + (f"Test higher: --concurrency {','.join(str(level) for level in next_levels)}." if next_levels
                   else "Test higher levels."))
    else:
        text = "no recommendation: " + "; ".join((kv["text"], slo["text"]))
    return {"max_concurrency": None, "max_num_seqs": None, "kv": kv, "slo": slo, "next_levels": next_levels,
            "text": text}


def _next_levels(steps: Sequence[Mapping[str, Any]], slo: Mapping[str, Any], kv: Mapping[str, Any]) -> list[int]:
    """Levels to test after a sweep that found no limit: doubling from the highest step tested, up to
    the KV estimate (at most four; a first step past the knee asks for lower ones instead)."""
    tested = slo.get("max_concurrency")
    if not tested or slo.get("bounded"):
        return []
    ceiling = kv["max_concurrency"] if kv["method"] == "extrapolated" and kv["max_concurrency"] else tested * 16
    levels: list[int] = []
    level = tested
    while len(levels) < 4 and level < ceiling:
        level = min(level * 2, ceiling)
        levels.append(int(level))
    return levels


def no_recommendation(why: str) -> dict[str, Any]:
    """The recommendation block of a sweep that measured nothing to recommend from."""
    return {"max_concurrency": None, "max_num_seqs": None, "next_levels": [], "text": why,
            "kv": {"method": None, "max_concurrency": None, "kv_per_sequence": None, "text": why},
            "slo": {"max_concurrency": None, "bounded": False, "text": why}}


def succeeded(report: Mapping[str, Any]) -> bool:
    """Whether any request of the sweep succeeded."""
    return any(dig(s, "requests", "ok") for s in report.get("steps") or ())
