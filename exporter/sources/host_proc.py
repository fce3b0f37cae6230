"""Pure parsers for the /proc files the host source reads, plus the plain, tolerant file reader.

Every parser takes the file's text and returns plain records, so the unit tests call them on
strings (node_exporter's `parseLoad` pattern). None of them touch the filesystem.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass

# Fields of a /proc/stat cpu line, in kernel order. guest and guest_nice are already counted in
# user and nice, so they are left out of the totals (counting them twice would lower idle).
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_FIELDS_USED = len(_STAT_FIELDS)
_IDLE_START, _IDLE_END = _STAT_FIELDS.index("idle"), _STAT_FIELDS.index("iowait") + 1
_READ_CHUNK = 1 << 16

Reader = Callable[[str], str | None]
"""Reads one file's text, None when it is absent or unreadable: `read_text`, or `HeldFiles.read`
for the files read every cycle."""


def read_text(path: str) -> str | None:
    """The file's text, or None when it is absent or unreadable (a vanished pid, no PSI, no
    permission). Callers omit the series instead of inventing a value.

    os.open/os.read rather than open(): a cycle reads a few hundred small files and the buffered
    text layer costs about twice as much per file."""
    return _read_path(path, read_fd)


def read_record(path: str) -> str | None:
    """`read_text` for a file the kernel writes in one piece (a procfs single_open file such as
    /proc/PID/task/TID/stat, a sysfs attribute): one read instead of two. Not for files listed
    record by record (/proc/net/tcp, task/TID/children), which a read returns a page at a time."""
    return _read_path(path, read_fd_record)


def _read_path(path: str, read: Callable[[int], str]) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return read(fd)
    except OSError:
        # /proc files of a dying task can fail with ESRCH or EIO mid-read.
        return None
    finally:
        os.close(fd)


def read_fd(fd: int) -> str:
    """The whole text behind an open fd, read from offset 0 whatever its position (so a held fd
    can be read again); raises OSError."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, _READ_CHUNK, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def read_fd_record(fd: int) -> str:
    """`read_fd` for a file the kernel writes in one piece: such a file comes whole from one read,
    so a read shorter than asked is all of it; only a longer one (/proc/stat of a host with
    thousands of CPUs and interrupts) needs the reads that follow."""
    data = os.pread(fd, _READ_CHUNK, 0)
    if len(data) < _READ_CHUNK:
        return data.decode("utf-8", errors="replace")
    return read_fd(fd)


def read_prefix(path: str, max_bytes: int) -> bytes | None:
    """At most the first `max_bytes` of a file, None when it is absent or unreadable. For the
    files whose size another process decides (its command line: Linux allows about 2 MiB, and
    more through prctl), which are never read whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    chunks = []
    size = 0
    try:
        while size < max_bytes:
            chunk = os.pread(fd, min(max_bytes - size, _READ_CHUNK), size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None  # the task ended mid-read
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_bounded(path: str, max_bytes: int) -> str | None:
    """The whole text of a file of at most `max_bytes`; None when absent, unreadable or longer."""
    data = read_prefix(path, max_bytes + 1)
    if data is None or len(data) > max_bytes:
        return None
    return data.decode("utf-8", errors="replace")


def read_link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def list_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


@dataclass(frozen=True, slots=True)
class CpuTicks:
    """Cumulative clock ticks of one CPU line: busy (everything but idle and iowait) and total."""

    busy: int
    total: int


def parse_stat_cpus(text: str) -> dict[str, CpuTicks]:
    """/proc/stat -> {"all": ..., "0": ..., "1": ...}. Offline CPUs have no line and are absent.

    Runs every cycle over one line per CPU (a GPU server has a few hundred), so it stops at the
    end of the cpu lines instead of splitting the long intr line that follows them."""
    cpus: dict[str, CpuTicks] = {}
    for line in text.split("\n"):
        if not line.startswith("cpu"):
            if cpus:
                break  # the cpu lines come first and together
            continue
        parts = line.split(None, _FIELDS_USED + 1)
        name = parts[0][3:] or "all"
        values = list(map(int, parts[1 : 1 + _FIELDS_USED]))  # map: half the cost of a comprehension
        total = sum(values)
        idle = sum(values[_IDLE_START:_IDLE_END])
        cpus[name] = CpuTicks(busy=total - idle, total=total)
    return cpus


def busy_ratios(previous: dict[str, CpuTicks], current: dict[str, CpuTicks]) -> dict[str, float]:
    """Busy fraction of each CPU between two /proc/stat reads. A CPU missing from either read,
    with no ticks elapsed, or whose counters went backwards (hotplug) is left out."""
    ratios: dict[str, float] = {}
    for cpu, now in current.items():
        before = previous.get(cpu)
        if before is None:
            continue
        d_total = now.total - before.total
        d_busy = now.busy - before.busy
        if d_total <= 0 or d_busy < 0:
            continue
        ratios[cpu] = min(1.0, d_busy / d_total)
    return ratios


def parse_loadavg(text: str) -> tuple[float, float, float]:
    parts = text.split()
    return float(parts[0]), float(parts[1]), float(parts[2])


def parse_uptime(text: str) -> float:
    return float(text.split()[0])


def parse_meminfo(text: str, wanted: Collection[str] | None = None) -> dict[str, int]:
    """/proc/meminfo or a sysfs node*/meminfo ("Node 0 MemFree: 123 kB") -> {key: bytes}.

    With `wanted`, only those keys, and parsing stops once all are found: the host source reads
    the first three of some fifty lines every cycle."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        key = key.split()[-1]  # drops the "Node N" prefix of the per-node files
        if wanted is not None and key not in wanted:
            continue
        fields = rest.split()
        if not fields:
            continue
        value = int(fields[0])
        if len(fields) > 1 and fields[1] == "kB":
            value *= 1024
        out[key] = value
        if wanted is not None and len(out) == len(wanted):
            break
    return out


