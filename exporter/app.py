"""Assemble sources, collector and server from a Config and run them until stopped.

`serve` is the one entry point for the CLI and for tests that run the exporter in-process
(nvidia_gpu_exporter's app.Run)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence

import uvicorn

from exporter.collect import Collector
from exporter.config import Config, ConfigError
from exporter.derive import build_deriver
from exporter.server import RequestGuard, create_app
from exporter.snapshot import Sample
from exporter.sources.base import Source
from exporter.sources.engines.scrape import EngineSource
from exporter.webconfig import REALM, WebConfigManager

log = logging.getLogger("llm_exporter")

# Every cycle builds a few thousand short-lived tuples (samples, label sets) and drops the last
# cycle's. With CPython's default young-generation threshold (700) that triggers several young
# and old collections per second, and a full collection of the long-lived caches every few
# seconds (tens of ms, holding the GIL while /metrics waits). Refcounting frees nearly all of it;
# the collector only has to find the rare cycle, so it runs after this many net new containers.
GC_YOUNG_THRESHOLD = 10_000


class _Server(uvicorn.Server):
    """uvicorn's main loop wakes 10 times a second to refresh the Date header and check for exit:
    about 3 ms of CPU per second here, a sixth of this process's budget. Once a second is enough
    for a header with one-second resolution; `stop()` ends the loop at once."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit_requested = asyncio.Event()

    async def main_loop(self) -> None:
        while not await self.on_tick(0):  # counter 0: refresh the Date header on every tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), 1.0)

    def stop(self) -> None:
        self.should_exit = True
        self._exit_requested.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # serve() owns SIGINT/SIGTERM (loop signal handlers that set its stop event); uvicorn's
        # own capture would replace them for the life of the server and raise them again after.
        yield


def tune_gc() -> None:
    """For a process that is only the exporter: fewer, cheaper garbage collections (see above)."""
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


async def _freeze_after_first_cycle(collector: Collector) -> None:
    # Modules, the catalogue and the caches built by the first cycle live for the whole process:
    # moved out of the collector's view, full collections only walk what changes.
    await collector.wait_ready(timeout=3600)
    gc.collect()
    gc.freeze()


def build_sources(config: Config, *, gpu_source: Source | None = None) -> list[Source]:
    """Engine targets, then the host and GPU sources the config asks for."""
    sources: list[Source] = [
        EngineSource(t, max_payload_bytes=config.max_payload_bytes, max_series=config.max_series_per_target)
        for t in config.engines
    ]
    host = _host_source(config) if config.host_enabled else None
    if host is not None:
        sources.append(host)
    gpu = gpu_source if gpu_source is not None else _gpu_source(config, host)
    if gpu is not None:
        sources.append(gpu)
    return sources


def _host_source(config: Config) -> Source:
    from exporter.sources.host import HostOptions, HostSource

    return HostSource(HostOptions(
        proc_root=config.proc_root,
        sys_root=config.sys_root,
        engine_port=_engine_port(config),
        engine_pidfile=config.engine_pidfile,
        engine_process_name=config.engine_process_name,
    ))


def _engine_port(config: Config) -> int | None:
    """As a sidecar the engine usually listens on loopback in the same pod: when no selector is
    configured, find the engine process by the port of the first loopback target."""
    if config.engine_port or config.engine_pidfile or config.engine_process_name:
        return config.engine_port
    for target in config.engines:
        parts = urllib.parse.urlsplit(target.url)
        if parts.hostname in ("127.0.0.1", "localhost", "::1"):
            return parts.port or (443 if parts.scheme == "https" else 80)
    return None


