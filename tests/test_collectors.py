"""Collectors as a registry (exporter/collectors.py, exporter/settings.py COLLECTORS): the switches and
their flag, YAML and environment twins, unknown names refused, the older switches (--no-host,
--gpu-backend none) as aliases where off wins, the per-collector self-metrics, and the real process."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from exporter import catalog, collectors
from exporter.app import build_sources, make_collector
from exporter.cli import build_parser
from exporter.cli import run as cli_run
from exporter.config import ConfigError, load_config
from exporter.settings import BY_NAME, COLLECTOR, COLLECTORS
from exporter.snapshot import SourceKind, labels_of
from exporter.sources.base import SourceError
from tests.support import fake_engine, wait_until
from tests.test_collect import ScriptedSource
from tests.test_e2e_run import _scrape, exporter_process

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOST = ROOT / "tests" / "fixtures" / "host" / "dual_socket_ok"
VLLM = (ROOT / "tests" / "fixtures" / "engines" / "vllm-v0.11__documented.prom").read_bytes()
HOST_ROOTS = {"proc_root": str(HOST / "proc"), "sys_root": str(HOST / "sys")}


def _flags(*argv: str) -> dict[str, object]:
    """`llm-exporter run ARGV` parsed as the CLI does, as the flags load_config takes."""
    args = build_parser().parse_args(["run", *argv])
    return {k: v for k, v in vars(args).items() if k != "command"}


def _names(sources) -> list[str]:
    return [s.name for s in sources]


# --- the declaration -------------------------------------------------------------------------------

def test_the_registry_and_the_declarations_name_the_same_collectors_each_with_its_switch():
    assert [c.name for c in collectors.REGISTRY] == [c.name for c in COLLECTORS] == [
        "engine", "router", "probe", "host", "gpu"]
    assert dict(collectors.BY_KIND) == {SourceKind.ENGINE: "engine", SourceKind.ROUTER: "router",
                                        SourceKind.PROBE: "probe", SourceKind.HOST: "host", SourceKind.GPU: "gpu"}
    for collector in COLLECTORS:
        switch = BY_NAME[f"collector_{collector.name}"]
        assert switch.flags == (f"--collector.{collector.name}", f"--no-collector.{collector.name}")
        assert switch.env == f"LLM_EXPORTER_COLLECTOR_{collector.name.upper()}"
        assert switch.default is collector.default and collector.help in switch.help
        assert all(name in BY_NAME for name in collector.settings)
    assert "host_backend" in COLLECTOR["host"].settings and "probes" in COLLECTOR["probe"].settings


def test_every_collector_is_on_by_default_and_builds_its_sources():
    config = load_config({"engines": ["http://127.0.0.1:8000,name=a"], "probes": ["http://127.0.0.1:8000"],
                          "routers": ["http://127.0.0.1:29000,name=r"],
                          "gpu_backend": "sim", "sim_url": "http://127.0.0.1:9", **HOST_ROOTS}, {})
    assert all(getattr(config, f"collector_{c.name}") for c in COLLECTORS)
    built = collectors.build(config)
    assert {name: [s.kind for s in sources] for name, sources in built.items()} == {
        "engine": [SourceKind.ENGINE], "router": [SourceKind.ROUTER], "probe": [SourceKind.PROBE],
        "host": [SourceKind.HOST], "gpu": [SourceKind.GPU]}
    assert _names(build_sources(config)) == ["engine:a", "router:r", "probe:a", "host", "gpu"]


# --- the switches: flags, YAML, environment ----------------------------------------------------------

@pytest.mark.parametrize("collector", [c.name for c in COLLECTORS])
def test_no_collector_flag_turns_exactly_that_collector_off(collector: str):
    flags = _flags("--engine", "http://127.0.0.1:8000,name=a", "--probe", "http://127.0.0.1:8000",
                   "--gpu-backend", "sim", "--sim-url", "http://127.0.0.1:9", f"--no-collector.{collector}")
    config = load_config({**flags, **HOST_ROOTS}, {})
    built = collectors.build(config)
    assert collector not in built
    assert set(built) == {c.name for c in COLLECTORS} - {collector}
    assert all(collectors.BY_KIND[s.kind] != collector for s in build_sources(config))


def test_yaml_block_flat_key_and_environment_twins(tmp_path: pathlib.Path):
    path = tmp_path / "c.yaml"
    path.write_text("collectors:\n  host: false\n  probe: no\n")
    config = load_config({"config": str(path)}, {})
    assert (config.collector_host, config.collector_probe, config.collector_engine) == (False, False, True)
    path.write_text("collector_gpu: false\n")
    assert load_config({"config": str(path)}, {}).collector_gpu is False
    path.write_text("collectors:\n")  # an empty block: the defaults
    assert all(getattr(load_config({"config": str(path)}, {}), f"collector_{c.name}") for c in COLLECTORS)
    assert load_config({}, {"LLM_EXPORTER_COLLECTOR_HOST": "false"}).collector_host is False
    assert load_config({}, {"LLM_EXPORTER_COLLECTOR_HOST": "0"}).collector_host is False


def test_the_usual_precedence_flag_over_environment_over_file(tmp_path: pathlib.Path):
    path = tmp_path / "c.yaml"
    path.write_text("collectors: {host: false, gpu: false}\n")
    env = {"LLM_EXPORTER_COLLECTOR_HOST": "true"}
    config = load_config({"config": str(path)}, env)
    assert (config.collector_host, config.collector_gpu) == (True, False)  # env over file
    config = load_config({**_flags("--no-collector.host", "--collector.gpu"), "config": str(path)}, env)
    assert (config.collector_host, config.collector_gpu) == (False, True)  # flags over both
    # Neither flag given: the flag is unset, not "on", so the file still decides.
    assert load_config({**_flags(), "config": str(path)}, {}).collector_host is False


@pytest.mark.parametrize("text, needle", [
    ("collectors: {hots: false}\n", "unknown key 'hots' in collectors (did you mean 'host'?)"),
    ("collectors: [host]\n", "expected a mapping of collector names to true or false"),
    ("collectors: {host: maybe}\n", "expected true or false"),
])
def test_a_bad_collectors_block_is_a_config_error(tmp_path: pathlib.Path, text: str, needle: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config({"config": str(path)}, {})
    assert needle in str(caught.value)


def test_an_unknown_collector_variable_is_an_error_not_a_warning():
    with pytest.raises(ConfigError) as caught:
        load_config({}, {"LLM_EXPORTER_COLLECTOR_HOTS": "false"})
    assert "no collector 'hots'" in str(caught.value) and "LLM_EXPORTER_COLLECTOR_HOST" in str(caught.value)


def test_unknown_collector_names_exit_2_with_did_you_mean(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as caught:
        cli_run(["run", "--no-collector.hots"], {})
    assert caught.value.code == 2
    assert "unknown option --no-collector.hots (did you mean --no-collector.host?)" in capsys.readouterr().err
    path = tmp_path / "c.yaml"
    path.write_text("collectors: {gpuu: false}\n")
    assert cli_run(["run", "--config", str(path), "--listen", "127.0.0.1:0"], {}) == 2
    assert "did you mean 'gpu'?" in capsys.readouterr().err
    assert cli_run(["run", "--listen", "127.0.0.1:0"], {"LLM_EXPORTER_COLLECTOR_ENGIN": "0"}) == 2
    assert "LLM_EXPORTER_COLLECTOR_ENGINE" in capsys.readouterr().err


# --- the older switches: aliases, off wins ------------------------------------------------------------

@pytest.mark.parametrize("argv, host_built", [
    ((), True),
    (("--no-host",), False),
    (("--no-collector.host",), False),
    (("--collector.host", "--no-host"), False),  # off wins
    (("--no-collector.host", "--host-backend", "procfs"), False),
])
def test_no_host_is_an_alias_of_no_collector_host(argv: tuple[str, ...], host_built: bool):
    config = load_config({**_flags("--gpu-backend", "none", *argv), **HOST_ROOTS}, {})
    assert ("host" in _names(build_sources(config))) is host_built


def test_off_wins_across_sources_too(tmp_path: pathlib.Path):
    path = tmp_path / "c.yaml"
    path.write_text("host: false\n")  # the older YAML switch, with the new one on the command line
    config = load_config({**_flags("--collector.host", "--gpu-backend", "none"), "config": str(path),
                          **HOST_ROOTS}, {})
    assert config.collector_host and not config.host_enabled
    assert collectors.build(config)["host"] == []  # on, with nothing to collect: no source, no series
    assert "host" not in _names(build_sources(config))


@pytest.mark.parametrize("argv, gpu_built", [
    (("--gpu-backend", "sim"), True),
    (("--gpu-backend", "none"), False),
    (("--gpu-backend", "none", "--collector.gpu"), False),  # off wins
    (("--gpu-backend", "sim", "--no-collector.gpu"), False),
])
def test_gpu_backend_none_is_an_alias_of_no_collector_gpu(argv: tuple[str, ...], gpu_built: bool):
    config = load_config({**_flags("--no-collector.host", "--sim-url", "http://127.0.0.1:9", *argv)}, {})
    assert ("gpu" in _names(build_sources(config))) is gpu_built


def test_a_given_gpu_source_replaces_the_factory_unless_the_collector_is_off():
    given = ScriptedSource("gpu", kind=SourceKind.GPU)
    # The demo and the tests pass their GPU source with --gpu-backend none (no NVML built for it).
    config = load_config(_flags("--gpu-backend", "none", "--no-host"), {})
    assert build_sources(config, gpu_source=given) == [given]
    config = load_config(_flags("--gpu-backend", "none", "--no-host", "--no-collector.gpu"), {})
    assert build_sources(config, gpu_source=given) == []


def test_probes_still_run_with_the_engine_collector_off():
    config = load_config(_flags("--engine", "http://127.0.0.1:8000,name=a", "--probe", "http://127.0.0.1:8000",
                                "--no-collector.engine", "--no-host", "--gpu-backend", "none"), {})
    sources = build_sources(config)
    assert _names(sources) == ["probe:a"]
    assert sources[0].attrs["target"] == "a"  # the probe's own target name, no engine attrs to read


# --- self-metrics --------------------------------------------------------------------------------------

def _values(published, name: str) -> dict:
    return {dict(s.labels)["collector"]: s.value for s in published.samples if s.name == name}


def test_collector_success_is_all_of_its_sources_and_duration_the_longest():
    async def scenario():
        good = ScriptedSource("engine:good", kind=SourceKind.ENGINE)
        bad = ScriptedSource("engine:bad", kind=SourceKind.ENGINE)
        host = ScriptedSource("host", kind=SourceKind.HOST)
        other = ScriptedSource("other", kind=SourceKind.OTHER)  # no collector's: none of its series
        config = load_config({"interval": "1s"}, {})
        collector = make_collector(config, [good, bad, host, other])
        first = await collector.collect_once()
        assert _values(first, "llm_exporter_collector_success") == {"engine": 1.0, "host": 1.0}
        bad.fail = SourceError("connection", "refused")
        second = await collector.collect_once()
        assert _values(second, "llm_exporter_collector_success") == {"engine": 0.0, "host": 1.0}
        # llm_engine_up keeps saying which target failed; the collector only that one of them did.
        up = {s.labels: s.value for s in second.samples if s.name == "llm_engine_up"}
        assert up == {labels_of(target="engine:good", engine="unknown"): 1.0,
                      labels_of(target="engine:bad", engine="unknown"): 0.0}
        durations = {s.source: s.duration_s for s in second.snapshot.results.values()}
        assert _values(second, "llm_exporter_collector_duration_seconds") == {
            "engine": max(durations["engine:good"], durations["engine:bad"]), "host": durations["host"]}
        assert "gpu" not in _values(second, "llm_exporter_collector_duration_seconds")  # no source: absent
    asyncio.run(scenario())


def test_a_slow_source_sets_its_collectors_duration():
    class Slow(ScriptedSource):
        async def collect(self):
            await asyncio.sleep(0.2)
            return await super().collect()

    async def scenario():
        collector = make_collector(load_config({}, {}), [Slow("host", kind=SourceKind.HOST),
                                                         ScriptedSource("engine:a", kind=SourceKind.ENGINE)])
        published = await collector.collect_once()
        durations = _values(published, "llm_exporter_collector_duration_seconds")
        assert durations["host"] >= 0.2 > durations["engine"]
    asyncio.run(scenario())


def test_the_collector_families_are_in_the_catalogue():
    for name, unit in (("llm_exporter_collector_success", "bool"),
                       ("llm_exporter_collector_duration_seconds", "seconds")):
        family = catalog.family_of(name)
        assert family is not None and family.labels == ("collector",) and family.type == "gauge"
        assert family.unit == unit and family.source == "self"


# --- the real process ----------------------------------------------------------------------------------

def _exporter(*args: str):
    """`llm-exporter run` (tests/test_e2e_run.py's, GPU collector off: no NVML here) on the host fixture."""
    return exporter_process("--proc-root", str(HOST / "proc"), "--sys-root", str(HOST / "sys"), *args)


def _by_collector(samples: dict[str, list], name: str) -> dict[str, float]:
    return {s.labels["collector"]: s.value for s in samples.get(name, [])}


@pytest.mark.timeout(90)
def test_run_no_collector_host_drops_the_host_series_and_a_failing_engine_fails_its_collector():
    with fake_engine(VLLM) as (good, _), fake_engine(b"", status=500) as (failing, _):
        # Every collector on (GPU off: no NVML here): the host fixture's series and collector are there,
        # and the engine collector is 0 while one of its two targets answers 500.
        with _exporter("--engine", f"{good},name=good", "--engine", f"{failing},name=bad") as base:
            assert wait_until(lambda: _by_collector(_scrape(base), "llm_exporter_collector_success")
                              == {"engine": 0.0, "host": 1.0}, timeout=15), _scrape(base).get(
                "llm_exporter_collector_success")
            samples = _scrape(base)
        assert any(name.startswith("llm_host_") for name in samples)
        assert {s.labels["target"]: s.value for s in samples["llm_engine_up"]} == {"good": 1.0, "bad": 0.0}
        assert set(_by_collector(samples, "llm_exporter_collector_duration_seconds")) == {"engine", "host"}

        # --no-collector.host: no host series, no host collector series; the engine collector is 1.
        started = time.monotonic()
        with _exporter("--engine", f"{good},name=good", "--no-collector.host") as base:
            assert wait_until(lambda: _by_collector(_scrape(base), "llm_exporter_collector_success")
                              == {"engine": 1.0}, timeout=15), _scrape(base).get("llm_exporter_collector_success")
            time.sleep(0.5)  # a few more cycles: the host must stay absent, not merely late
            samples = _scrape(base)
        assert time.monotonic() - started < 60
    assert not [name for name in samples if name.startswith("llm_host_")]
    assert _by_collector(samples, "llm_exporter_collector_success") == {"engine": 1.0}
    assert set(_by_collector(samples, "llm_exporter_collector_duration_seconds")) == {"engine"}
    assert "host" not in {s.labels["source"] for s in samples["llm_exporter_source_up"]}
    assert {s.labels["target"]: s.value for s in samples["llm_engine_up"]} == {"good": 1.0}
