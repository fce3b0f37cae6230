"""The image alone, as `docker run` / `podman run` users start it: read-only root, a non-root uid,
no capabilities, no new privileges. It must answer its probes and /metrics, fall back cleanly
without a GPU, stop on SIGTERM well within a pod's grace period, and carry nothing of the machine
that built it (its proxy's CA, its paths)."""

from __future__ import annotations

import pathlib
import time

import pytest

from tests.deploy.harness import IMAGE, PREFIX, Podman, get, podman, wait_for
from tests.support import free_port

pytestmark = pytest.mark.deploy
__all__ = ["podman"]  # the session fixture, from the harness

HARDENED = ("--read-only", "--user", "10001:10001", "--cap-drop", "ALL", "--security-opt", "no-new-privileges")
# Kubernetes' default terminationGracePeriodSeconds; the exporter should need a small part of it.
GRACE_S = 30
STOP_BOUND_S = 10


@pytest.fixture(scope="module")
def exporter(podman: Podman):
    """The exporter alone, hardened, pointed at an engine that is not there, GPU backend auto."""
    port = free_port()
    name = f"{PREFIX}-alone"
    podman("run", "-d", "--name", name, *HARDENED, "-p", f"127.0.0.1:{port}:9480", IMAGE,
           "run", "--engine", "http://127.0.0.1:1,name=absent", "--gpu-backend", "auto", "--interval", "1s")
    url = f"http://127.0.0.1:{port}"
    status, _ = wait_for(url + "/readyz", timeout=60)
    assert status == 200, podman.logs(name)
    yield name, url


def test_image_runs_as_uid_10001_with_healthcheck_and_entrypoint(podman: Podman):
    image = podman.inspect(IMAGE)
    assert image["Config"]["User"] == "10001:10001"
    assert image["Config"]["Entrypoint"] == ["llm-exporter"]
    # podman keeps HEALTHCHECK beside Config (docker inside it); either way the Dockerfile's own.
    healthcheck = image.get("Healthcheck") or image["Config"].get("Healthcheck")
    assert "/healthz" in " ".join(healthcheck["Test"])


def test_hardened_container_answers_probes_and_metrics(podman: Podman, exporter):
    name, url = exporter
    assert get(url + "/healthz")[0] == 200
    status, body = get(url + "/metrics")
    assert status == 200
    # It is up, its engine is not (nothing listens on port 1), and it says so.
    assert 'llm_engine_up{engine="unknown",target="absent"} 0.0' in body or 'target="absent"} 0.0' in body, body[:2000]
    state = podman.inspect(name)
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    status_file = podman("exec", name, "cat", "/proc/1/status").stdout
    fields = dict(line.split(":\t", 1) for line in status_file.splitlines() if ":\t" in line)
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Uid"].split()[0] == "10001"


def test_without_a_gpu_the_gpu_source_falls_back_cleanly(podman: Podman, exporter):
    name, url = exporter
    _, body = get(url + "/metrics")
    assert "llm_gpu_up{" not in body  # no GPU series at all, rather than a GPU reported down
    assert 'llm_exporter_source_up{source="host"} 1.0' in body
    logs = podman("logs", name).stderr + podman("logs", name).stdout
    assert "Traceback" not in logs, logs[-3000:]


def test_sigterm_stops_it_cleanly_within_the_grace_period(podman: Podman, exporter):
    name, _ = exporter
    started = time.monotonic()
    podman("stop", "-t", str(GRACE_S), name, timeout=GRACE_S + 30)
    took = time.monotonic() - started
    state = podman.inspect(name)["State"]
    assert state["ExitCode"] == 0, podman.logs(name)
    assert took < STOP_BOUND_S, f"SIGTERM took {took:.1f} s to stop the exporter"


def test_the_image_carries_nothing_of_the_build_host(podman: Podman):
    """The build trusted this host's CA bundle as a secret; none of its locally added anchors (the
    proxy's) may be in the image, and no host path in its config or history."""
    bundle = podman("run", "--rm", "--entrypoint", "cat", IMAGE, "/etc/ssl/certs/ca-certificates.crt").stdout
    local = [p for p in pathlib.Path("/usr/local/share/ca-certificates").rglob("*.crt")] \
        if pathlib.Path("/usr/local/share/ca-certificates").is_dir() else []
    for anchor in local:
        body = "".join(line for line in anchor.read_text().splitlines() if "-----" not in line)
        assert body and body[:64] not in bundle.replace("\n", ""), f"{anchor} is in the image"
    listing = podman("run", "--rm", "--entrypoint", "sh", IMAGE, "-c", "ls /run/secrets 2>/dev/null; echo end").stdout
    assert listing.strip() == "end"
    meta = podman("image", "inspect", IMAGE).stdout + podman("history", "--no-trunc", IMAGE).stdout
    for host_path in (str(pathlib.Path.cwd()), "/work/", "ca-certificates.crt,"):
        assert host_path not in meta
