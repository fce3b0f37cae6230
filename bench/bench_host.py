"""CPU cost of the host source on this machine's real /proc and /sys.

The "engine" is this process with 64 extra idle threads (a vLLM API server has a few dozen), found
through a pid file, so the cycles read the per-thread stat files a real engine would cost.

The source's clock steps CYCLE_S per cycle, the exporter's interval, so what it reads only every
few seconds (the busiest-thread window, the engine's tree walk) counts at its real rate: the
figure is the steady per-cycle cost, averaged over CYCLES.

The network links: this machine's own links against none (`network_exclude=("*",)`, the cost
before the links were read), and, in a fresh network namespace with MANY_LINKS veth ends on its
own sysfs (`unshare -rnm`, as tests/test_host_net_live.py), MANY_LINKS links against none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from exporter.sources.host import HostOptions, HostSource
from exporter.sources.host_process import find_by_name

CYCLES = 50  # a multiple of the 5 s thread window and the 10 s tree walk
CYCLE_S = 1.0
EXTRA_THREADS = 64
MANY_LINKS = 64  # veth ends in the namespace: MAX_NETWORK_LINKS, the most the source reads
NO_LINKS = ("*",)


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


def _bare_cycle_ms(**options) -> float:
    clock = _SteppedClock()
    source = HostSource(HostOptions(**options), clock=clock)
    source.collect_sync()
    return _per_call_ms(_stepped(source, clock), CYCLES)


def _links_side_by_side() -> tuple[float, float, int]:
    """Per-cycle CPU (ms) without an engine selector: network links off, then on; best of 3 each,
    interleaved so that load on a shared machine hits both alike."""
    off, on = float("inf"), float("inf")
    for _ in range(3):
        off = min(off, _bare_cycle_ms(network_exclude=NO_LINKS))
        on = min(on, _bare_cycle_ms())
    links = len(HostSource(HostOptions()).collect_sync().attrs["network_devices"].split(","))
    return off, on, links


def _in_namespace() -> None:
    """Inside `unshare -rnm`: this namespace's sysfs on /sys, MANY_LINKS veth ends, and the two
    figures as one JSON line."""
    subprocess.run(["mount", "-t", "sysfs", "sysfs", "/sys"], check=True)
    for i in range(MANY_LINKS // 2):
        subprocess.run(["ip", "link", "add", f"eth{2 * i}", "type", "veth", "peer", "name", f"eth{2 * i + 1}"],
                       check=True)
    for i in range(MANY_LINKS):
        subprocess.run(["ip", "link", "set", f"eth{i}", "up"], check=True)
    off, on, links = _links_side_by_side()
    print(json.dumps({"off": off, "on": on, "links": links}))


def _many_links() -> tuple[str, str, str]:
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        return ("not available (needs unshare and ip)",) * 3
    done = subprocess.run([unshare, "-rnm", "--fork", sys.executable, "-m", "bench.bench_host", "--in-namespace"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return (f"not available: {done.stderr.strip()[-120:]}",) * 3
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return f"{got['off']:.2f}", f"{got['on']:.2f}", str(got["links"])


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
    off, on, links = _links_side_by_side()
    ns_off, ns_on, ns_links = _many_links()
    return [
        (f"host source CPU per cycle, engine with {EXTRA_THREADS + 1} threads (ms)", f"{per_cycle:.2f}"),
        ("host source CPU per cycle, no engine selector (ms)", f"{no_engine:.2f}"),
        ("host source CPU per cycle, no engine selector, network links off (ms)", f"{off:.2f}"),
        (f"host source CPU per cycle, no engine selector, this machine's {links} links (ms)", f"{on:.2f}"),
        ("host source CPU per cycle, netns, network links off (ms)", ns_off),
        (f"host source CPU per cycle, netns, {ns_links} veth links (ms)", ns_on),
        (f"host engine search by name, {processes} processes (ms)", f"{search:.2f}"),
    ]


if __name__ == "__main__":
    if sys.argv[1:] == ["--in-namespace"]:
        _in_namespace()
        sys.exit(0)
    for label, value in run():
        print(f"{label:70s} {value}")
