"""Assemble sources, collector and server from a Config and run them until stopped.

`serve` is the one entry point for the CLI and for tests that run the exporter in-process
(nvidia_gpu_exporter's app.Run)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from exporter import collectors
from exporter.buckets import Rebucketer
from exporter.catalog import profiles
from exporter.collect import MANY_TARGETS, MAX_SCRAPES_IN_FLIGHT, Collector
from exporter.config import Config, ConfigError
from exporter.derive import build_deriver
from exporter.endpoints import RequestGuard, create_app
from exporter.httpserver import LISTEN_BACKLOG, HttpServer, Limits
from exporter.safefile import STARTUP_TIMEOUT_S, Detached, FileReadError
from exporter.snapshot import Sample
from exporter.sources.base import Source
from exporter.targets import EngineTarget, ProbeTarget
from exporter.webconfig import REALM, WebConfigManager

log = logging.getLogger("llm_exporter")

# Every cycle builds a few thousand short-lived tuples (samples, label sets) and drops the last
# cycle's. With CPython's default young-generation threshold (700) that triggers several young
# and old collections per second, and a full collection of the long-lived caches every few
# seconds (tens of ms, holding the GIL while /metrics waits). Refcounting frees nearly all of it;
# the collector only has to find the rare cycle, so it runs after this many net new containers.
GC_YOUNG_THRESHOLD = 10_000


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
    """The sources of every enabled collector (exporter/collectors.py REGISTRY), in its order: the
    engine targets, their client-side probes (--probe), the host, the GPUs. `gpu_source` replaces
    the GPU collector's factory (the demo's simulated GPUs, a fake NVML), when that collector is on."""
    built = collectors.build(config, given={"gpu": [gpu_source]} if gpu_source is not None else None)
    return [source for sources in built.values() for source in sources]


def bind_listener(config: Config) -> socket.socket:
    """Bind before anything starts so a port in use is a config error (exit 2), not a crash later."""
    family = socket.AF_INET6 if ":" in config.listen_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.listen_host, config.listen_port))
    except OSError as error:
        sock.close()
        why = error.strerror or str(error)
        if error.errno == errno.EADDRINUSE:
            why += (" (another exporter or demo listens there: stop it or give --listen another port; a running "
                    "demo switches scenario with the curl line it printed)")
        raise ConfigError("listen", config.listen, why) from None
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


FROM_CONFIG: Literal["config"] = "config"
"""make_collector/serve/run_demo: work out the written families from the Config (a caller that
already did, to fail the start early, passes its result instead: the families file is read once)."""


def make_collector(config: Config, sources: Sequence[Source], *,
                   extra_health: Callable[[], Iterable[Sample]] | None = None,
                   families: profiles.Selection | None | Literal["config"] = FROM_CONFIG) -> Collector:
    return Collector(sources, interval_s=config.interval_s, derive=build_deriver(config), extra_health=extra_health,
                     collectors=collectors.BY_KIND,
                     families=written_families(config) if families == FROM_CONFIG else families,
                     buckets=Rebucketer.from_config(config))


def written_families(config: Config) -> profiles.Selection | None:
    """The families /metrics writes: --families FILE, else --profile (None: every family, `full`).
    A file that cannot be read or names an unknown family is a ConfigError (exit 2)."""
    path = config.families_file
    if path:
        try:
            chosen = Detached[profiles.Selection]("families files", STARTUP_TIMEOUT_S).call(
                lambda: profiles.read_families_file(path))
        except (FileReadError, profiles.FamiliesFileError) as error:
            raise ConfigError("families_file", path, str(error)) from None
    else:
        chosen = profiles.selection(config.profile)
    if config.histogram_buckets == "slo":
        # Prometheus scrapes the engine's own histograms too: of the re-exported ones only what the SLO
        # burn-rate rules read stays (exporter/buckets.py cuts those to the threshold's bucket).
        return {name: only for name, only in chosen.items() if name not in profiles.ENGINE_HISTOGRAMS_NOT_SLO}
    return None if config.profile == "full" and not path else chosen


def load_web_config(config: Config) -> WebConfigManager | None:
    """Parse --web.config.file once at start; a bad file raises ConfigError (exit 2), and so does
    one that cannot be read in time (a hung mount): the process must not hang before it listens."""
    path = config.web_config_file
    if not path:
        return None
    try:
        return Detached[WebConfigManager]("web config files", STARTUP_TIMEOUT_S).call(lambda: WebConfigManager(path))
    except FileReadError as error:
        raise ConfigError("web_config_file", path, str(error)) from None


async def serve(config: Config, sources: Sequence[Source], sock: socket.socket,
                stop: asyncio.Event | None = None, web: WebConfigManager | None = None,
                own_process: bool = False, http_limits: Limits | None = None,
                families: profiles.Selection | None | Literal["config"] = FROM_CONFIG) -> None:
    """Run the collection loop and the HTTP server until `stop` is set or SIGINT/SIGTERM.
    `web`: the already loaded --web.config.file (loaded here from config when not given).
    `families`: what /metrics writes, as written_families gave it (worked out here when not given).
    `own_process`: the process is only this exporter (the CLI), so its GC may be tuned.
    `http_limits`: connection bounds and timeouts (default: exporter/httpserver.py's constants)."""
    stop = stop or asyncio.Event()
    web = web if web is not None else load_web_config(config)
    parts: list[Callable[[], Iterable[Sample]]] = []  # the self-health of the parts outside the loop

    def extra_health() -> list[Sample]:
        return [sample for part in parts for sample in part()]

    collector = make_collector(config, sources, extra_health=extra_health, families=families)
    endpoint = create_app(collector, max_concurrent_scrapes=config.max_concurrent_scrapes)
    app = RequestGuard(endpoint, authorize=web.authorize if web else None, realm=REALM)
    ssl_context = web.server_ssl_context() if web else None
    server = HttpServer(app, ssl_context=ssl_context, limits=http_limits)
    parts += [server.samples, endpoint.samples, *([web.samples] if web else [])]
    loop = asyncio.get_running_loop()
    # Signal handlers can only be installed from the main thread; when serve() runs on another
    # thread (tests run the exporter in-process), the caller sets `stop` instead.
    side_tasks: set[asyncio.Task] = set()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        # Their default action ends the process; an operator's `kill -HUP` (the usual "reload")
        # or a stray USR1/USR2 must not take a sidecar down.
        loop.add_signal_handler(signal.SIGHUP, _on_sighup, web, side_tasks)
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            loop.add_signal_handler(signum, log.info, "%s received and ignored", signal.Signals(signum).name)
    await server.start(sock)
    collect_task = asyncio.create_task(collector.run_forever(), name="collect")
    watch_task = asyncio.create_task(web.watch(), name="web-config") if web else None
    freeze_task = asyncio.create_task(_freeze_after_first_cycle(collector)) if own_process else None
    log.info("listening on %s (%s%s), %d source(s) (collectors: %s), interval %gs", config.listen,
             "https" if ssl_context else "http", ", basic auth" if web and web.auth_enabled else "",
             len(sources), _collectors_words(config, sources), config.interval_s)
    if (targets := len(config.engines)) > MANY_TARGETS:
        log.warning("%d engine targets: an exporter is meant for one node's engines (a sidecar has 1-8). They are "
                    "scraped %d at a time; when a cycle takes longer than the %gs interval ticks are skipped and "
                    "llm_exporter_cycle_overruns_total counts them. Split the targets over several exporters",
                    targets, MAX_SCRAPES_IN_FLIGHT, config.interval_s)
    stop_task = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({collect_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        collect_task.cancel()
        for side_task in (watch_task, freeze_task, *side_tasks):
            if side_task is not None:
                side_task.cancel()
        await server.stop()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(collect_task, timeout=5)
        stop_task.cancel()
        await collector.close()
    error = collect_task.exception() if collect_task.done() and not collect_task.cancelled() else None
    if error is not None:
        raise error


def _collectors_words(config: Config, sources: Sequence[Source]) -> str:
    """`engine 2, probe 0, host 1, gpu off`: each collector's sources, or off (its switch)."""
    counts = {c.name: 0 for c in collectors.REGISTRY if c.enabled(config)}
    for source in sources:
        name = collectors.BY_KIND.get(source.kind)
        if name in counts:
            counts[name] += 1
    return ", ".join(f"{c.name} {counts[c.name]}" if c.name in counts else f"{c.name} off"
                     for c in collectors.REGISTRY)


def _on_sighup(web: WebConfigManager | None, tasks: set[asyncio.Task]) -> None:
    """SIGHUP: reload --web.config.file now (off the event loop) rather than at the next poll."""
    if web is None:
        log.info("SIGHUP received: no --web.config.file, nothing to reload")
        return
    task = asyncio.create_task(_reload_web(web), name="web-config-sighup")
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _reload_web(web: WebConfigManager) -> None:
    # reload() logs the one line: reloaded, refused (and why) or joined, each naming SIGHUP.
    try:
        await web.reload("SIGHUP")
    except Exception:  # noqa: BLE001 - a reload bug must not end the process
        log.exception("web config reload on SIGHUP failed")


DEMO_PROBE_TIMEOUT_S = 60.0
"""The demo probe's timeout: under kv-pressure and overload a request waits behind a deep queue, and
a probe that times out there records no latency at all (the panels would stay empty exactly when
they matter); `run --probe` keeps its 10 s default, where a timeout is the signal."""


def _gpus_words(twins: Sequence[Any]) -> str:
    """How many GPUs the twins simulate, as the GPU source exports them (a scenario may need more
    than --gpus: cross-node-tp runs two)."""
    counts = [t.twin.hw.tp * len(t.twin.gpu_models) for t in twins]  # TP GPUs per data-parallel rank
    each, total = set(counts), sum(counts)
    return f"{total}x" if len(twins) == 1 or len(each) != 1 else f"{total}x ({each.pop()} per instance)"


def _print_now(text: str) -> None:
    """The demo's banner and log lines reach a pipe as they happen, not at exit."""
    print(text, flush=True)


def switch_settle_s(config: Config) -> float:
    """Wall seconds a scenario switch needs at least, whatever the twin's speed: the exporter's rate
    window still holds the previous scenario for its length, then the verdict holds for its cycles;
    as many cycles again for scrapes and cycles that run late on a busy machine (measured: 17-19 s
    at the default 1 s interval, docs/simulator.md)."""
    from exporter.derive.settings import derive_settings

    settings = derive_settings(config)
    return settings.rate_window_s + (2 * settings.verdict_hold_cycles + 4) * config.interval_s


async def run_demo(config: Config, *, scenario: str, engines: int, gpus: int, engine_format: str, gpu_name: str,
                   model: str, seed: int = 0, speed: float = 1.0, numa_mismatch: bool = False,
                   stop: asyncio.Event | None = None,
                   announce: Callable[[str], None] = _print_now,
                   on_ready: Callable[[str, Sequence[str]], None] | None = None,
                   probe_every_s: float | None = None,
                   families: profiles.Selection | None | Literal["config"] = FROM_CONFIG) -> None:
    """`llm-exporter demo`: twins on loopback, the exporter scraping them over HTTP exactly as it
    scrapes a real engine, the simulated GPU source reading the twins, and the host source
    `config.host_backend` says: sim (the demo's default) reads the first twin's host over HTTP,
    as `run --host-backend sim --sim-url URL` does; procfs reads this machine. Runs until `stop`
    is set or SIGINT/SIGTERM. Assembled here, above the simulator, so the simulator never imports
    the exporter's app. `on_ready(exporter base URL, twin base URLs)` is called once both listen
    (`llm-exporter loadtest --demo` binds port 0 and learns the ports from it). `probe_every_s`:
    a client-side probe of each twin's OpenAI API at that period, as `run --probe` sends one."""
    from exporter.simulator.demo import announce_switches, start_twins
    from exporter.sources.gpu.sim import SimGpuSource

    sock = bind_listener(config)
    twins = await start_twins(scenario=scenario, engines=engines, gpus=gpus, engine_format=engine_format,
                              gpu_name=gpu_name, model=model, seed=seed, speed=speed, numa_mismatch=numa_mismatch)
    try:
        # Each target declares the model its twin serves, as a user of an engine whose page names
        # none (llama.cpp) does with `model=`; a page that names it wins.
        # and the role its twin plays in a prefill/decode pair, as a vLLM user does with `role=` (the
        # page does not say it).
        targets = tuple(EngineTarget(url=t.url + "/metrics", name=f"demo-{i}", kind=None, model=t.twin.model.name,
                                     timeout_s=config.engine_timeout_s, role=t.role if t.role != "both" else None)
                        for i, t in enumerate(twins))
        probes = config.probes or tuple(
            ProbeTarget(url=t.url, target=target.name, engine=target, every_s=probe_every_s,
                        timeout_s=DEMO_PROBE_TIMEOUT_S)
            for t, target in zip(twins, targets, strict=True)) if probe_every_s else config.probes
        config = dataclasses.replace(config, engines=targets, probes=probes, model=config.model or model,
                                     sim_url=twins[0].url if config.host_backend == "sim" else config.sim_url)
        sources = build_sources(config, gpu_source=SimGpuSource([t.twin for t in twins],
                                                                   retry_interval_s=config.gpu_retry_interval_s))
        # The bound port, not the configured one: port 0 means any free port.
        base = f"http://{'127.0.0.1' if config.listen_host in ('0.0.0.0', '') else config.listen_host}:" \
               f"{sock.getsockname()[1]}"
        announce(
            f"llm-exporter demo: {engines} {engine_format} "
            f"{'prefill/decode pair(s)' if twins[0].role != 'both' else 'twin(s)'} of {model} on "
            f"{_gpus_words(twins)} {gpu_name}, "
            f"scenario {scenario}, host {config.host_backend}\n"
            + (f"  GPU price     {config.gpu_price_per_hour:g} per GPU-hour, for the cost panels "
               "(--gpu-price-per-hour)\n" if config.gpu_price_per_hour is not None else "")
            + (f"  probe         every {probe_every_s:g}s to each twin's /v1/completions (llm_probe_*, the "
               "overview's Client probe row; --no-probe turns it off)\n" if probe_every_s else "")
            + f"  status page   {base}/\n  metrics       {base}/metrics\n"
            f"  diagnosis     {base}/api/v1/diagnosis\n"
            + (twins[0].twin.scenario.expect.lines(speed) if twins[0].twin.scenario.expect else "")
            + "".join(f"  twin {i}        {t.url}/metrics  "
                      + (f"({t.role} instance of a prefill/decode pair)\n" if t.role != "both" else
                         f"(switch: curl -X POST '{t.url}/sim/scenario?name=overload')\n") for i, t in enumerate(twins))
            + "Ctrl-C stops it."
        )
        for i, t in enumerate(twins):  # a switch answers and logs what to expect, as the banner does
            announce_switches(t, target=f"demo-{i}", base=base, speed=speed, settle_s=switch_settle_s(config),
                              announce=announce)
        if on_ready is not None:
            on_ready(base, [t.url for t in twins])
        await serve(config, sources, sock, stop, families=families)
    finally:
        for running in twins:
            with contextlib.suppress(Exception):
                await running.stop()
