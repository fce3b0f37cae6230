"""Finding the engine process (pid file, listening port, or name) and reading its process tree
from /proc: CPU ticks per process and per thread, threads, RSS, CPU affinity.

Everything here takes `proc_root` so tests run on fixture trees; the pure parts (choosing a
root among candidates, thread ratios, the NUMA verdict) take plain values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from exporter.safefile import read_regular_file
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
    read_link,
    read_record,
    read_text,
    socket_inode,
)

MAX_PIDFILE_BYTES = 4096  # a pid and a newline; more is the wrong file


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


def read_stat(proc_root: str, pid: int, read: Reader = read_text) -> PidStat | None:
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
        text = read_text(os.path.join(proc_root, "net", table))
        if text is not None:
            inodes |= parse_listening_inodes(text, port)
    return inodes


def find_by_port(proc_root: str, port: int) -> int | None:
    """The process holding a socket that listens on `port`. Reading another user's fd links needs
    the same uid or CAP_SYS_PTRACE; processes we may not look into are skipped."""
    inodes = listening_inodes(proc_root, port)
    if not inodes:
        return None
    candidates: dict[int, PidStat] = {}
    for pid in pids(proc_root):
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        for fd in list_dir(fd_dir):
            target = read_link(os.path.join(fd_dir, fd))
            if target is not None and socket_inode(target) in inodes:
                stat = read_stat(proc_root, pid)
                if stat is not None:
                    candidates[pid] = stat
                break
    return choose_root(candidates)


def find_by_name(proc_root: str, pattern: re.Pattern[str], exclude: Iterable[int] = ()) -> int | None:
    """The root of the processes whose comm or command line matches `pattern` (re.search, so a
    plain substring works). `exclude` keeps the exporter itself out: its own command line may
    carry the pattern as an argument."""
    skip = set(exclude)
    candidates: dict[int, PidStat] = {}
    for pid in pids(proc_root):
        if pid in skip:
            continue
        stat = read_stat(proc_root, pid)
        if stat is None:
            continue
        cmdline = read_text(os.path.join(proc_root, str(pid), "cmdline")) or ""
        if pattern.search(stat.comm) or pattern.search(cmdline.replace("\0", " ").strip()):
            candidates[pid] = stat
    return choose_root(candidates)


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
