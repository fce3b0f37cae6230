"""Real routers for the tests: vllm-router and sglang-router (the SGLang model gateway), pinned, in one
venv of the engine cache (tests/live/engines.py: version-keyed, outside the checkout), started in front
of backends on loopback.

    python -m tests.routers install      # no-op when cached (make test runs it)

Both are Rust binaries in a wheel: they start in under a second on CPU and route to any
OpenAI-compatible backend (the twin's API, a live engine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence

from tests.live.engines import (
    SMALL_TIMEOUT_S,
    InstallError,
    _fresh,
    _installed,
    _locked,
    _run,
    _size_bytes,
    _tail,
    _write_stamp,
    cache_root,
)

VLLM_ROUTER = ("vllm-router", "0.1.17")
SGLANG_ROUTER = ("sglang-router", "0.3.2")
RECIPE = 1
KEY = f"routers-{VLLM_ROUTER[0]}-{VLLM_ROUTER[1]}-{SGLANG_ROUTER[0]}-{SGLANG_ROUTER[1]}"
READY_TIMEOUT_S = 30.0


def folder() -> pathlib.Path:
    return cache_root() / KEY


def binary(kind: str) -> pathlib.Path:
    return folder() / "venv" / "bin" / kind


def install(*, log=print) -> dict:
    where = folder()
    with _locked(KEY):
        if (stamp := _installed(where, RECIPE)) is not None:
            return stamp
        t0 = time.monotonic()
        _fresh(where)
        logfile = where / "install.log"
        venv = where / "venv"
        py = venv / "bin" / "python"
        log(f"routers: installing {KEY} into {where} (log: {logfile})")
        _run([sys.executable, "-m", "venv", venv], log=logfile, timeout=SMALL_TIMEOUT_S, step="python -m venv")
        _run([py, "-m", "pip", "install", "-q", "--progress-bar", "off", f"{VLLM_ROUTER[0]}=={VLLM_ROUTER[1]}",
              f"{SGLANG_ROUTER[0]}=={SGLANG_ROUTER[1]}"], log=logfile, timeout=900, step="pip install routers")
        for kind in (VLLM_ROUTER[0], SGLANG_ROUTER[0]):
            _run([venv / "bin" / kind, "--help"], log=logfile, timeout=SMALL_TIMEOUT_S, step=f"{kind} --help")
        stamp = {"key": KEY, "recipe": RECIPE, "install_seconds": round(time.monotonic() - t0, 1),
                 "size_bytes": _size_bytes(where), "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write_stamp(where, stamp)
        log(f"routers: installed in {stamp['install_seconds']}s")
        return stamp


@dataclasses.dataclass
class Router:
    """A started router; a context manager that stops it."""

    kind: str
    port: int
    metrics_port: int
    process: subprocess.Popen
    log_path: pathlib.Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def page(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def log_tail(self) -> str:
        return _tail(self.log_path)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# What the tests pass to both routers: fast detection (the defaults wait tens of seconds), the policy.
FAST_DETECTION = ("--health-check-interval-secs", "1", "--health-failure-threshold", "2",
                  "--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "30",
                  "--retry-max-retries", "2", "--retry-initial-backoff-ms", "20")


def start(kind: str, workers: Sequence[str], *, port: int, metrics_port: int, policy: str,
          log_dir: pathlib.Path, extra: Sequence[str] = FAST_DETECTION) -> Router:
    """Start `kind` (vllm-router | sglang-router) routing to `workers` (base URLs) and wait until its
    metrics page answers and names every worker."""
    cmd = [str(binary(kind))]
    if kind == SGLANG_ROUTER[0]:
        cmd.append("launch")
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), *extra]
    log_path = log_dir / f"{kind}-{port}.log"
    out = open(log_path, "w")  # noqa: SIM115 - the child writes it for its whole life
    process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    router = Router(kind, port, metrics_port, process, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{kind} exited {process.returncode}:\n{router.log_tail()}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{router.url}/v1/models", timeout=2).read()
            return router
        time.sleep(0.2)
    router.stop()
    raise RuntimeError(f"{kind} not ready in {READY_TIMEOUT_S:.0f}s:\n{router.log_tail()}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["install"]:
        print("usage: python -m tests.routers install", file=sys.stderr)
        return 2
    try:
        print(json.dumps(install(), indent=2))
    except InstallError as error:
        print(f"install failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


ROUTING_ROW: dict[str, str] = {
    "Share of each router's requests per backend": "A", "Load skew per router": "A", "Backends taken out": "AB",
    "Router latency and time before the engine": "ABCDE", "Breakers open and backends unhealthy": "AB",
    "Retries and errors per router": "AB",
}
"""The fleet board's routing row (panel title -> refIds): empty where no router is read (the demo, the
fleet tier); tests/test_routers_live.py runs every query on real routers."""
NO_ROUTER = ("no router in front of the demo's engines: tests/test_routers_live.py runs this row's queries on "
             "real vllm-router and sglang-router pages")
