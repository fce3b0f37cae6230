"""The catalogue is the contract: naming conventions hold, docs/metrics.md is current, and what the
exporter actually serves passes `promtool check metrics` and stays inside the catalogue."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from exporter import catalog
from exporter.catalog.__main__ import DOC, render_markdown

UNIT_SUFFIXES = {"seconds": "_seconds", "bytes": "_bytes", "ratio": "_ratio", "watts": "_watts",
                 "joules": "_joules", "hertz": "_hertz", "celsius": "_celsius"}


@pytest.mark.parametrize("fam", sorted(catalog.FAMILIES.values(), key=lambda f: f.name), ids=lambda f: f.name)
def test_family_follows_conventions(fam):
    assert fam.name.startswith("llm_")
    assert fam.help and not fam.help[0].islower() and fam.help.endswith(".")
    assert len(set(fam.labels)) == len(fam.labels)
    stem = fam.name.removesuffix("_total")
    suffix = UNIT_SUFFIXES.get(fam.unit)
    # Base-unit families carry their unit in the name; derived per-token energy keeps its own wording.
    if suffix and fam.type != "histogram" and fam.name != "llm_energy_joules_per_token":
        assert stem.endswith(suffix) or suffix in stem, f"{fam.name} should name its unit {fam.unit}"
    assert "pid" not in fam.labels  # bounded labels only


def test_docs_metrics_md_is_current():
    assert DOC.read_text() == render_markdown(), "docs/metrics.md is stale: run `make docs`"


def test_promtool_accepts_what_the_demo_serves():
    """One cycle of the twin + sim GPU + real host through the whole pipeline, linted by promtool."""
    import asyncio

    from exporter.collect import Collector
    from exporter.simulator.demo import start_twins
    from exporter.sources.engines.scrape import EngineSource
    from exporter.sources.gpu.sim import SimGpuSource
    from exporter.sources.host import HostSource
    from exporter.targets import EngineTarget

    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make test` installs the Debian package prometheus"

    async def one_cycle() -> bytes:
        twins = await start_twins(scenario="decode-heavy", engines=1, gpus=2, engine_format="vllm",
                                  gpu_name="NVIDIA H100 80GB HBM3", model="llama-3.1-8b")
        try:
            engine = EngineSource(EngineTarget(url=twins[0].url + "/metrics", name="demo-0", timeout_s=2.0),
                                  max_payload_bytes=1 << 22, max_series=10_000)
            collector = Collector([engine, SimGpuSource([t.twin for t in twins]), HostSource()], interval_s=1.0,
                                  timeouts={"engine:demo-0": 2.0, "gpu": 2.0, "host": 2.0})
            await collector.collect_once()
            await asyncio.sleep(0.3)
            published = await collector.collect_once()
            await collector.close()
            return published.text
        finally:
            for twin in twins:
                await twin.stop()

    text = asyncio.run(one_cycle())
    assert b"llm_engine_up" in text and b"llm_gpu_power_watts" in text and b"llm_host_cpu_busy_ratio" in text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
