"""Finding the engine process (pid file, listening port, or name) and reading its process tree
from /proc: CPU ticks per process and per thread, threads, RSS, CPU affinity.

Everything here takes `proc_root` so tests run on fixture trees; the pure parts (choosing a
root among candidates, thread ratios, the NUMA verdict) take plain values.
"""

from __future__ import annotations

import itertools
import os
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from exporter.safefile import read_regular_file
from exporter.sources.host_match import LinearPattern
from exporter.sources.host_pci import NumaNode
from exporter.sources.host_proc import (
    PidStat,
    PidStatus,
    Reader,
    list_dir,
    parse_listening_inodes,
    parse_pid_stat,
    parse_pid_status,
    parse_thread_ticks,
    read_bounded,
    read_link,
    read_prefix,
    read_record,
    read_text,
    socket_inode,
)

MAX_PIDFILE_BYTES = 4096  # a pid and a newline; more is the wrong file
MAX_CMDLINE_BYTES = 4096
"""What is read of another process's command line, and matched: its program and first arguments
(`vllm serve <model> --port ...`) are there. Any local user decides the rest (Linux allows about
2 MiB), so the rest is never read."""
MAX_STAT_BYTES = 4096  # /proc/PID/stat: 52 numbers and a comm of at most 16 bytes, under 1 KiB
MAX_NET_TCP_BYTES = 4 << 20
"""/proc/net/tcp(6) read when looking for a listening port: about 27,000 sockets. The kernel lists
listening sockets first, so a host with more connections than that still shows its listeners."""
MAX_FDS_PER_PROCESS = 16384
"""fds looked at per process when finding who holds the engine's port: a listening socket is
opened at start, among the first fds; a process holding a million fds costs no more than this."""
SEARCH_SWEEP_BUDGET_S = 0.05
"""Wall time one sweep of a search may take, half the shortest interval (0.1 s); the next cycle
goes on where it stopped. A host's few hundred processes take a few ms; a process list however
long or hostile costs at most this (plus one process's MAX_MATCH_S) per cycle."""
MAX_SEARCH_PROCESSES_PER_SWEEP = 2048  # processes looked at per sweep, whatever their cost
MAX_MATCH_S = 0.05
"""Time one command line may take to match. The pattern runs in linear time (host_match.py) over
at most MAX_CMDLINE_BYTES, a few milliseconds; a pattern whose DFA keeps exploding could take
longer, and that process is then taken as not matching (counted, logged once)."""
MAX_LISTED_PIDS = 1 << 22  # pid_max's ceiling on 64-bit Linux: a search never lists more


class ThreadKey(NamedTuple):
    """A thread across cycles: a tid can be reused by a new thread, the pair cannot."""

    tid: int
    starttime: int


@dataclass(frozen=True, slots=True)
class ProcessId:
    """A pid plus its start time in ticks since boot, which tells a restarted engine that got a
    recycled pid apart from the one found earlier."""

    pid: int
    starttime: int


@dataclass(frozen=True, slots=True)
class ProcessScan:
    """One process read in one cycle."""

    pid: int
    stat: PidStat
    status: PidStatus | None
    thread_ticks: dict[ThreadKey, int] | None  # None: threads not read this cycle
    children: tuple[int, ...] | None  # None: not read, or the kernel has no task/*/children files


def pids(proc_root: str) -> list[int]:
    return [int(e) for e in list_dir(proc_root) if e.isdigit()]


def _read_stat_file(path: str) -> str | None:
    return read_bounded(path, MAX_STAT_BYTES)


def read_stat(proc_root: str, pid: int, read: Reader = _read_stat_file) -> PidStat | None:
    text = read(os.path.join(proc_root, str(pid), "stat"))
    if text is None:
        return None
    try:
        return parse_pid_stat(text)
    except (ValueError, IndexError):
        return None


def identity(proc_root: str, pid: int, read: Reader = read_text) -> ProcessId | None:
    stat = read_stat(proc_root, pid, read)
    return ProcessId(pid, stat.starttime) if stat is not None else None


def self_and_parent(proc_root: str) -> tuple[int, ...]:
    """This exporter's pid and its parent's as `proc_root` sees them (through its `self` link, so
    it holds in another pid namespace and is empty for a fixture tree). The exporter's command
    line, or the shell that started it, may carry the engine name as an argument."""
    target = read_link(os.path.join(proc_root, "self"))
    if target is None or not target.isdigit():
        return ()
    pid = int(target)
    stat = read_stat(proc_root, pid)
    # Pid 1 is a container's init: never skip it, it may well be the engine.
    return (pid, stat.ppid) if stat is not None and stat.ppid > 1 else (pid,)


