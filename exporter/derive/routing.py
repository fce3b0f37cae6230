"""What only the router can show: how it spreads requests over the engine replicas, which ones it
took out, and how long a request spends before the engine; and, per engine target that a router
sends traffic to, the facts the verdict's `routing` constraint reads (bottleneck.py).

Per router target and cycle (RoutingState.begin, before the engine targets): each backend's request
rate over the rate window (llm_router_backend_requests_total plus its prefill/decode requests), its
share, whether it is in rotation (health check passing and breaker not open), and the load skew
among those in rotation: the busiest one's rate over their mean. After the engine targets
(router_samples): the median time before the engine, the router's median TTFT (or latency) minus
the median of the same over the backends' engines this exporter reads.

A backend is joined to an engine target by host and port (the router's worker URL against the
target's URL; localhost is 127.0.0.1): the exporter beside a router and its replicas, or the demo.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from exporter.derive.quantiles import histogram_quantile
from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, Stage, StageState, TargetKey, rounded
from exporter.derive.view import RouterView, SnapshotView
from exporter.derive.window import HistogramWindow, RateWindow, Scopes
from exporter.snapshot import Sample, labels_of

MIN_RATE_PER_S = 0.05
"""Below this many requests a second over the window, through all backends, there is no load to be
skewed: share and skew are omitted."""
IDLE_SHARE = 0.5
"""A backend in rotation with less than this part of its fair share (1/N) idles while others work."""
_REQUESTS = ("llm_router_backend_requests_total", "llm_router_pd_requests_total")
_TTFT, _LATENCY = "llm_router_time_to_first_token_seconds", "llm_router_request_duration_seconds"
_ENGINE_TAILS = {_TTFT: "ttft", _LATENCY: "e2e"}


def join_key(backend: str) -> str:
    """host:port as both sides name it, localhost as 127.0.0.1 (a router's --worker-urls and the
    exporter's --engine often name one replica differently)."""
    host, sep, port = backend.rpartition(":")
    if not sep:
        host, port = backend, ""
    host = {"localhost": "127.0.0.1", "[::1]": "127.0.0.1", "::1": "127.0.0.1"}.get(host.lower(), host.lower())
    return f"{host}:{port}"


class Backend(NamedTuple):
    name: str
    rate: float | None  # requests/s sent to it over the window
    share: float | None  # of the router's requests over the window
    in_rotation: bool  # health check passing (or not reported) and breaker not open
    why_out: str  # "" in rotation, else "health check failing" / "circuit breaker open"
    engine: str  # the engine target joined to it ("" when none is read here)


class RouterFacts(NamedTuple):
    target: str
    router: str
    policy: str
    backends: tuple[Backend, ...]
    skew: float | None  # busiest in-rotation backend's rate over their mean

    @property
    def out(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if not b.in_rotation)

    @property
    def rotation(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.in_rotation)

    def words(self) -> str:
        policy = f", policy {self.policy}" if self.policy else ""
        return f"router {self.target} ({self.router}{policy})"


class Routed(NamedTuple):
    """One engine target as its routers see it: what the verdict reads."""

    router: RouterFacts
    backend: Backend
    busiest: bool  # its rate is the highest in rotation
    idle: tuple[str, ...]  # in-rotation backends under IDLE_SHARE of the fair share
    waiting: tuple[tuple[str, float], ...] = ()  # (backend, its engine's waiting requests) where read here

    def queues(self) -> str:
        """The engines' queues across the router's backends, as evidence ("" when fewer than two are read)."""
        if len(self.waiting) < 2:
            return ""
        return "engines' waiting queues: " + ", ".join(f"{b} {w:.0f}" for b, w in self.waiting)


def _per_backend(view: RouterView) -> tuple[dict[str, float], dict[str, str]]:
    """Request counters summed per backend, and why each backend is out ("" in rotation)."""
    counts: dict[str, float] = {}
    why: dict[str, str] = {}
    for s in view.samples:
        backend = s.label("backend")
        if not backend:
            continue
        if s.name in _REQUESTS:
            counts[backend] = counts.get(backend, 0.0) + s.value
        elif s.name == "llm_router_backend_up":
            why.setdefault(backend, "")
            if s.value < 0.5:
                why[backend] = "health check failing"
        elif s.name == "llm_router_backend_breaker_state":
            why.setdefault(backend, "")
            if s.label("state") == "open" and s.value >= 0.5:
                why[backend] = "circuit breaker open"
    for backend in counts:
        why.setdefault(backend, "")
    for backend in why:
        # Routers create a backend's request counter on its first request: one the router reports but
        # never chose has sent it nothing (the idle replica of a skewed policy).
        counts.setdefault(backend, 0.0)
    return counts, why


def _histogram(view: RouterView, name: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    buckets = sorted((float(s.label("le")), s.value) for s in view.samples if s.name == name + "_bucket")
    if not buckets or buckets[-1][0] != float("inf"):
        return None
    return tuple(b for b, _ in buckets), tuple(c for _, c in buckets)


class RoutingState(StageState):
    """Rate and histogram windows per router target, and this cycle's facts."""

    def __init__(self, settings: DeriveSettings) -> None:
        self.rates = Scopes(lambda: RateWindow(settings.rate_window_s), settings.forget_after_s)
        self.histograms = Scopes(lambda: HistogramWindow(settings.quantile_window_s), settings.forget_after_s)
        self.facts: dict[str, RouterFacts] = {}
        self.views: dict[str, RouterView] = {}

    def begin(self, view: SnapshotView) -> None:
        origins = {join_key(e.origin): e.target for e in view.engines if e.origin}
        self.facts, self.views = {}, {}
        for router in view.routers:
            self.views[router.target] = router
            self.facts[router.target] = self._facts(router, view.now, origins)

    def _facts(self, router: RouterView, now: float, origins: Mapping[str, str]) -> RouterFacts:
        counts, why = _per_backend(router)
        window: RateWindow = self.rates.get(router.target)
        window.observe(now, counts, {})
        rates = {b: window.rate(b) for b in why}
        known = [r for r in rates.values() if r is not None]
        total = sum(known)
        backends = tuple(
            Backend(b, rates[b], (rates[b] or 0.0) / total if total >= MIN_RATE_PER_S and rates[b] is not None
                    else None, not why[b], why[b], origins.get(join_key(b), ""))
            for b in sorted(why))
        rotation = [b.rate for b in backends if b.in_rotation and b.rate is not None]
        skew = None
        if len(rotation) >= 2 and sum(rotation) >= MIN_RATE_PER_S:
            skew = max(rotation) / (sum(rotation) / len(rotation))
        return RouterFacts(router.target, router.router, router.policy, backends, skew)

    def end(self, view: SnapshotView) -> None:
        self.rates.sweep(view.now)
        self.histograms.sweep(view.now)

    def pre_engine_s(self, target: str, now: float, engine_p50: Mapping[tuple[str, str], float]) -> float | None:
        """The router's median TTFT (else latency) minus the median of its joined engines' same."""
        view, facts = self.views.get(target), self.facts.get(target)
        if view is None or facts is None:
            return None
        for name in (_TTFT, _LATENCY):
            hist = _histogram(view, name)
            if hist is None:
                continue
            window: HistogramWindow = self.histograms.get(f"{target}\0{name}")
            delta = window.observe(now, hist[0], hist[1])
            engines = [engine_p50[(b.engine, _ENGINE_TAILS[name])] for b in facts.backends
                       if b.engine and (b.engine, _ENGINE_TAILS[name]) in engine_p50]
            if delta is None or not engines:
                return None
            router_p50 = histogram_quantile(0.5, hist[0], delta)
            return None if router_p50 is None else max(0.0, router_p50 - sum(engines) / len(engines))
        return None


def router_samples(state: RoutingState, now: float, engine_p50: Mapping[tuple[str, str], float]) -> list[Sample]:
    """The router-level derived families of this cycle."""
    out: list[Sample] = []
    for target, facts in state.facts.items():
        base = labels_of(target=target, router=facts.router)
        for b in facts.backends:
            if b.share is not None:
                out.append(Sample("llm_router_backend_share_ratio",
                                  labels_of(target=target, router=facts.router, backend=b.name), b.share))
        if facts.skew is not None:
            out.append(Sample("llm_router_load_skew", base, facts.skew))
        out.append(Sample("llm_router_backends_out", base, float(len(facts.out))))
        pre = state.pre_engine_s(target, now, engine_p50)
        if pre is not None:
            out.append(Sample("llm_router_pre_engine_seconds", base, pre))
    return out


WAITING = "llm_requests_waiting"


def _compute(ctx: Ctx, state: RoutingState) -> tuple[Routed, ...] | None:
    engines = {e.target: e for e in ctx.view.engines}
    routed = []
    for facts in state.facts.values():
        mine = next((b for b in facts.backends if b.engine == ctx.engine.target), None)
        if mine is None:
            continue
        rotation = facts.rotation
        rates = [b.rate for b in rotation if b.rate is not None]
        fair = 1.0 / len(rotation) if rotation else None
        idle = tuple(b.name for b in rotation if b is not mine and fair is not None and b.share is not None
                     and b.share < IDLE_SHARE * fair)
        busiest = bool(rates) and mine.in_rotation and mine.rate is not None and mine.rate >= max(rates)
        waiting = tuple((b.name, w) for b in facts.backends
                        if b.engine in engines and (w := engines[b.engine].get(WAITING)) is not None)
        routed.append(Routed(facts, mine, busiest, idle, waiting))
    return tuple(routed) or None


def _numbers(routed: Sequence[Routed]) -> Mapping[str, Any]:
    return {"routing": {r.router.target: {
        "router": r.router.router, "policy": r.router.policy, "backend": r.backend.name,
        "share": rounded(r.backend.share), "skew": rounded(r.router.skew), "in_rotation": r.backend.in_rotation,
        "why_out": r.backend.why_out or None, "busiest": r.busiest, "idle_backends": list(r.idle),
        "backends_out": [b.name for b in r.router.out], "engines_waiting": dict(r.waiting)} for r in routed}}


def _no_samples(_routed: Any, _key: TargetKey) -> list[Sample]:
    return []


# Per engine target it only feeds the verdict and the diagnosis: the router-level families (share, skew,
# backends out, time before the engine) are router_samples', which the Deriver calls once a cycle after
# the engine targets (their catalogue source is `router`).
STAGE = Stage(name="routing", compute=_compute, samples=_no_samples, emits=(), numbers=_numbers,
              state=RoutingState, engine=(WAITING,))
