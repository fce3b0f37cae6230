"""The live planner validation's bookkeeping (tests/live/test_planner_live.py): the interleaved schedule,
the noise floor of each configuration, and the error table. It starts no engine, so the fast suite checks
it (tests/test_plan_noise.py) without one.

The noise floor of a configuration, per metric, is the largest relative distance of one of its runs from
the median of its runs in the same validation: floor = max_i |x_i / median(x) - 1|. The measured value a
prediction is compared with is that median, so the floor is in the error's own units: it is the error a
perfect model would show had the truth been any single one of the runs. An error counts against the model
only beyond it: excess = max(0, |err| - floor). The half-range ((max - min) / 2 / median) would halve the
floor of a configuration whose one run strayed while the others agreed, and that one run is exactly what
this shared machine does (a TPOT 65% slower for a minute). The floor is the truth's own spread only: the
calibration's spread moves every prediction too and is not subtracted, so the excess still counts it
against the model.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

KEYS = ("tpot", "ttft", "output_tokens_per_s")
# A run's latencies are the statistic its source has (observe.Stat.kind), as the planner compares them: the
# engine's own means where the exporter watched the load test (vLLM here: its API server sends a short
# answer in a few chunks, so the client's TPOT p50 is ~0), else the load test's medians (llama.cpp).
STATS = ("p50", "mean")
ROLES = ("calibration", "held-out", "extrapolation")

G = TypeVar("G")
D = TypeVar("D")


def interleave(groups: Sequence[G], rounds: int, run: Callable[[G, int], D]) -> list[list[D]]:
    """Runs every group once per round, round after round (A B C A B C ...), so that a drift of the
    machine over the validation hits every configuration alike instead of one group's whole sweep.
    Returns each group's runs in round order: result[g][r]."""
    if rounds < 1:
        raise ValueError("at least one round")
    out: list[list[D]] = [[] for _ in groups]
    for r in range(rounds):
        for i, group in enumerate(groups):
            out[i].append(run(group, r))
    return out


def noise_floor(values: Sequence[float]) -> float:
    """max_i |x_i / median - 1| (module docstring: why this and not the half-range); 0 for one run."""
    if not values:
        raise ValueError("no runs")
    med = statistics.median(values)
    if med <= 0:
        raise ValueError(f"median {med} of {list(values)}: a metric must be positive")
    return max(abs(v / med - 1.0) for v in values)


def excess(err: float, floor: float) -> float:
    """What of an error counts against the model: the part beyond the configuration's own spread."""
    return max(0.0, abs(err) - floor)


@dataclasses.dataclass(frozen=True)
class Repeats:
    """One configuration measured once per round: each run's metrics (KEYS)."""

    runs: tuple[Mapping[str, float], ...]

    def median(self) -> dict[str, float]:
        return {k: statistics.median(r[k] for r in self.runs) for k in KEYS}

    def floor(self) -> dict[str, float]:
        return {k: noise_floor([r[k] for r in self.runs]) for k in KEYS}