@dataclass(frozen=True, slots=True)
class Pressure:
    """The "some" line of a /proc/pressure file: share of wall time in which at least one task
    was stalled on the resource, as ratios, and the cumulative stall time in seconds."""

    avg10: float
    avg60: float
    avg300: float
    total_seconds: float


def parse_pressure(text: str) -> Pressure | None:
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] != "some":
            continue
        fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        return Pressure(
            avg10=float(fields["avg10"]) / 100.0,
            avg60=float(fields["avg60"]) / 100.0,
            avg300=float(fields["avg300"]) / 100.0,
            total_seconds=int(fields["total"]) / 1e6,  # microseconds in the kernel
        )
    return None


def parse_cpulist(text: str) -> frozenset[int]:
    """Kernel cpulist format ("0-3,8-11", "0,2,4-6", empty) -> set of CPU numbers."""
    cpus: set[int] = set()
    for chunk in text.strip().split(","):
        chunk = chunk.strip()
        if not chunk:
            continue
        lo, sep, hi = chunk.partition("-")
        if sep:
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(lo))
    return frozenset(cpus)


@dataclass(frozen=True, slots=True)
class PidStat:
    """The fields of /proc/PID/stat (or task/TID/stat) the host source uses; times in ticks."""

    comm: str
    ppid: int
    utime: int
    stime: int
    starttime: int


def parse_pid_stat(text: str) -> PidStat:
    # comm sits in parentheses and may itself contain spaces and ')', so split at the last one.
    head, _, tail = text.rpartition(")")
    comm = head.partition("(")[2]
    fields = tail.split()
    # fields[0] is field 3 (state) of proc(5); utime is field 14, stime 15, starttime 22.
    return PidStat(
        comm=comm,
        ppid=int(fields[1]),
        utime=int(fields[11]),
        stime=int(fields[12]),
        starttime=int(fields[19]),
    )


def parse_thread_ticks(text: str) -> tuple[int, int]:
    """/proc/PID/task/TID/stat -> (utime + stime, starttime), the fields `parse_pid_stat` gives,
    without building a PidStat: the thread scan parses one per thread of the engine's tree."""
    fields = text[text.rindex(")") + 1 :].split(None, 21)
    return int(fields[11]) + int(fields[12]), int(fields[19])


@dataclass(frozen=True, slots=True)
class PidStatus:
    threads: int | None
    rss_bytes: int | None
    cpus_allowed: frozenset[int] | None


def parse_pid_status(text: str) -> PidStatus:
    # Looks the three keys up instead of splitting some fifty lines: this runs every cycle for
    # every process of the engine's tree.
    threads = _status_field(text, "Threads")
    rss = _status_field(text, "VmRSS")
    allowed = _status_field(text, "Cpus_allowed_list")
    # Kernel threads and zombies have no VmRSS line: that is "unknown", not zero.
    return PidStatus(
        threads=int(threads) if threads is not None else None,
        rss_bytes=int(rss.split()[0]) * 1024 if rss is not None else None,
        cpus_allowed=parse_cpulist(allowed) if allowed is not None else None,
    )


def _status_field(text: str, key: str) -> str | None:
    """The value of the "key:" line of a /proc/PID/status text, None when there is no such line."""
    label = key + ":"
    if text.startswith(label):
        start = len(label)
    else:
        at = text.find("\n" + label)
        if at < 0:
            return None
        start = at + 1 + len(label)
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]


_TCP_LISTEN = "0A"


def parse_listening_inodes(text: str, port: int) -> set[int]:
    """Socket inodes listening on `port` in a /proc/net/tcp or tcp6 table (any local address)."""
    inodes: set[int] = set()
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[3] != _TCP_LISTEN:
            continue
        local_port = int(parts[1].rpartition(":")[2], 16)
        inode = int(parts[9])
        if local_port == port and inode:
            inodes.add(inode)
    return inodes


def socket_inode(link_target: str) -> int | None:
    """"socket:[12345]" (an fd's readlink) -> 12345."""
    if link_target.startswith("socket:[") and link_target.endswith("]"):
        return int(link_target[8:-1])
    return None
