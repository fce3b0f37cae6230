"""Files the host source reads again and again, held open in between.

Opening a /proc file walks its path through procfs (for /proc/PID/... a pid lookup too) and costs
about as much as reading it; procfs and sysfs regenerate a file's text on every read from offset
0, so an fd kept open and read with os.pread gives the same fresh text for about half the cost.
"""

from __future__ import annotations

import contextlib
import os
import weakref

from exporter.sources.host_proc import read_fd, read_fd_record, read_text

MAX_HELD_FILES = 128
"""Bound on the files read every cycle held open: ~10 host-wide, 2 per NUMA node, 2 per GPU, 2 per
process of the engine's tree fit on a big host. Files beyond a bound are read the plain way (open,
read, close), so a bound costs speed, never data."""
MAX_HELD_THREAD_FILES = 128
"""Bound on the engine's task/TID/stat files held open between busiest-thread windows: an API
server's few dozen threads fit. With MAX_HELD_FILES, at most 256 fds, well under the usual
1024-fd soft limit."""


class HeldFiles:
    """Reads files like `read_text`, keeping the fds of procfs and sysfs files open in between.

    Only for files the kernel writes in one piece (procfs single_open files such as /proc/stat and
    /proc/PID/status, sysfs attributes). Files on a real filesystem (the tests' fixture trees, a
    pid file) are never held: one can be replaced under its path, and a held fd would go on
    reading the old file.

    Bounded: at most `limit` fds, and `close_unread`, which the owner calls as often as it reads
    the files (every cycle; every busiest-thread window), closes those not read since its last
    call, so a process that left the engine's tree or a GPU that went away gives its fds back.
    Not thread safe: the host source calls it under its lock."""

    def __init__(self, limit: int = MAX_HELD_FILES, max_bytes: int | None = None) -> None:
        self._limit = limit
        # With max_bytes, a file longer than that reads as None (a hostile tree's huge "sysfs
        # attribute"), and at most max_bytes + 1 bytes are read.
        self._max_bytes = max_bytes
        self._fds: dict[str, int] = {}
        self._read_since_sweep: set[str] = set()
        # Closes the fds when the source is dropped without close() (tests, a reloaded config).
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    @property
    def held(self) -> frozenset[str]:
        """Paths whose fds are open now."""
        return frozenset(self._fds)

    def read(self, path: str) -> str | None:
        """The file's text, None when it is absent or unreadable, as `read_text` gives it."""
        fd = self._fds.get(path)
        if fd is not None:
            self._read_since_sweep.add(path)
            try:
                return self._read_fd(fd)
            except OSError:
                # ESRCH: the process or thread is gone; ENODEV: the device. The path may name
                # another one now (a recycled pid), so it is opened again, as a plain read would.
                self._close(path)
        return self._open_and_read(path)

    def close_unread(self) -> None:
        """Closes the fds not read since the last call."""
        for path in [p for p in self._fds if p not in self._read_since_sweep]:
            self._close(path)
        self._read_since_sweep.clear()

    def close(self) -> None:
        _close_all(self._fds)
        self._read_since_sweep.clear()

    def _open_and_read(self, path: str) -> str | None:
        if len(self._fds) >= self._limit and self._max_bytes is None:
            return read_text(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            text = read_fd(fd) if self._max_bytes is None else self._read_fd(fd)
        except OSError:  # a task that died between open and read
            os.close(fd)
            return None
        if len(self._fds) < self._limit and _regenerated_on_read(fd):
            self._fds[path] = fd
            self._read_since_sweep.add(path)
        else:
            os.close(fd)
        return text

    def _read_fd(self, fd: int) -> str | None:
        if self._max_bytes is None:
            return read_fd_record(fd)
        data = os.pread(fd, self._max_bytes + 1, 0)
        return data.decode("utf-8", errors="replace") if len(data) <= self._max_bytes else None

    def _close(self, path: str) -> None:
        fd = self._fds.pop(path)
        self._read_since_sweep.discard(path)
        os.close(fd)


def _regenerated_on_read(fd: int) -> bool:
    """Is the file on procfs or sysfs? Those report neither blocks nor inodes; a filesystem that
    stores files reports its blocks (all but a tmpfs mounted with no size and no inode limit)."""
    try:
        fs = os.fstatvfs(fd)
    except OSError:
        return False
    return fs.f_blocks == 0 and fs.f_files == 0


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
