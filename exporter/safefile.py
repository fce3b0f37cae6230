"""Reading the files a configuration names (--config, --web.config.file and the certificates it
names, engine token, password and CA files, the engine pidfile) so that none of them can block.

Any such path can turn into something that is not a file: a mounted secret is swapped through a
symlink, and the new target can be a FIFO (open() waits for a writer that never comes, on the
event loop that stops every endpoint, in a reload that never ends and that shutdown waits for), a
device (endless bytes), a directory or a socket. So a file is opened with O_NONBLOCK (opening a
FIFO then returns at once), the *opened* descriptor is fstat'ed and refused unless it is a regular
file (a stat before the open would race the swap), and at most `max_bytes` + 1 bytes are read.

A hung network or FUSE mount can still stall open() or read() themselves. For that, callers run
the reading in a daemon thread through `Detached` and give up after a timeout: the thread is a
daemon, so a read that never returns holds neither the event loop nor the process at exit, and
one Detached runs one call at a time, so a stuck mount costs one thread, not one per retry.

A leaf: imports nothing from exporter/."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

READ_TIMEOUT_S = 10.0  # a config or secret file takes milliseconds; a hung mount never answers
# At start the same deadline covers imports and validation too, on a node that may be busy
# starting the engine: generous, since overrunning it means exit 2.
STARTUP_TIMEOUT_S = 30.0
MAX_PEM_BYTES = 4 << 20  # a CA bundle (certifi's is 0.3 MB), certificate chain or key

T = TypeVar("T")

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


class FileReadError(OSError):
    """A file refused or not read in time, in one line without its contents (the caller adds the
    path). An OSError, so every caller that handles a missing file handles this too."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def read_regular_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed); FileReadError when it is not a
    regular file or is over `max_bytes`, OSError when it cannot be opened or read."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise FileReadError(f"not a regular file ({kind}); only regular files are read")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise FileReadError(f"larger than {max_bytes} bytes, not read")
    return b"".join(chunks)


def read_pem_file(path: str | os.PathLike[str]) -> str:
    """A PEM file as SSLContext's `cadata` takes it (ASCII only): its ASCII lines. Bundles such as
    certifi's carry UTF-8 in comment lines outside the certificates; those lines are dropped."""
    text = read_regular_file(path, MAX_PEM_BYTES).decode("utf-8", "replace")
    pem = "\n".join(line for line in text.splitlines() if line.isascii())
    if "-----BEGIN " not in pem:  # an empty cadata would mean "no CA given": the system store
        raise FileReadError("no PEM data (-----BEGIN ...) in it")
    return pem


class Detached(Generic[T]):
    """Runs a call in a daemon thread and waits for it at most `timeout_s` from its start. One
    call at a time: asked again while the last one runs, it waits for that one (and its result
    stands for both) rather than starting another, only as long as is left of the first one's
    time, so once a call has overrun, every later ask fails at once until the call returns.
    `call` waits in the caller's thread (start-up), `acall` on the event loop."""

    def __init__(self, what: str, timeout_s: float = READ_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what  # the thread's name, and what the timeout message says was not read
        self.timeout_s = timeout_s
        self._clock = clock
        self._future: concurrent.futures.Future[T] | None = None
        self._started = 0.0

    @property
    def running(self) -> bool:
        return self._future is not None and not self._future.done()

    def _start(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        if self._future is not None and not self._future.done():
            return self._future
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result = fn()
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(error)
            else:
                future.set_result(result)

        self._future, self._started = future, self._clock()
        threading.Thread(target=run, name=self.what, daemon=True).start()
        return future

    def _late(self) -> FileReadError:
        # The same words every time: a caller that logs one line per distinct failure logs one.
        return FileReadError(f"{self.what}: not read within {self.timeout_s:g}s (a hung network or FUSE mount?); "
                             "retried once that read returns")

    def _left(self) -> float:
        return max(0.0, self._started + self.timeout_s - self._clock())

    def call(self, fn: Callable[[], T]) -> T:
        future = self._start(fn)
        try:
            return future.result(timeout=self._left())
        except concurrent.futures.TimeoutError:
            raise self._late() from None

    async def acall(self, fn: Callable[[], T]) -> T:
        future = self._start(fn)
        # Shielded: a caller that is cancelled (a scrape timeout, shutdown) leaves the read to
        # finish on its own; the next ask waits for it instead of starting a second one.
        waiter = asyncio.shield(asyncio.wrap_future(future))
        if future.done():
            return await waiter
        try:
            return await asyncio.wait_for(waiter, self._left())
        except TimeoutError:
            raise self._late() from None
