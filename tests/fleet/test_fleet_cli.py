"""deploy/fleet.py as `make fleet` runs it: the rendered configs (promtool, vmalert -dryRun), the fleet's
shape, and `up` / `status` / `down` as processes on a small fleet."""

from __future__ import annotations

import pathlib
import random
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.fleet.test_fleet import ROOT, fleet_launcher

pytestmark = [pytest.mark.fleet]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found on PATH; `make fleet-debs` / `make debs` install it. This test never skips.")
    return found


def test_the_default_fleet_has_both_clusters_both_namespaces_mixed_engines_and_one_death():
    members = fleet_launcher.replicas(6, list(range(6)), 300.0)
    assert {r.cluster for r in members} == {"a", "b"}
    assert {(r.cluster, r.namespace) for r in members} == {(c, n) for c in "ab" for n in ("chat", "batch")}
    assert {r.profile.engine_format for r in members} == {"vllm", "sglang", "tgi", "llamacpp"}
    assert len({r.profile.model for r in members}) >= 2
    assert {r.profile.scenario for r in members} >= {"kv-pressure", "overload", "decode-heavy"}
    dying = [r for r in members if r.dies_after_s is not None]
    assert len(dying) == 1
    # Capacity lost, not a model gone: a peer of the same model and cluster keeps serving.
    peers = [r for r in members if r is not dying[0] and (r.cluster, r.profile.model) == (
        dying[0].cluster, dying[0].profile.model)]
    assert peers
    assert not [r for r in fleet_launcher.replicas(6, list(range(6)), None) if r.dies_after_s is not None]


def test_rendered_configs_pass_promtool_and_vmalert(tmp_path):
    ports = fleet_launcher.Ports.from_base(20000, 6)
    fleet, _ = fleet_launcher.plan(tmp_path, fleet_launcher.FleetOptions(time_scale=0.05), ports)
    promtool = _tool("promtool")
    for cluster in ("a", "b"):
        path = tmp_path / f"prometheus-{cluster}.yml"
        result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        config = yaml.safe_load(path.read_text())
        assert config["global"]["external_labels"] == {"cluster": cluster}
        assert "alerting" not in config  # the central vmalert is the one notifier
        drops = [r["regex"] for r in config["remote_write"][0]["write_relabel_configs"] if r["action"] == "drop"]
        # Prometheus anchors relabel regexes: full matches, as here.
        dropped = {name for name in ("target_model:llm_time_to_first_token_seconds:p99_5m", "ALERTS",
                                     "ALERTS_FOR_STATE", "llm_engine_up", "up", "llm_gpu_power_watts")
                   if any(re.fullmatch(regex, name) for regex in drops)}
        assert dropped == {"target_model:llm_time_to_first_token_seconds:p99_5m", "ALERTS",
                           "ALERTS_FOR_STATE"}
    vmalert = _tool("vmalert")
    central = str(tmp_path / "rules" / "central" / "rules" / "*.yaml")
    result = subprocess.run([vmalert, "-dryRun", f"-rule={central}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    amtool = _tool("amtool")
    result = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert fleet.notifications == tmp_path / "notifications.jsonl"


def test_an_ha_pair_differs_only_in_the_replica_label_which_the_store_drops(tmp_path):
    """--ha-cluster b: two Prometheus configs for b, identical but for `prometheus_replica` (both pass
    promtool), and the central store started with -dedup.minScrapeInterval at the scrape interval and a
    -relabelConfig that drops that label (and nothing else)."""
    ports = fleet_launcher.Ports.from_base(20000, 6, ha=True)
    fleet, procs = fleet_launcher.plan(tmp_path, fleet_launcher.FleetOptions(ha_cluster="b", interval="2s"), ports)
    assert set(fleet.ha_prometheus) == {"prometheus-b-1"} and set(fleet.prometheus) == {"a", "b"}
    promtool = _tool("promtool")
    configs = {}
    for name in ("prometheus-b", "prometheus-b-1"):
        path = tmp_path / f"{name}.yml"
        result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        configs[name] = yaml.safe_load(path.read_text())
    first, second = configs["prometheus-b"], configs["prometheus-b-1"]
    assert first["global"].pop("external_labels") == {"cluster": "b", "prometheus_replica": "b-0"}
    assert second["global"].pop("external_labels") == {"cluster": "b", "prometheus_replica": "b-1"}
    assert first == second
    assert yaml.safe_load((tmp_path / "prometheus-a.yml").read_text())["global"]["external_labels"] == {
        "cluster": "a"}
    vm = next(p for p in procs if p.name == "victoria-metrics").argv
    assert "-dedup.minScrapeInterval=2s" in vm
    relabel = next(a.split("=", 1)[1] for a in vm if a.startswith("-relabelConfig="))
    assert yaml.safe_load(pathlib.Path(relabel).read_text()) == [{"action": "labeldrop", "regex": "prometheus_replica"}]
    with pytest.raises(fleet_launcher.stack.StackError, match="ha-cluster"):
        fleet_launcher.plan(tmp_path, fleet_launcher.FleetOptions(ha_cluster="b"), fleet_launcher.Ports.from_base(
            20000, 6))


@pytest.mark.timeout(300)
def test_up_status_down_as_make_fleet_runs_them(tmp_path):
    n = 2
    for _ in range(50):  # a base port whose whole range is free
        base = random.randrange(30000, 60000 - n - 6)
        if all(fleet_launcher.stack._port_free(p) for p in fleet_launcher.Ports.from_base(base, n).all()):
            break
    cli = [sys.executable, str(ROOT / "deploy" / "fleet.py")]
    common = ["--dir", str(tmp_path / "fleet")]
    up = subprocess.run([*cli, "up", *common, "--replicas", str(n), "--base-port", str(base), "--die-after", "0",
                         "--interval", "2s"], capture_output=True, text=True, timeout=200, cwd=ROOT)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        ports = fleet_launcher.Ports.from_base(base, n)
        for port in ports.all():
            assert f"127.0.0.1:{port}" in up.stdout, (port, up.stdout)
        status = subprocess.run([*cli, "status", *common], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count(" up   pid ") == n + 6, status.stdout
        again = subprocess.run([*cli, "up", *common, "--replicas", str(n), "--base-port", str(base)],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert again.returncode == 1 and "already running" in again.stderr, again.stderr
    finally:
        down = subprocess.run([*cli, "down", *common], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert down.returncode == 0 and f"stopped: {n + 6} processes" in down.stdout, down.stdout + down.stderr
    status = subprocess.run([*cli, "status", *common], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert status.returncode == 3 and " up " not in status.stdout, status.stdout
