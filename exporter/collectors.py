"""The collectors as a registry (node_exporter's registerCollector): one entry each, and
`app.build_sources` is a loop over them.

A collector is declared in two halves, because the layers ask for it. What a user sets (its name,
whether it runs by default, a one-line help, the settings that configure it) is a `CollectorSpec` in
exporter/settings.py `COLLECTORS`: the settings table sits at the bottom and derives the switch from
it (`--collector.NAME` / `--no-collector.NAME`, `collectors: {NAME: false}` in YAML,
`LLM_EXPORTER_COLLECTOR_NAME`), so config, the CLI and docs/configuration.md know every collector.
What builds its sources is here, in the commands layer, since a factory may reach the tools (the probe
source is in exporter/probe/). The two are checked against each other when this module is imported.

Each collector also names the `SourceKind` of the sources it builds: the collection loop attributes
each source's result to its collector by it (llm_exporter_collector_success{collector} and
llm_exporter_collector_duration_seconds{collector}, exporter/collect.py)."""

from __future__ import annotations

import dataclasses
import functools
import os
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from exporter.config import Config, ConfigError
from exporter.settings import COLLECTOR, COLLECTORS, CollectorSpec
from exporter.snapshot import SourceKind
from exporter.sources.base import Source

Built = Mapping[str, Sequence[Source]]
"""The sources the collectors before this one built, by collector name (absent: off)."""
Factory = Callable[[Config, Built], list[Source]]


@dataclass(frozen=True, slots=True)
class CollectorEntry:
    """One registry entry (named apart from exporter/collect.py's Collector, the collection loop)."""

    spec: CollectorSpec  # name, default, help, settings (exporter/settings.py COLLECTORS)
    kind: SourceKind  # the kind of every source it builds (how a result is attributed to it)
    build: Factory  # its sources from the Config; [] when it has nothing to collect

    @property
    def name(self) -> str:
        return self.spec.name

    def enabled(self, config: Config) -> bool:
        """Its switch (`--collector.NAME`, default `spec.default`)."""
        return bool(getattr(config, self.spec.setting_name))


# --- the factories -------------------------------------------------------------------------------

def _engine_sources(config: Config, built: Built) -> list[Source]:
    from exporter.sources.engines.scrape import EngineSource

    return [EngineSource(t, max_payload_bytes=config.max_payload_bytes, max_series=config.max_series_per_target)
            for t in config.engines]


def _router_sources(config: Config, built: Built) -> list[Source]:
    from exporter.sources.routers.scrape import RouterSource

    return [RouterSource(t, max_payload_bytes=config.max_payload_bytes, max_series=config.max_series_per_target)
            for t in config.routers]


def _probe_sources(config: Config, built: Built) -> list[Source]:
    if not config.probes:
        return []
    from exporter.probe.source import ProbeSource
    from exporter.sources.engines.scrape import EngineSource

    engines = {s.target.name: s for s in built.get("engine", ()) if isinstance(s, EngineSource)}
    out: list[Source] = []
    for probe in config.probes:
        engine = engines.get(probe.target)
        # The probe's series carry the engine label its target last detected (read each cycle);
        # with the engine collector off, the probe's own target name alone.
        attrs = functools.partial(getattr, engine, "attrs") if engine is not None else None
        out.append(ProbeSource(probe, engine_attrs=attrs))
    return out


def _host_sources(config: Config, built: Built) -> list[Source]:
    if not config.host_enabled:  # --no-host, the older switch: off wins over --collector.host
        return []
    if config.host_backend == "sim":
        if not config.sim_url:
            raise ConfigError("host_backend", "sim", "needs sim_url (the twin's URL) outside `llm-exporter demo`")
        from exporter.sources.host_sim import SimHostSource

        return [SimHostSource(config.sim_url)]
    from exporter.sources.host import HostOptions, HostSource

    options = HostOptions(
        proc_root=config.proc_root,
        sys_root=config.sys_root,
        engine_port=engine_port(config),
        engine_pidfile=config.engine_pidfile,
        engine_process_name=config.engine_process_name,
        engine_network_devices=config.engine_network_devices,
    )
    if config.network_exclude is not None:  # else HostOptions' default list
        options = dataclasses.replace(options, network_exclude=config.network_exclude)
    return [HostSource(options)]


