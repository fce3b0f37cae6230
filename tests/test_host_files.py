"""Host source on this machine's real /proc: the fds it keeps open between cycles (re-read fresh,
bounded, closed when their process goes, never held for regular files) and an engine that
restarts under a new pid."""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib
import subprocess
import threading
import time

import pytest

from exporter.sources import host_engine
from exporter.sources.host import HostOptions, HostSource
from exporter.sources.host_engine import BUSIEST_THREAD_WINDOW_S
from exporter.sources.host_files import MAX_HELD_FILES, MAX_HELD_THREAD_FILES, HeldFiles


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def sleeper():
    """Starts `sleep` processes, stand-ins for an engine; kills what is left at the end."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "60"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


class SteppedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- HeldFiles -------------------------------------------------------------------------------


def test_held_procfs_file_is_read_afresh() -> None:
    files = HeldFiles()
    first = files.read("/proc/uptime")
    assert first is not None and files.held == {"/proc/uptime"}
    time.sleep(0.05)  # /proc/uptime counts in 10 ms steps
    second = files.read("/proc/uptime")
    assert second is not None and second != first
    assert float(second.split()[0]) > float(first.split()[0])
    files.close()


def test_regular_files_are_never_held(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "loadavg"
    path.write_text("1.0 2.0 3.0 1/2 3\n")
    files = HeldFiles()
    assert files.read(str(path)) == "1.0 2.0 3.0 1/2 3\n"
    assert files.held == frozenset()
    # Replaced under its path (a new inode): a held fd would go on reading the old file.
    path.unlink()
    path.write_text("4.0 5.0 6.0 1/2 3\n")
    assert files.read(str(path)) == "4.0 5.0 6.0 1/2 3\n"
    path.unlink()
    assert files.read(str(path)) is None


def test_missing_file_is_none_and_not_held() -> None:
    files = HeldFiles()
    assert files.read("/proc/no-such-file") is None
    assert files.held == frozenset()


def test_held_files_are_bounded_and_the_rest_still_read() -> None:
    files = HeldFiles(limit=2)
    texts = [files.read(p) for p in ("/proc/uptime", "/proc/loadavg", "/proc/meminfo")]
    assert all(t for t in texts)
    assert files.held == {"/proc/uptime", "/proc/loadavg"}
    assert "MemTotal" in (files.read("/proc/meminfo") or "")
    files.close()


def test_files_not_read_since_the_last_sweep_are_closed() -> None:
    before = open_fds()
    files = HeldFiles()
    files.read("/proc/uptime")
    files.read("/proc/loadavg")
    assert open_fds() == before + 2
    files.close_unread()  # both were read: both stay
    files.read("/proc/uptime")
    files.close_unread()
    assert files.held == {"/proc/uptime"}
    assert open_fds() == before + 1
    files.close()
    assert files.held == frozenset() and open_fds() == before


def _fds_on(*paths: str) -> int:
    """Open fds of this process on these files: other tests' threads may open and close sockets
    meanwhile, so a plain count of /proc/self/fd is not what this test is about."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own fd among them)
            count += os.readlink(f"/proc/self/fd/{fd}") in paths
    return count


def test_dropped_holder_closes_its_fds() -> None:
    paths = ("/proc/uptime", "/proc/loadavg")
    before = _fds_on(*paths)
    files = HeldFiles()
    files.read("/proc/uptime")
    files.read("/proc/loadavg")
    assert _fds_on(*paths) == before + 2
    del files
    gc.collect()
    assert _fds_on(*paths) == before


def test_file_of_a_process_that_exited_reads_none_and_is_closed(sleeper) -> None:
    proc = sleeper()
    path = f"/proc/{proc.pid}/stat"
    files = HeldFiles()
    assert (files.read(path) or "").startswith(f"{proc.pid} (sleep)")
    assert path in files.held
    proc.kill()
    proc.wait()  # reaped: the held fd now reads ESRCH
    assert files.read(path) is None
    assert files.held == frozenset()


# --- the host source -------------------------------------------------------------------------


def test_engine_restarted_under_a_new_pid(tmp_path: pathlib.Path, sleeper) -> None:
    pidfile = tmp_path / "engine.pid"
    first = sleeper()
    pidfile.write_text(f"{first.pid}\n")
    clock = SteppedClock()
    source = HostSource(HostOptions(engine_pidfile=str(pidfile)), clock=clock)
    data = source.collect_sync()
    assert source.engine_pids() == {first.pid}
    assert {f"/proc/{first.pid}/stat", f"/proc/{first.pid}/status"} <= source.held_files
    assert f"/proc/{first.pid}/task/{first.pid}/stat" in source.held_files  # the thread window's

    # The engine restarts: the old process is gone and the pid file names a new one.
    first.kill()
    first.wait()
    second = sleeper()
    pidfile.write_text(f"{second.pid}\n")
    clock.now += 1
    data = source.collect_sync()
    assert {s.name: s.value for s in data.samples}["llm_engine_process_found"] == 1
    assert source.engine_pids() == {second.pid}
    assert not [p for p in source.held_files if p.startswith(f"/proc/{first.pid}/")]
    assert f"/proc/{second.pid}/stat" in source.held_files
    # A new process opens a new window: no ratio until it closes.
    assert "llm_engine_process_busiest_thread_cpu_ratio" not in {s.name for s in data.samples}
    clock.now += BUSIEST_THREAD_WINDOW_S
    time.sleep(0.05)  # the ratio's time base is /proc/uptime, in 10 ms steps
    data = source.collect_sync()
    assert "llm_engine_process_busiest_thread_cpu_ratio" in {s.name for s in data.samples}

    # The engine stops and nothing replaces it.
    second.kill()
    second.wait()
    clock.now += 1
    data = source.collect_sync()
    assert {s.name: s.value for s in data.samples}["llm_engine_process_found"] == 0
    assert not [p for p in source.held_files if p.startswith(f"/proc/{second.pid}/")]
    source.close_sync()


def test_fds_stay_bounded_over_many_cycles(tmp_path: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setattr(host_engine, "MAX_HELD_THREAD_FILES", 4)
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, daemon=True) for _ in range(16)]
    for w in workers:
        w.start()
    pidfile = tmp_path / "self.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    before = open_fds()
    try:
        clock = SteppedClock()
        source = HostSource(HostOptions(engine_pidfile=str(pidfile)), clock=clock)
        for _ in range(12):
            source.collect_sync()
            clock.now += 1
            assert open_fds() - before == len(source.held_files) <= MAX_HELD_FILES + 4
        # Only 4 thread stats are held, but the window still reads every thread.
        assert len(source.engine.held_files) == 4
        assert len(source.engine.tracked_threads) >= 17
        source.close_sync()
        assert source.held_files == frozenset() and open_fds() == before
        source.collect_sync()  # a closed source opens its files again
        assert "/proc/stat" in source.held_files
        source.close_sync()
    finally:
        stop.set()
        for w in workers:
            w.join()


def test_bounds_leave_room_under_the_usual_fd_limit() -> None:
    assert MAX_HELD_FILES + MAX_HELD_THREAD_FILES <= 256
