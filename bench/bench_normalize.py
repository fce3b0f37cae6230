"""Engine normalization CPU per collection cycle: replay.normalize_with_memo (exporter.sources.engines) on the
documented vLLM 0.11 page (tests/fixtures/engines/vllm-v0.11__documented.prom, 69 KB, ~590 parsed
samples -> ~500 normalized), parse included, in process CPU time (time.process_time).

cold: a new NormalizerState every cycle (first scrape of a target). warm: one state across cycles
(every scrape after the first: the parser's head cache and the recorded page plan are reused).
warm, full pass: a warm state whose page plan is dropped before each cycle (what a page that changes
shape every cycle costs, and what every warm cycle cost before plans); plain pass: normalize.normalize
alone (no memo, what the exporter would cost without replay.py). parse only: the parser's share
of a warm cycle.
"""

from __future__ import annotations

import gc
import pathlib
import time

from exporter.sources.engines.alias_tables import TABLES
from exporter.sources.engines.exposition import parse
from exporter.sources.engines.normalize import normalize as plain_normalize
from exporter.sources.engines.replay import normalize_with_memo
from exporter.sources.engines.state import NormalizerState

PAGE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "engines" / "vllm-v0.11__documented.prom"
BATCHES = 9
CYCLES = 40


def _ms_per_cycle(cycle, batches: int = BATCHES, cycles: int = CYCLES) -> float:
    """CPU ms per call: the best batch mean, so a noisy neighbour inflates no row."""
    best = float("inf")
    for _ in range(batches):
        gc.collect()
        start = time.process_time()
        for _ in range(cycles):
            cycle()
        best = min(best, (time.process_time() - start) / cycles)
    return best * 1e3


def measure(text: str) -> dict[str, float]:
    warm = NormalizerState()
    first = normalize_with_memo(text, target="bench", state=warm)
    normalize_with_memo(text, target="bench", state=warm)  # the page repeats: planned
    replan = NormalizerState()
    normalize_with_memo(text, target="bench", state=replan)
    plain_state = NormalizerState()
    plain_normalize(text, target="bench", state=plain_state)
    keep = TABLES[first.kind].keep.__contains__

    def cold() -> None:
        normalize_with_memo(text, target="bench", state=NormalizerState())

    def steady() -> None:
        normalize_with_memo(text, target="bench", state=warm)

    def full_pass() -> None:
        replan.memo = None
        normalize_with_memo(text, target="bench", state=replan)

    def plain() -> None:
        plain_normalize(text, target="bench", state=plain_state)

    def parse_only() -> None:
        parse(text, keep=keep, label_cache=warm.label_cache)

    return {
        "kb": len(text.encode()) / 1024,
        "samples": len(first.samples),
        "cold": _ms_per_cycle(cold),
        "warm": _ms_per_cycle(steady),
        "full": _ms_per_cycle(full_pass),
        "plain": _ms_per_cycle(plain),
        "parse": _ms_per_cycle(parse_only),
    }


def run() -> list[tuple[str, str]]:
    result = measure(PAGE.read_text())
    return [
        ("normalize page (vLLM 0.11 documented)", f"{result['kb']:.0f} KB, {result['samples']} samples out"),
        ("normalize, cold state (CPU ms/cycle)", f"{result['cold']:.2f} ms"),
        ("normalize, warm state (CPU ms/cycle)", f"{result['warm']:.2f} ms"),
        ("normalize, warm, full pass (no plan)", f"{result['full']:.2f} ms"),
        ("normalize, warm, plain pass (no memo)", f"{result['plain']:.2f} ms"),
        ("  of which parse, warm cache", f"{result['parse']:.2f} ms"),
    ]


if __name__ == "__main__":
    for label, value in run():
        print(f"{label:40} {value}")