def _gpu_source(config: Config, host: Source | None) -> Source | None:
    if config.gpu_backend == "none":
        return None
    if config.gpu_backend == "sim":
        if not config.sim_url:
            raise ConfigError("gpu_backend", "sim", "needs sim_url (the twin's URL) outside `llm-exporter demo`")
        from exporter.sources.gpu.sim import SimGpuSource

        return SimGpuSource(config.sim_url)
    from exporter.sources.gpu.nvml import NvmlOptions, NvmlSource

    # Without an engine selector the host source finds no pids; NVML then sums all processes.
    selected = _engine_port(config) or config.engine_pidfile or config.engine_process_name
    engine_pids = getattr(host, "engine_pids", None) if selected else None
    return NvmlSource(NvmlOptions(required=config.gpu_backend == "nvml", engine_pids=engine_pids))


def bind_listener(config: Config) -> socket.socket:
    """Bind before anything starts so a port in use is a config error (exit 2), not a crash later."""
    family = socket.AF_INET6 if ":" in config.listen_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.listen_host, config.listen_port))
    except OSError as error:
        sock.close()
        raise ConfigError("listen", config.listen, error.strerror or str(error)) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def make_collector(config: Config, sources: Sequence[Source], *,
                   extra_health: Callable[[], Iterable[Sample]] | None = None) -> Collector:
    timeouts = {s.name: s.target.timeout_s for s in sources if isinstance(s, EngineSource)}
    return Collector(sources, interval_s=config.interval_s, timeouts=timeouts, derive=build_deriver(config),
                     extra_health=extra_health)


def load_web_config(config: Config) -> WebConfigManager | None:
    """Parse --web.config.file once at start; a bad file raises ConfigError (exit 2)."""
    return WebConfigManager(config.web_config_file) if config.web_config_file else None


async def serve(config: Config, sources: Sequence[Source], sock: socket.socket,
                stop: asyncio.Event | None = None, web: WebConfigManager | None = None,
                own_process: bool = False) -> None:
    """Run the collection loop and the HTTP server until `stop` is set or SIGINT/SIGTERM.
    `web`: the already loaded --web.config.file (loaded here from config when not given).
    `own_process`: the process is only this exporter (the CLI), so its GC may be tuned."""
    stop = stop or asyncio.Event()
    web = web if web is not None else load_web_config(config)
    collector = make_collector(config, sources, extra_health=web.samples if web else None)
    app = RequestGuard(create_app(collector, max_concurrent_scrapes=config.max_concurrent_scrapes),
                       authorize=web.authorize if web else None, realm=REALM)
    ssl_context = web.server_ssl_context() if web else None
    # http="h11": its max_incomplete_event_size is what caps the request line plus headers (16 KiB);
    # httptools, if it were installed, would ignore the cap. No websockets: no endpoint needs one.
    server = _Server(uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", http="h11", ws="none",
        limit_concurrency=256, timeout_keep_alive=30, h11_max_incomplete_event_size=16384,
        ssl_context_factory=(lambda _config, _default: ssl_context) if ssl_context else None))
    loop = asyncio.get_running_loop()
    # Signal handlers can only be installed from the main thread; when serve() runs on another
    # thread (tests run the exporter in-process), the caller sets `stop` instead.
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    collect_task = asyncio.create_task(collector.run_forever(), name="collect")
    server_task = asyncio.create_task(server.serve(sockets=[sock]), name="http")
    watch_task = asyncio.create_task(web.watch(), name="web-config") if web else None
    freeze_task = asyncio.create_task(_freeze_after_first_cycle(collector)) if own_process else None
    log.info("listening on %s (%s%s), %d source(s), interval %gs", config.listen,
             "https" if ssl_context else "http", ", basic auth" if web and web.auth_enabled else "",
             len(sources), config.interval_s)
    stop_task = asyncio.create_task(stop.wait())
    await asyncio.wait({collect_task, server_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    server.stop()
    collect_task.cancel()
    for side_task in (watch_task, freeze_task):
        if side_task is not None:
            side_task.cancel()
    for task in (collect_task, server_task):
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, timeout=5)
    stop_task.cancel()
    await collector.close()
    for task in (collect_task, server_task):
        if task.done() and not task.cancelled() and task.exception():
            raise task.exception()
