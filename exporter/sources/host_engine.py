"""The engine process part of the host source: which process is the engine, its tree, and the
state its rates need between cycles (per-thread ticks, the previous uptime)."""

from __future__ import annotations

import os
from collections.abc import Callable

from exporter.snapshot import Sample
from exporter.sources.host_common import HostOptions, PresenceLog, log, sample
from exporter.sources.host_files import MAX_HELD_THREAD_FILES, HeldFiles
from exporter.sources.host_pci import NumaNode, PciLink, read_online_cpus
from exporter.sources.host_proc import Reader, read_text
from exporter.sources.host_process import (
    MAX_MATCH_S,
    NameTest,
    ProcessId,
    ProcessScan,
    ProcessSearch,
    ThreadKey,
    busiest_thread_ratio,
    identity,
    name_search,
    numa_mismatch,
    port_search,
    read_pidfile,
    rescan_tree,
    scan_tree,
)

BUSIEST_THREAD_WINDOW_S = 5.0
"""The busiest-thread ratio is computed over windows this long and repeated in between: reading
every thread's stat file is most of the host source's cost, and one read every 5 s instead of
every cycle cuts it by five."""
# A cycle may run a little early; without this slack 1 s cycles would close a 5 s window at
# the 6th cycle about half the time.
_WINDOW_SLACK_S = 0.5


