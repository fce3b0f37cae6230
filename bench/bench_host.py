"""CPU cost of the host source on this machine's real /proc and /sys.

The "engine" is this process with 64 extra idle threads (a vLLM API server has a few dozen), found
through a pid file, so the cycles read the per-thread stat files a real engine would cost.

The source's clock steps CYCLE_S per cycle, the exporter's interval, so what it reads only every
few seconds (the busiest-thread window, the engine's tree walk) counts at its real rate: the
figure is the steady per-cycle cost, averaged over CYCLES.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time

from exporter.sources.host import HostOptions, HostSource
from exporter.sources.host_process import find_by_name

CYCLES = 50  # a multiple of the 5 s thread window and the 10 s tree walk
CYCLE_S = 1.0
EXTRA_THREADS = 64


def _per_call_ms(fn, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - start) * 1000.0 / repeat


class _SteppedClock:
    """Moves on CYCLE_S per collect: the time the exporter would let pass between cycles."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stepped(source: HostSource, clock: _SteppedClock):
    def cycle() -> None:
        clock.now += CYCLE_S
        source.collect_sync()

    return cycle


def run() -> list[tuple[str, str]]:
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, daemon=True) for _ in range(EXTRA_THREADS)]
    for w in workers:
        w.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pidfile = os.path.join(tmp, "engine.pid")
            with open(pidfile, "w") as f:
                f.write(f"{os.getpid()}\n")
            clock = _SteppedClock()
            source = HostSource(HostOptions(engine_pidfile=pidfile), clock=clock)
            source.collect_sync()  # the first cycle discovers GPUs and primes the deltas
            per_cycle = _per_call_ms(_stepped(source, clock), CYCLES)
            bare_clock = _SteppedClock()
            bare = HostSource(HostOptions(), clock=bare_clock)
            bare.collect_sync()
            no_engine = _per_call_ms(_stepped(bare, bare_clock), CYCLES)
        pattern = re.compile("no-such-engine-process")
        search = _per_call_ms(lambda: find_by_name("/proc", pattern), 10)
        processes = sum(1 for e in os.listdir("/proc") if e.isdigit())
    finally:
        stop.set()
        for w in workers:
            w.join()
    return [
        (f"host source CPU per cycle, engine with {EXTRA_THREADS + 1} threads (ms)", f"{per_cycle:.2f}"),
        ("host source CPU per cycle, no engine selector (ms)", f"{no_engine:.2f}"),
        (f"host engine search by name, {processes} processes (ms)", f"{search:.2f}"),
    ]


if __name__ == "__main__":
    for label, value in run():
        print(f"{label:70s} {value}")