def choose_root(candidates: dict[int, PidStat]) -> int | None:
    """Among matching processes, the one whose parent does not match too (uvicorn workers and
    multiprocessing children inherit the socket and the command line), oldest first."""
    if not candidates:
        return None
    roots = [pid for pid, st in candidates.items() if st.ppid not in candidates] or list(candidates)
    return min(roots, key=lambda pid: (candidates[pid].starttime, pid))


def read_pidfile(pidfile: str) -> int | None:
    """The pid written in the file, read afresh each time (a restarted engine replaces it). A
    regular file only: a FIFO put in its place would hold the host source's thread for ever."""
    try:
        text = read_regular_file(pidfile, MAX_PIDFILE_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def listening_inodes(proc_root: str, port: int) -> set[int]:
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        data = read_prefix(os.path.join(proc_root, "net", table), MAX_NET_TCP_BYTES + 1)
        if data is None:
            continue
        if len(data) > MAX_NET_TCP_BYTES:
            data = data[: data.rfind(b"\n") + 1]  # whole lines only: the listeners come first
        inodes |= parse_listening_inodes(data.decode("ascii", "replace"), port)
    return inodes


def read_cmdline(proc_root: str, pid: int) -> str:
    """The start of a process's command line, arguments joined by spaces ("" for a kernel thread
    or a process gone); at most MAX_CMDLINE_BYTES are read."""
    data = read_prefix(os.path.join(proc_root, str(pid), "cmdline"), MAX_CMDLINE_BYTES) or b""
    return data.decode("utf-8", "replace").replace("\0", " ").strip()


class Matcher(Protocol):
    """A compiled pattern: host_match.LinearPattern, or a re.Pattern (tests, the bench)."""

    def search(self, text: str, /) -> object: ...


PidTest = Callable[[int], PidStat | None]
"""One search's test of one process: its stat when it is a candidate, else None."""


class ProcessSearch:
    """A search through every process for the engine, spread over as many sweeps as it needs.

    A pass lists the pids once, then each `sweep` looks at the next processes, at most
    MAX_SEARCH_PROCESSES_PER_SWEEP of them and for at most SEARCH_SWEEP_BUDGET_S, and stops; the
    caller sweeps again next cycle. When the list is done, the root among the candidates is the
    result. `begin` starts a pass: it returns the test for each pid, or None when nothing can
    match (no socket listens on the port) and the pass is over at once."""

    def __init__(self, proc_root: str, begin: Callable[[], PidTest | None],
                 clock: Callable[[], float] = time.monotonic, *,
                 budget_s: float = SEARCH_SWEEP_BUDGET_S,
                 max_per_sweep: int = MAX_SEARCH_PROCESSES_PER_SWEEP) -> None:
        self._proc_root = proc_root
        self._begin = begin
        self._clock = clock
        self._budget_s = budget_s
        self._max_per_sweep = max_per_sweep
        self._test: PidTest | None = None
        self._pending = array("l")  # pids of this pass not looked at yet, last first
        self._candidates: dict[int, PidStat] = {}
        self.sweeps = 0  # of the pass now running or the last one

    @property
    def in_progress(self) -> bool:
        return self._test is not None

    def sweep(self) -> tuple[bool, ProcessId | None]:
        """(the pass is over, the process found). Over with None: nothing matched."""
        if self._test is None:
            self._test = self._begin()
            if self._test is None:
                return True, None
            listed = sorted(itertools.islice(_pids_iter(self._proc_root), MAX_LISTED_PIDS), reverse=True)
            self._pending = array("l", listed)
            self._candidates = {}
            self.sweeps = 0
        self.sweeps += 1
        deadline = self._clock() + self._budget_s
        test, pending, candidates = self._test, self._pending, self._candidates
        for _ in range(self._max_per_sweep):
            if not pending:
                break
            pid = pending.pop()
            stat = test(pid)
            if stat is not None:
                candidates[pid] = stat
            if self._clock() >= deadline:
                break
        if pending:
            return False, None
        self._test = None
        root = choose_root(candidates)
        self._candidates = {}
        return True, (ProcessId(root, candidates[root].starttime) if root is not None else None)

    def run(self) -> ProcessId | None:
        """A whole pass at once (tests, the bench)."""
        while True:
            done, found = self.sweep()
            if done:
                return found


def _pids_iter(proc_root: str) -> Iterable[int]:
    try:
        with os.scandir(proc_root) as entries:
            for entry in entries:
                if entry.name.isdigit():
                    yield int(entry.name)
    except OSError:
        return


class NameTest:
    """The test of a search by name: does the pattern occur in the process's comm or the start
    of its command line. Counts the command lines that took too long to tell."""

    def __init__(self, proc_root: str, pattern: Matcher, exclude: Iterable[int] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._proc_root = proc_root
        self._pattern = pattern
        self._skip = frozenset(exclude)
        self._clock = clock
        self.undecided = 0

    def __call__(self, pid: int) -> PidStat | None:
        if pid in self._skip:
            return None
        stat = read_stat(self._proc_root, pid)
        if stat is None:
            return None
        for text in (stat.comm, read_cmdline(self._proc_root, pid)):
            got = self._search(text)
            if got is None:
                self.undecided += 1
                return None
            if got:
                return stat
        return None

    def _search(self, text: str) -> bool | None:
        pattern = self._pattern
        if isinstance(pattern, LinearPattern):
            return pattern.search(text, self._clock() + MAX_MATCH_S, self._clock)
        return bool(pattern.search(text))


def name_search(proc_root: str, pattern: Matcher, clock: Callable[[], float] = time.monotonic,
                on_pass: Callable[[NameTest], None] | None = None) -> ProcessSearch:
    """A search by name; `on_pass` is handed each pass's test when it starts (for its counts)."""

    def begin() -> PidTest:
        test = NameTest(proc_root, pattern, self_and_parent(proc_root), clock)
        if on_pass is not None:
            on_pass(test)
        return test

    return ProcessSearch(proc_root, begin, clock)


def port_search(proc_root: str, port: int, clock: Callable[[], float] = time.monotonic) -> ProcessSearch:
    """A search for the process holding a socket that listens on `port`. Reading another user's
    fd links needs the same uid or CAP_SYS_PTRACE; processes we may not look into are skipped."""

    def begin() -> PidTest | None:
        inodes = listening_inodes(proc_root, port)
        if not inodes:
            return None
        return lambda pid: _holds_socket(proc_root, pid, inodes)

    return ProcessSearch(proc_root, begin, clock)


def _holds_socket(proc_root: str, pid: int, inodes: set[int]) -> PidStat | None:
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        with os.scandir(fd_dir) as entries:
            for entry in itertools.islice(entries, MAX_FDS_PER_PROCESS):
                target = read_link(entry.path)
                if target is not None and socket_inode(target) in inodes:
                    return read_stat(proc_root, pid)
    except OSError:
        return None
    return None


def find_by_port(proc_root: str, port: int) -> int | None:
    """The process holding a socket that listens on `port`, in one whole search."""
    found = port_search(proc_root, port).run()
    return found.pid if found is not None else None


def find_by_name(proc_root: str, pattern: Matcher, exclude: Iterable[int] = ()) -> int | None:
    """The root of the processes whose comm or command line (its first MAX_CMDLINE_BYTES)
    matches `pattern`, in one whole search. `exclude` keeps the exporter itself out: its own
    command line may carry the pattern as an argument."""
    test = NameTest(proc_root, pattern, exclude)
    found = ProcessSearch(proc_root, lambda: test, budget_s=float("inf")).run()
    return found.pid if found is not None else None


def scan_process(
    proc_root: str,
    pid: int,
    max_threads: int,
    *,
    children: bool = True,
    threads: bool = True,
    read: Reader = read_text,
    read_thread: Reader = read_record,
) -> ProcessScan | None:
    """Stat and status of one process, read with `read`; with `threads`, also every thread's
    ticks (each task/TID/stat read with `read_thread`), and with `children`, the pids it forked.
    Both read one file per thread, so callers ask for them only now and then."""
    base = os.path.join(proc_root, str(pid))
    stat = read_stat(proc_root, pid, read)
    if stat is None:
        return None
    status_text = read(os.path.join(base, "status"))
    try:
        status = parse_pid_status(status_text) if status_text is not None else None
    except (ValueError, IndexError):
        status = None
    tids = _tids(base, max_threads) if threads or children else []
    return ProcessScan(
        pid=pid,
        stat=stat,
        status=status,
        thread_ticks=_thread_ticks(base, tids, read_thread) if threads else None,
        children=_children(base, tids) if children else None,
    )


def _tids(base: str, max_threads: int) -> list[str]:
    return [t for t in sorted(list_dir(os.path.join(base, "task")))[:max_threads] if t.isdigit()]


def _thread_ticks(base: str, tids: list[str], read: Reader) -> dict[ThreadKey, int]:
    # Runs once per thread of the tree: paths by f-string and the ticks-only parser.
    ticks: dict[ThreadKey, int] = {}
    for tid in tids:
        text = read(f"{base}/task/{tid}/stat")
        if text is None:
            continue  # the thread ended since the listing
        try:
            used, starttime = parse_thread_ticks(text)
        except (ValueError, IndexError):
            continue
        ticks[ThreadKey(int(tid), starttime)] = used
    return ticks


def _children(base: str, tids: list[str]) -> tuple[int, ...] | None:
    """Pids forked by any of the threads; None when the kernel has no task/TID/children files
    (CONFIG_PROC_CHILDREN), and the caller scans ppids instead."""
    kids: list[int] = []
    for tid in tids:
        text = read_text(f"{base}/task/{tid}/children")
        if text is None:
            return None
        kids.extend(int(k) for k in text.split())
    return tuple(kids)


def children_by_ppid(proc_root: str) -> dict[int, list[int]]:
    """Fallback for kernels without task/*/children: one pass over every /proc/PID/stat."""
    tree: dict[int, list[int]] = {}
    for pid in pids(proc_root):
        stat = read_stat(proc_root, pid)
        if stat is not None:
            tree.setdefault(stat.ppid, []).append(pid)
    return tree


def scan_tree(
    proc_root: str,
    root: int,
    max_processes: int,
    max_threads: int,
    *,
    threads: bool = True,
    read: Reader = read_text,
    read_thread: Reader = read_record,
) -> list[ProcessScan]:
    """The root and its descendants (breadth first, at most max_processes), each scanned once."""
    scans: list[ProcessScan] = []
    queue = [root]
    seen: set[int] = set()
    by_ppid: dict[int, list[int]] | None = None
    while queue and len(scans) < max_processes:
        pid = queue.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        scan = scan_process(proc_root, pid, max_threads, threads=threads, read=read, read_thread=read_thread)
        if scan is None:
            continue
        scans.append(scan)
        kids = scan.children
        if kids is None:
            if by_ppid is None:
                by_ppid = children_by_ppid(proc_root)
            kids = tuple(by_ppid.get(pid, ()))
        queue.extend(sorted(kids))
    return scans


def rescan_tree(
    proc_root: str,
    tree: tuple[int, ...],
    max_threads: int,
    *,
    threads: bool = True,
    read: Reader = read_text,
    read_thread: Reader = read_record,
) -> tuple[list[ProcessScan], bool]:
    """Scans the pids of a tree found earlier, without reading children files. Returns the scans
    and whether the tree is still intact (no process gone, no pid reused outside the tree)."""
    scans: list[ProcessScan] = []
    members = set(tree)
    intact = True
    for i, pid in enumerate(tree):
        scan = scan_process(
            proc_root, pid, max_threads, children=False, threads=threads, read=read, read_thread=read_thread
        )
        if scan is None or (i > 0 and scan.stat.ppid not in members):
            intact = False
            continue
        scans.append(scan)
    return scans, intact


def busiest_thread_ratio(
    previous: dict[ThreadKey, int], current: dict[ThreadKey, int], elapsed_s: float, clk_tck: int
) -> float | None:
    """Largest CPU share (0..1) of any thread seen in both reads; None when nothing to compare.
    A tokenizer or scheduler thread pinned at one core shows as ~1.0 however many cores the
    whole process uses."""
    if elapsed_s <= 0:
        return None
    best: float | None = None
    for key, ticks in current.items():
        before = previous.get(key)
        if before is None or ticks < before:
            continue
        ratio = (ticks - before) / (clk_tck * elapsed_s)
        best = ratio if best is None else max(best, ratio)
    # Tick accounting and the 10 ms resolution of /proc/uptime can overshoot a little.
    return min(best, 1.0) if best is not None else None


def numa_mismatch(
    cpus_allowed: frozenset[int] | None,
    online: frozenset[int] | None,
    nodes: tuple[NumaNode, ...],
    gpu_nodes: Iterable[int],
) -> bool | None:
    """Is the process pinned to CPUs outside the NUMA node(s) of its GPUs?

    True when its affinity is narrower than the online CPUs and includes CPUs of a node that
    holds none of its GPUs. An unpinned process is not a mismatch (the scheduler may still
    place it well). One NUMA node: never. None when the answer is unknown (no affinity, a node
    without a CPU list, or no GPU with a known node).
    """
    if cpus_allowed is None or not nodes or any(n.cpus is None for n in nodes):
        return None
    node_cpus = {n.node: n.cpus for n in nodes if n.cpus is not None}
    if len(node_cpus) == 1:
        return False
    online_cpus = online if online is not None else frozenset().union(*node_cpus.values())
    effective = cpus_allowed & online_cpus
    if not effective:
        return None
    if online_cpus <= cpus_allowed:
        return False
    gpu_cpus = frozenset().union(*(node_cpus[n] for n in set(gpu_nodes) if n in node_cpus))
    if not gpu_cpus:
        return None
    return not effective <= gpu_cpus