class EngineTracker:
    """Finds the engine process once and follows it across cycles (pid plus start time, so a
    recycled pid is not mistaken for it); searches again, rate limited, when it is gone."""

    def __init__(
        self, opts: HostOptions, clock: Callable[[], float], presence: PresenceLog, read: Reader = read_text
    ) -> None:
        self._opts = opts
        self._clock = clock
        self._presence = presence
        self._read = read  # for the files read every cycle: each process's stat and status
        # Each thread's stat, read once per window: held in between, closed at the next window
        # when not read again (the thread ended or its process left the tree).
        self._thread_files = HeldFiles(MAX_HELD_THREAD_FILES)
        self._clk_tck = os.sysconf("SC_CLK_TCK")
        # A search walks every process (and, by port, every fd): spread over cycles, each sweep
        # within its time budget (host_process.ProcessSearch).
        self._search: ProcessSearch | None = None
        if opts.engine_port is not None:
            self._search = port_search(opts.proc_root, opts.engine_port, clock)
        elif opts.engine_process_name:
            pattern = opts.name_pattern()
            assert pattern is not None
            self._search = name_search(opts.proc_root, pattern, clock, on_pass=self._on_pass)
        self._name_test: NameTest | None = None
        self._undecided_logged = False
        self._current: ProcessId | None = None
        self._next_search = float("-inf")
        self._tree: tuple[int, ...] = ()  # root first, then descendants breadth first
        self._next_tree_refresh = float("-inf")
        # Only the threads of the last read are kept, so threads that ended drop out.
        self._prev_threads: dict[ThreadKey, int] = {}
        self._prev_uptime: float | None = None
        self._next_thread_window = float("-inf")
        self._busiest_ratio: float | None = None  # of the last window closed, repeated until the next
        self._pids: frozenset[int] = frozenset()

    @property
    def pids(self) -> frozenset[int]:
        return self._pids

    @property
    def root_pid(self) -> int | None:
        return self._current.pid if self._current is not None else None

    @property
    def tracked_threads(self) -> frozenset[int]:
        return frozenset(tid for tid, _ in self._prev_threads)

    @property
    def held_files(self) -> frozenset[str]:
        return self._thread_files.held

    def close(self) -> None:
        self._thread_files.close()

    def samples(
        self, nodes: tuple[NumaNode, ...], links: tuple[PciLink, ...], uptime: float | None
    ) -> list[Sample]:
        root = self._locate()
        now = self._clock()
        window_closes = now >= self._next_thread_window
        scans = self._scan_tree(root, threads=window_closes) if root is not None else []
        self._presence.note("engine process", bool(scans))
        self._pids = frozenset(s.pid for s in scans)
        if not scans:
            self._forget_threads()
            return [sample("llm_engine_process_found", 0)]
        counted = scans if self._opts.engine_include_children else scans[:1]
        if window_closes:
            self._busiest_ratio = self._close_thread_window(counted, uptime, now)
            self._thread_files.close_unread()
        out = [
            sample("llm_engine_process_found", 1),
            sample(
                "llm_engine_process_cpu_seconds_total",
                sum(s.stat.utime + s.stat.stime for s in counted) / self._clk_tck,
            ),
            *_sum_status(counted),
        ]
        if self._busiest_ratio is not None:
            out.append(sample("llm_engine_process_busiest_thread_cpu_ratio", self._busiest_ratio))
        mismatch = self._numa_mismatch(scans[0], nodes, links)
        if mismatch is not None:
            out.append(sample("llm_engine_numa_mismatch", int(mismatch)))
        return out

    def _locate(self) -> int | None:
        opts = self._opts
        if opts.engine_pidfile:
            # Re-read every cycle: it is one small file and a restarted engine rewrites it.
            # _adopt checks that the process exists.
            return self._adopt(read_pidfile(opts.engine_pidfile))
        if self._current is not None:
            if identity(opts.proc_root, self._current.pid, self._read) == self._current:
                return self._current.pid
            self._adopt(None)
            self._next_search = float("-inf")  # it just went away: look again now
        search = self._search
        if search is None:
            return None
        if not search.in_progress:
            now = self._clock()
            if now < self._next_search:
                return None
            # A search is rate limited from its start; one cut short goes on next cycle.
            self._next_search = now + opts.search_interval_s
        done, found = search.sweep()
        if not done:
            return None
        self._note_undecided()
        return self._adopt(found.pid if found is not None else None, found)

    def _on_pass(self, test: NameTest) -> None:
        self._name_test = test

    def _note_undecided(self) -> None:
        """One line when a search first passes over processes it could not tell in time (a
        pattern whose DFA keeps exploding on their command lines), one when none is left."""
        test = self._name_test
        undecided = test.undecided if test is not None else 0
        if bool(undecided) != self._undecided_logged:
            self._undecided_logged = bool(undecided)
            if undecided:
                log.warning("host: engine search: %d command line(s) not matched within %gs were taken as "
                            "not matching; a simpler engine_process_name avoids this", undecided, MAX_MATCH_S)
            else:
                log.info("host: engine search: every command line matched in time again")

    def _adopt(self, pid: int | None, expected: ProcessId | None = None) -> int | None:
        found = identity(self._opts.proc_root, pid, self._read) if pid is not None else None
        if expected is not None and found != expected:
            found = None  # the pid ended and was reused since it matched; the next search decides
        if found != self._current:
            self._forget_threads()  # another process: its threads share nothing with the old one
            self._tree = ()
        self._current = found
        return found.pid if found is not None else None

    def _forget_threads(self) -> None:
        """Drops the thread window; the next cycle that finds an engine opens a new one."""
        self._prev_threads, self._prev_uptime = {}, None
        self._busiest_ratio = None
        self._next_thread_window = float("-inf")
        self._thread_files.close()

    def _scan_tree(self, root: int, threads: bool) -> list[ProcessScan]:
        # Walking the tree reads one children file per thread, which doubles the cost of a cycle;
        # the tree changes rarely (workers start with the engine), so it is walked again only
        # every search interval, for a new root, or when a known process went away.
        opts = self._opts
        now = self._clock()
        read_thread = self._thread_files.read
        if self._tree and self._tree[0] == root and now < self._next_tree_refresh:
            scans, intact = rescan_tree(
                opts.proc_root,
                self._tree,
                opts.max_threads,
                threads=threads,
                read=self._read,
                read_thread=read_thread,
            )
            if not intact:
                self._next_tree_refresh = float("-inf")
            return scans
        scans = scan_tree(
            opts.proc_root,
            root,
            opts.max_processes,
            opts.max_threads,
            threads=threads,
            read=self._read,
            read_thread=read_thread,
        )
        self._tree = tuple(s.pid for s in scans)
        self._next_tree_refresh = now + opts.search_interval_s
        return scans

    def _close_thread_window(
        self, scans: list[ProcessScan], uptime: float | None, now: float
    ) -> float | None:
        """The busiest thread's CPU share since the window opened (None for the first window, or
        without /proc/uptime), and opens the next window."""
        current: dict[ThreadKey, int] = {}
        for s in scans:
            current.update(s.thread_ticks or {})
        # /proc/uptime is the kernel's own clock for the same tick accounting, and fixture trees
        # can set it.
        ratio = None
        if uptime is not None and self._prev_uptime is not None:
            ratio = busiest_thread_ratio(self._prev_threads, current, uptime - self._prev_uptime, self._clk_tck)
        if uptime is not None:  # else the window stays open: one missed read costs one window
            self._prev_threads, self._prev_uptime = current, uptime
        self._next_thread_window = now + BUSIEST_THREAD_WINDOW_S - _WINDOW_SLACK_S
        return ratio

    def _numa_mismatch(
        self, root: ProcessScan, nodes: tuple[NumaNode, ...], links: tuple[PciLink, ...]
    ) -> bool | None:
        # The root process's affinity decides: engines that pin at all pin the main process, and
        # children inherit it unless they set their own.
        wanted = self._opts.engine_gpu_pci_addresses
        gpu_nodes = [
            link.numa_node
            for link in links
            if link.numa_node is not None and (wanted is None or link.address in wanted)
        ]
        allowed = root.status.cpus_allowed if root.status else None
        return numa_mismatch(allowed, read_online_cpus(self._opts.sys_root, self._read), nodes, gpu_nodes)


def _sum_status(scans: list[ProcessScan]) -> list[Sample]:
    # A sum over part of the tree would understate; omit the family unless every process gave
    # the field.
    out = []
    threads = [s.status.threads if s.status else None for s in scans]
    if None not in threads:
        out.append(sample("llm_engine_process_threads", sum(t for t in threads if t is not None)))
    rss = [s.status.rss_bytes if s.status else None for s in scans]
    if None not in rss:
        out.append(sample("llm_engine_process_resident_memory_bytes", sum(r for r in rss if r is not None)))
    return out