def median_index(values: Sequence[float]) -> int:
    """The index of the run whose value is the (lower) median: the one step of several that a calibration
    is given, a real step rather than a mix of steps, and neither the luckiest (best of N flatters every
    calibration as much as the machine allowed it once) nor the unluckiest."""
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    return order[(len(order) - 1) // 2]


def predicted_key(key: str, stat: str) -> str:
    """The plan JSON's field for a metric on a statistic: tpot_mean_s, ttft_p50_s, output_tokens_per_s."""
    return key if key == "output_tokens_per_s" else f"{key}_{stat}_s"


def errors(predicted: Mapping[str, Any], truth: Mapping[str, float], stat: str) -> dict[str, float]:
    if stat not in STATS:
        raise ValueError(stat)
    out = {}
    for key in KEYS:
        value = predicted[predicted_key(key, stat)]
        assert value is not None and value > 0, (key, stat, predicted)
        out[key] = value / truth[key] - 1.0
    return out


@dataclasses.dataclass(frozen=True)
class Row:
    engine: str
    role: str
    config: str
    stat: str  # the latencies' statistic (STATS)
    predicted: Mapping[str, Any]
    truth: Mapping[str, float]
    floor: Mapping[str, float]
    runs: int

    def pred(self, key: str) -> float:
        return self.predicted[predicted_key(key, self.stat)]

    @property
    def err(self) -> dict[str, float]:
        return errors(self.predicted, self.truth, self.stat)

    @property
    def excess(self) -> dict[str, float]:
        err = self.err
        return {k: excess(err[k], self.floor[k]) for k in KEYS}


def _pct(x: float) -> str:
    return f"{x:.0%}"


class Table:
    """Rows of the error table with each configuration's floor, printed and written as Markdown."""

    def __init__(self, limits: Mapping[str, float]) -> None:
        self.limits = dict(limits)
        self.rows: list[Row] = []
        self.missing: list[str] = []  # held-out configurations the machine left unmeasured, and why

    def unmeasured(self, engine: str, config: str, why: str) -> None:
        self.missing.append(f"{engine} {config} ({why})")

    def add(self, engine: str, role: str, config: str, stat: str, predicted: Mapping[str, Any],
            truth: Mapping[str, float], floor: Mapping[str, float], runs: int) -> Row:
        if role not in ROLES:
            raise ValueError(role)
        row = Row(engine, role, config, stat, predicted, truth, floor, runs)
        row.err  # noqa: B018 - a missing or zero prediction fails here, at the row that has it
        self.rows.append(row)
        return row

    def of(self, role: str) -> list[Row]:
        return [r for r in self.rows if r.role == role]

    def medians(self, role: str = "held-out") -> dict[str, float]:
        """Median |err| over the role's rows, the floor not subtracted (the number reported before floors)."""
        rows = self.of(role)
        return {k: statistics.median(abs(r.err[k]) for r in rows) for k in KEYS} if rows else {}

    def excess_medians(self, role: str = "held-out") -> dict[str, float]:
        """Median over the role's rows of the error beyond each row's floor: what the gate reads."""
        rows = self.of(role)
        return {k: statistics.median(r.excess[k] for r in rows) for k in KEYS} if rows else {}

    def beyond(self, role: str = "held-out") -> dict[str, int]:
        """How many of the role's rows err beyond their floor, per metric."""
        return {k: sum(1 for r in self.of(role) if r.excess[k] > 0) for k in KEYS}

    def markdown(self) -> str:
        lines = ["| engine | role | configuration | runs | latency stat | TPOT ms pred / meas | err | floor | "
                 "TTFT ms pred / meas | err | floor | tok/s pred / meas | err | floor |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            t, e, f = r.truth, r.err, r.floor
            lines.append(
                f"| {r.engine} | {r.role} | {r.config} | {r.runs} | {r.stat} | "
                f"{r.pred('tpot') * 1e3:.1f} / {t['tpot'] * 1e3:.1f} | {e['tpot']:+.0%} | {_pct(f['tpot'])} | "
                f"{r.pred('ttft') * 1e3:.0f} / {t['ttft'] * 1e3:.0f} | {e['ttft']:+.0%} | {_pct(f['ttft'])} | "
                f"{r.pred('output_tokens_per_s'):.1f} / {t['output_tokens_per_s']:.1f} | "
                f"{e['output_tokens_per_s']:+.0%} | {_pct(f['output_tokens_per_s'])} |")
        if self.missing:
            lines += ["", "Not measured (held out, left out of the medians): " + "; ".join(self.missing) + "."]
        for role in ("held-out", "extrapolation"):
            rows = self.of(role)
            if not rows:
                continue
            med, exc, beyond = self.medians(role), self.excess_medians(role), self.beyond(role)
            lines += ["", f"Over the {len(rows)} {role} configurations, median error beyond the floor (the "
                      "median |err| with no floor subtracted, and how many configurations err beyond their "
                      "floor): " + ", ".join(f"{k} {exc[k]:.0%} ({med[k]:.0%}; {beyond[k]} of {len(rows)})"
                                             for k in KEYS) + "."]
            if role == "held-out":
                lines.append("Beyond the floor, against the issue's bar: " + ", ".join(
                    f"{k} {'meets' if exc[k] <= self.limits[k] else 'misses'} {self.limits[k]:.0%}"
                    for k in KEYS) + ".")
        return "\n".join(lines) + "\n"
