"""Traffic: arrival processes and length distributions, sampled from a seeded random.Random."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Token lengths. `lognormal` is what chat traffic looks like (a long right tail);
    `mean` is the distribution's mean, `sigma` its log-space spread; samples are clipped to lo..hi."""

    mean: float
    kind: str = "lognormal"  # lognormal | fixed | uniform
    sigma: float = 0.6
    lo: int = 1
    hi: int = 1 << 20

    def __post_init__(self) -> None:
        if self.kind not in ("lognormal", "fixed", "uniform"):
            raise ValueError(f"unknown length distribution {self.kind!r}")
        if self.mean < 1 or self.lo < 1 or self.hi < self.lo:
            raise ValueError("lengths must be >= 1 and lo <= hi")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.mean
        elif self.kind == "uniform":
            value = rng.uniform(self.lo, max(self.lo, 2 * self.mean - self.lo))
        else:
            mu = math.log(self.mean) - self.sigma**2 / 2  # so that E[X] = mean
            value = rng.lognormvariate(mu, self.sigma)
        return int(min(self.hi, max(self.lo, round(value))))


@dataclass(frozen=True, slots=True)
class Workload:
    """Who sends what. `load` scales Poisson arrivals relative to the twin's estimated capacity
    for this workload (so a scenario means the same thing on an L4 and on a B200); `rate_rps`
    sets an absolute rate instead. `fixed` keeps `concurrency` requests in flight (closed loop)."""

    prompt: LengthDist
    output: LengthDist
    arrival: str = "poisson"  # poisson | fixed | none
    load: float = 0.7
    rate_rps: float | None = None
    concurrency: int = 1
    prefix_hit_rate: float = 0.0  # fraction of each prompt found in the prefix cache
    surge_after_s: float | None = None  # from this time on, arrivals run at surge_load
    surge_load: float = 2.0
    think_s: float = 0.0  # closed loop: the client's own time between a response and its next request


    def __post_init__(self) -> None:
        if self.arrival not in ("poisson", "fixed", "none"):
            raise ValueError(f"unknown arrival process {self.arrival!r}")
        if not 0.0 <= self.prefix_hit_rate < 1.0:
            raise ValueError("prefix_hit_rate must be in [0, 1)")
        if not 0.0 <= self.think_s < 3600.0:
            raise ValueError("think_s must be in [0, 3600)")


def next_poisson(rng: random.Random, now: float, rate_at: float, rate_after: float, switch_at: float | None) -> float:
    """Next arrival after `now` with rate `rate_at`, switching to `rate_after` at `switch_at`.
    Memorylessness lets us restart the draw at the switch."""
    if rate_at <= 0 and (switch_at is None or rate_after <= 0):
        return math.inf
    if rate_at > 0:
        t = now + rng.expovariate(rate_at)
        if switch_at is None or t < switch_at or now >= switch_at:
            return t
    if switch_at is None:
        return math.inf
    start = max(now, switch_at)
    return start + rng.expovariate(rate_after) if rate_after > 0 else math.inf
