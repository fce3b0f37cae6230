"""The SLO-aware scaling signal: per replica, the request rate at which it would break its SLOs, and
the observed rate as a share of it (docs/scaling.md).

The same cost model as the live check (modelcheck.py): the twin's roofline step cost
(exporter/physics/costs.py) at the planner's prior fractions of peak, on the target's GPUs, for the
window's own mean prompt and output lengths and prefix-cache share. No fixed point is needed: a steady
decode batch of B sequences, each producing one token a step for `output` steps, finishes
B / (output x step) requests a second, and those requests bring B x prompt / output prompt tokens per
step that ride along with the decodes (chunked prefill). So for each batch B the step time t(B) and
the rate it serves, rate(B) = B / (output x t(B)), both follow, and both grow with B. The largest B
that holds every limit gives the highest rate:

- TPOT: at most 1% of requests over the TBT SLO (tpot_violations): each running sequence gains a
  token a step, and a step that carries a prompt is many decode steps long, so the tail is the short
  answers that catch such steps, more of them when prompts queue behind each other (busy periods);
- the running-sequence limit (the engine's llm_requests_running_max, vLLM's default 256 without one)
  and the KV cache (capacity / tokens each running request holds on average: its prompt and half its
  output, long answers weighing more since they stay longer);
- TTFT: the request's wait for a free slot among those c slots, each held output x t(B) seconds (an
  M/M/c queue: its 99th percentile wait from Erlang C), plus the step that computes its prompt and the
  half step it waits for that step to start, at most the TTFT SLO at its p99.

Per data-parallel rank, times the ranks. Omitted without the model's shape, a GPU the spec table
knows, or requests finished in the window: never a made-up number. Where it misleads (the prior
efficiencies, a workload mix that changes) is docs/scaling.md's last section.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist
from typing import Any, NamedTuple

from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, Stage, StageState, TargetKey, rounded
from exporter.derive.view import SnapshotView
from exporter.derive.window import Scopes
from exporter.snapshot import Sample
from exporter.specs.gpus import GpuSpec
from exporter.specs.models import ModelShape

# vLLM's default --max-num-seqs: the cap where the engine reports none (llm_requests_running_max).
DEFAULT_MAX_SEQS = 256
# The API server's time per request before it reaches the scheduler (the planner's PRIOR_HOST_S).
HOST_S = 0.5e-3
TTFT_QUANTILE = 0.99
TPOT_QUANTILE = 0.99
# Output lengths spread around their mean (the planner reads the spread from the length histograms;
# the chat, RAG and long-context scenarios of the twin have 0.4-0.6).
OUTPUT_SIGMA = 0.5
OUTPUT_POINTS = 8
MAX_TAIL_TERMS = 40  # past this many prompts in one request's steps, busy_tail's normal approximation
SEARCH_STEPS = 24  # bisection on the batch: 2^-24 of the cap, far below one sequence
MIN_BATCH = 0.01  # running sequences on average at the lowest rate searched
LIMITS = ("tpot", "ttft", "max_seqs", "kv_cache")
QUANTUM = math.log(1.01)  # the inputs' grid: 1% steps (quantized)
RESEARCH_S = 10.0  # a target's search is redone at most this often (Memo)


class Scaling(NamedTuple):
    max_rate: float  # requests/s the replica serves within its SLOs
    observed_rate: float  # requests/s finished in the window
    batch: float  # running sequences per rank at that rate
    step_s: float  # step time at that batch (the TPOT it predicts)
    slots: float  # running sequences a rank holds at most (max_seqs or KV, the smaller)
    limit: str  # what stops the rate growing: one of LIMITS

    @property
    def load_ratio(self) -> float:
        return self.observed_rate / self.max_rate


def erlang_c(servers: float, load: float) -> float:
    """Probability that an arrival waits in an M/M/c queue of `servers` slots at offered `load`
    (Erlangs, < servers). The Erlang B recursion over whole servers, stable for thousands of them."""
    c = max(1, int(servers))
    if load <= 0:
        return 0.0
    if load >= c:
        return 1.0
    b = 1.0
    for k in range(1, c + 1):
        b = load * b / (k + load * b)
    return c * b / (c - load * (1.0 - b))


def wait_quantile(servers: float, load: float, service_s: float, q: float = TTFT_QUANTILE) -> float:
    """The q-quantile of the wait for a slot: P(W > x) = C exp(-(c - a) x / S)."""
    c = max(1, int(servers))
    if load >= c:
        return math.inf
    p_wait = erlang_c(c, load)
    if p_wait <= 1.0 - q:
        return 0.0
    return math.log(p_wait / (1.0 - q)) * service_s / (c - load)


def _lognormal_points(mean: float, sigma: float, n: int) -> list[float]:
    """`n` equally likely values of a lognormal of this mean (the midpoints of n equal-probability bins)."""
    mu = math.log(mean) - sigma * sigma / 2.0
    return [math.exp(mu + sigma * NormalDist().inv_cdf((i + 0.5) / n)) for i in range(n)]


def poisson_tail(mean: float, k: int) -> float:
    """P(K > k) for K ~ Poisson(mean)."""
    if k < 0:
        return 1.0
    term = cdf = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        cdf += term
    return max(0.0, 1.0 - cdf)


def busy_tail(mean: float, busy: float, k: int) -> float:
    """P(K > k) where K counts the prompts a request's steps carry: Poisson(`mean`) of them arrive on
    their own, and each one's step is long enough for Poisson(`busy`) more to arrive and ride on the
    next steps, and so on (a busy period: the prefill work's utilization `busy` < 1). K is then a
    Poisson number of Borel(busy) clusters, whose distribution the Panjer recursion gives:
    P(0) = exp(-mean), P(k) = mean / k x sum_n n b(n) P(k - n), b(n) = exp(-busy n) (busy n)^(n-1) / n!.
    Far past its mean (12 standard deviations) the tail is 0 to double precision; past MAX_TAIL_TERMS,
    a normal tail of the same mean and variance (K is then a sum of many clusters), so the cost is
    bounded whatever lengths an engine reports."""
    if k < 0:
        return 1.0
    if busy <= 0:
        return poisson_tail(mean, k)
    centre = mean / (1.0 - busy)
    spread = math.sqrt(mean / (1.0 - busy) ** 3)
    if k > centre + 12.0 * spread:
        return 0.0
    if k > MAX_TAIL_TERMS:
        return 1.0 - NormalDist(centre, spread).cdf(k + 0.5)
    log_busy = math.log(busy)
    # n x b(n), the cluster sizes weighted as the recursion reads them.
    weight = [0.0] + [math.exp(-busy * n + (n - 1) * (log_busy + math.log(n)) - math.lgamma(n))
                      for n in range(1, k + 1)]
    pmf = [math.exp(-mean)]
    for total in range(1, k + 1):
        pmf.append(mean / total * sum(weight[n] * pmf[total - n] for n in range(1, total + 1)))
    return min(1.0, max(0.0, 1.0 - sum(pmf)))


def tpot_violations(t_dec: float, t_prompt: float, arrivals_per_decode_step: float, output: float, slo: float,
                    busy: float = 0.0) -> float:
    """The share of requests whose TPOT is over `slo`. A request decoding n steps carries the prompts
    that arrive meanwhile, each adding `t_prompt` to one of its steps: its TPOT is
    t_dec + K x t_prompt / n, over the SLO when K > (slo - t_dec) x n / t_prompt. Prompts arriving
    over its n pure decode steps (Poisson, `arrivals_per_decode_step` each) each start a busy period:
    the prompt's step is long enough for more to arrive, `busy` on average (busy_tail). Prefill comes
    in lumps (a long prompt's step is many decode steps long), so short answers see the tail; outputs
    are taken lognormal around the mean (OUTPUT_SIGMA)."""
    if t_dec > slo:
        return 1.0
    if t_prompt <= 0:
        return 0.0
    over = 0.0
    points = _lognormal_points(output, OUTPUT_SIGMA, OUTPUT_POINTS)
    for length in points:
        n = max(1, round(length) - 1)  # the first token's step is TTFT's
        allowed = math.floor((slo - t_dec) * n / t_prompt)
        over += busy_tail(n * arrivals_per_decode_step, busy, allowed)
    return over / len(points)


def quantized(value: float) -> float:
    """`value` on a grid of 1% steps: the search runs on these, so a window whose lengths moved by
    less than 1% gives the same inputs, and the last cycle's answer (Memo) serves again."""
    return math.exp(round(math.log(value) / QUANTUM) * QUANTUM) if value > 0 else 0.0


class Found(NamedTuple):
    max_rate: float
    batch: float
    step_s: float
    slots: float
    limit: str


class Memo:
    """A target's last inputs and answer. A search costs 1-5 ms (tpot_violations' tails), and its
    inputs are means over the rate window, which move by a percent or two a cycle as requests finish:
    a target is searched again when its inputs changed and RESEARCH_S passed since its last search,
    so the answer is at most that old (the window it reads spans 15 s or more)."""

    __slots__ = ("key", "found", "searched", "last_seen")

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.found: Found | None = None
        self.searched = 0.0  # view.now of the last search
        self.last_seen = 0.0


class Memos(StageState):
    def __init__(self, settings: DeriveSettings) -> None:
        self.targets = Scopes(Memo, settings.forget_after_s)

    def end(self, view: SnapshotView) -> None:
        self.targets.sweep(view.now)


def compute(ctx: Ctx, memos: Memos | None = None) -> Scaling | None:
    thr, kv = ctx.get("throughput"), ctx.get("kv")
    if ctx.shape is None or not ctx.gpus or thr is None:
        return None
    rate, prompt, total = thr.requests_per_s, thr.mean_prompt_tokens, thr.mean_request_tokens
    if not rate or rate <= 0 or prompt is None or total is None or prompt <= 0:
        return None  # no traffic finished in the window: nothing to cost
    output = total - prompt
    if output < 1:
        return None
    specs = [ctx.spec_for(g.name) for g in ctx.gpus]
    gpu = specs[0]
    if gpu is None or any(s is None for s in specs):
        return None
    hit = min(1.0, max(0.0, thr.prefix_hit_share or 0.0))
    cap = float(thr.running_cap) if thr.running_cap and thr.running_cap >= 1 else float(DEFAULT_MAX_SEQS)
    capacity = kv.capacity_tokens if kv is not None and kv.capacity_tokens else None
    key = (gpu, ctx.shape, max(1, ctx.tp), max(1, ctx.dp), quantized(prompt), quantized(output),
           quantized(1.0 - hit), cap, quantized(capacity) if capacity else None,
           ctx.settings.slo_ttft_s, ctx.settings.slo_tbt_s)
    memo = memos.targets.get(ctx.engine.target) if memos is not None else None
    if memo is not None and (memo.key == key or (memo.key is not None and ctx.now - memo.searched < RESEARCH_S)):
        found = memo.found
    else:
        found = search(*key)
        if memo is not None:
            memo.key, memo.found, memo.searched = key, found, ctx.now
    if memo is not None:
        memo.last_seen = ctx.now
    if found is None:
        return None
    return Scaling(found.max_rate, rate, found.batch, found.step_s, found.slots, found.limit)


def search(gpu: GpuSpec, shape: ModelShape, tp: int, ranks: int, prompt: float, output: float, uncached: float,
           cap: float, capacity: float | None, ttft_slo: float, tpot_slo: float) -> Found | None:
    """The highest rate within the SLOs for these inputs (the module's docstring says how)."""
    from exporter.physics.costs import PRIOR_EFFICIENCY, PRIOR_OVERHEAD_S, Hardware, decode_batch, step_cost

    computed_prompt = prompt * uncached
    # Tokens a running sequence holds: its prompt and half its output, over the sequences running at
    # a moment, where a long answer stays longer (length-biased: E[O^2] / 2E[O] for lognormal outputs).
    context = prompt + output * math.exp(OUTPUT_SIGMA ** 2) / 2.0
    hw = Hardware(gpu=gpu, tp=tp, bw_efficiency=PRIOR_EFFICIENCY["bw"],
                  compute_efficiency=PRIOR_EFFICIENCY["compute"], step_overhead_s=PRIOR_OVERHEAD_S["gpu"])

    def decode_s(batch: float, prefill: float = 0.0) -> float:
        """One step of `batch` decodes at the mean context, with `prefill` prompt tokens beside them."""
        step = decode_batch(max(1, round(batch)), int(context))
        if prefill >= 1:
            # The prompt's uncached part, attending to the cached prefix it reads (the engine's chunk).
            chunk, cached = int(prefill), max(0, int(prompt - prefill))
            step = dataclasses.replace(step, prefill_tokens=chunk, prefill_context=chunk * (cached + chunk / 2.0),
                                       prefill_cached_read=cached)
        return step_cost(hw, shape, step).time_s

    def costs(batch: float) -> tuple[float, float, float]:
        """(pure decode step, what one prompt adds to a step, mean step): B / output prompts arrive
        per step on average (each request decodes `output` steps), each adding its prefill."""
        t_dec = decode_s(batch)
        t_prompt = max(0.0, decode_s(batch, computed_prompt) - t_dec)
        return t_dec, t_prompt, t_dec + batch / output * t_prompt

    slots, slot_limit = cap, "max_seqs"
    if capacity is not None and capacity / ranks / context < cap:
        slots, slot_limit = capacity / ranks / context, "kv_cache"
    slots = max(1.0, math.floor(slots))

    def failing(batch: float) -> str | None:
        """What breaks at a steady batch of `batch` sequences (None: nothing)."""
        t_dec, t_prompt, t = costs(batch)
        rate = batch / (output * t)
        busy = rate * t_prompt  # the share of GPU time prompts take
        if busy >= 1.0:
            return "tpot"
        # Prompts arriving over the request's decode steps each start a busy period of prefill steps
        # (tpot_violations counts the prompts those bring).
        if tpot_violations(t_dec, t_prompt, rate * t_dec, output, tpot_slo, busy) > 1.0 - TPOT_QUANTILE:
            return "tpot"
        if batch >= slots:
            return slot_limit
        # The wait for a slot, the half step before the next step starts, and the step that computes
        # the prompt beside the decodes.
        ttft = HOST_S + wait_quantile(slots, batch, output * t) + 0.5 * t + t + t_prompt
        return "ttft" if ttft > ttft_slo else None

    # The batch is a mean over time: under long prompts with short answers it is below one sequence.
    if failing(MIN_BATCH) is not None:
        return None  # a trickle of traffic already breaks an SLO: no rate is within them (the verdict says why)
    lo, hi = MIN_BATCH, slots
    limit = failing(hi) or slot_limit
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) / 2.0
        why = failing(mid)
        if why is None:
            lo = mid
        else:
            hi, limit = mid, why
    t = costs(lo)[2]
    return Found(lo / (output * t) * ranks, lo, t, slots, limit)


def samples(s: Scaling, key: TargetKey) -> list[Sample]:
    labels = key.labels
    return [Sample("llm_slo_max_request_rate", labels, s.max_rate),
            Sample("llm_slo_load_ratio", labels, s.load_ratio)]


def numbers(s: Scaling) -> dict[str, Any]:
    return {"slo_max_request_rate": rounded(s.max_rate, 3), "slo_load_ratio": rounded(s.load_ratio),
            "slo_max_rate_batch": rounded(s.batch, 1), "slo_max_rate_step_s": rounded(s.step_s, 6),
            "slo_max_rate_limit": s.limit}


STAGE = Stage(
    name="scaling", compute=compute, samples=samples, numbers=numbers, after=("throughput", "kv"),
    state=Memos,
    emits=("llm_slo_max_request_rate", "llm_slo_load_ratio"),
)