def engine_port(config: Config) -> int | None:
    """As a sidecar the engine usually listens on loopback in the same pod: when no selector is
    configured, find the engine process by the port of the first loopback target."""
    if config.engine_port or config.engine_pidfile or config.engine_process_name:
        return config.engine_port
    for target in config.engines:
        parts = urllib.parse.urlsplit(target.url)
        if parts.hostname in ("127.0.0.1", "localhost", "::1"):
            return parts.port or (443 if parts.scheme == "https" else 80)
    return None


def _gpu_sources(config: Config, built: Built) -> list[Source]:
    if config.gpu_backend == "none":  # the older switch: off wins over --collector.gpu
        return []
    inner: Source
    if config.gpu_backend == "sim":
        if not config.sim_url:
            raise ConfigError("gpu_backend", "sim", "needs sim_url (the twin's URL) outside `llm-exporter demo`")
        from exporter.sources.gpu.sim import SimGpuSource

        inner = SimGpuSource(config.sim_url, retry_interval_s=config.gpu_retry_interval_s)
    else:
        from exporter.sources.gpu.nvml import NvmlOptions, NvmlSource

        # Without an engine selector the host source finds no pids; NVML then sums all processes.
        host = next(iter(built.get("host", ())), None)
        selected = engine_port(config) or config.engine_pidfile or config.engine_process_name
        engine_pids = getattr(host, "engine_pids", None) if selected else None
        inner = NvmlSource(NvmlOptions(required=config.gpu_backend == "nvml", engine_pids=engine_pids,
                                       retry_interval_s=config.gpu_retry_interval_s))
    from exporter.sources.gpu.attribution import AttributedGpuSource, Attribution, AttributionOptions

    # Which GPUs are the engine's (explicit, DRA, the kubelet's pod-resources, or all): docs/gpu.md.
    options = AttributionOptions(
        gpus=config.gpus, dra_claim=config.gpu_dra_claim, dra_metadata_dir=config.gpu_dra_metadata_dir,
        pod_name=config.pod_name,
        pod_namespace=config.pod_namespace, engine_containers=config.engine_containers,
        exporter_container=config.exporter_container, socket=config.pod_resources_socket,
        mapping=config.kubernetes_gpu_mapping, in_kubernetes=bool(os.environ.get("KUBERNETES_SERVICE_HOST")),
        # A slow kubelet delays the GPU series by at most a quarter of the cycle, never past it.
        wait_s=min(0.5, config.interval_s / 4))
    return [AttributedGpuSource(inner, Attribution(options))]


# --- the registry --------------------------------------------------------------------------------

REGISTRY: tuple[CollectorEntry, ...] = (
    CollectorEntry(COLLECTOR["engine"], SourceKind.ENGINE, _engine_sources),
    CollectorEntry(COLLECTOR["router"], SourceKind.ROUTER, _router_sources),
    CollectorEntry(COLLECTOR["probe"], SourceKind.PROBE, _probe_sources),
    CollectorEntry(COLLECTOR["host"], SourceKind.HOST, _host_sources),
    CollectorEntry(COLLECTOR["gpu"], SourceKind.GPU, _gpu_sources),
)
"""In exporter/settings.py COLLECTORS order: the sources are built in it (a factory reads the
sources built before its own)."""

if [c.name for c in REGISTRY] != [c.name for c in COLLECTORS]:
    raise ValueError("exporter/collectors.py REGISTRY and exporter/settings.py COLLECTORS must name the same "
                     f"collectors in the same order: {[c.name for c in REGISTRY]} vs {[c.name for c in COLLECTORS]}")
if len({c.kind for c in REGISTRY}) != len(REGISTRY):
    raise ValueError("two collectors build sources of one kind: their results could not be told apart")

BY_KIND: Mapping[SourceKind, str] = MappingProxyType({c.kind: c.name for c in REGISTRY})
"""Source kind -> the collector its results count for (exporter/collect.py reads it)."""


def build(config: Config, *, given: Mapping[str, Sequence[Source]] | None = None) -> dict[str, list[Source]]:
    """Every enabled collector's sources, by collector name, in registry order. `given`: sources that
    replace a collector's factory (the demo's simulated GPUs, tests' fake NVML), used when its switch
    is on; a collector that is off builds nothing and is absent."""
    built: dict[str, list[Source]] = {}
    for collector in REGISTRY:
        if not collector.enabled(config):
            continue
        replaced = (given or {}).get(collector.name)
        built[collector.name] = list(replaced) if replaced is not None else collector.build(config, built)
    return built
