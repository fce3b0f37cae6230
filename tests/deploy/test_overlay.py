"""overlays/vllm's sidecar beside the twin, under `podman kube play`, on a machine without a GPU.

A module of its own so that its pod never runs beside test_pod.py's: podman 4.3 publishes every
containerPort on the host (Podman.kube_play), and both pods use 8000 and 9480."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from tests.deploy.harness import PREFIX, Podman, container_port, containers, get, kustomize, one, podman, wait_for
from tests.support import wait_until

pytestmark = pytest.mark.deploy
__all__ = ["podman"]  # the session fixture, from the harness


def test_the_vllm_overlays_sidecar_beside_the_twin_falls_back_without_a_gpu(podman: Podman, tmp_path: pathlib.Path):
    """overlays/vllm as rendered, its engine container replaced by the base's twin (no GPU, no model
    here): the sidecar as the overlay configures it (kind=vllm, NVML required) reaches the engine,
    says in its own metrics and one log line that NVML is missing, and keeps serving."""
    objects = kustomize("overlays/vllm")
    deployment = one(objects, "Deployment")
    deployment["metadata"]["name"] = f"{PREFIX}-vllm"
    pod = f"{PREFIX}-vllm-pod-0"
    twin = next(c for c in containers(one(kustomize("base"), "Deployment")) if c["name"] == "engine")
    spec = deployment["spec"]["template"]["spec"]
    spec["containers"] = [twin if c["name"] == "engine" else c for c in spec["containers"]]
    spec.pop("volumes", None)  # the engine's model cache and /dev/shm, which the twin does not mount
    exporter = next(c for c in spec["containers"] if c["name"] == "llm-exporter")
    env = {e["name"]: e.get("value") for e in exporter["env"]}
    assert env["LLM_EXPORTER_GPU_BACKEND"] == "nvml" and "kind=vllm" in env["LLM_EXPORTER_ENGINES"]
    manifest = tmp_path / "vllm.yaml"
    manifest.write_text(yaml.safe_dump(deployment))
    try:
        podman.kube_play(manifest, deployment)
        ip = podman.pod_ip(pod)
        port = container_port(deployment, "llm-exporter", "metrics")
        status, _ = wait_for(f"http://{ip}:{port}/readyz", timeout=90)
        assert status == 200, podman.logs(f"{pod}-llm-exporter")

        def body() -> str:
            return get(f"http://{ip}:{port}/metrics")[1]

        assert wait_until(lambda: 'llm_engine_up{engine="vllm",target="vllm"} 1.0' in body(), timeout=30,
                          interval=0.5), podman.logs(f"{pod}-llm-exporter")
        text = body()
        assert 'llm_exporter_source_up{source="gpu"} 0.0' in text
        assert 'llm_exporter_collect_errors_total{reason="nvml_missing",source="gpu"}' in text
        assert "llm_gpu_up{" not in text
        logs = podman("logs", f"{pod}-llm-exporter").stderr
        # One line for the state change, however many cycles it lasts.
        assert logs.count("NVML unavailable") == 1 and "Traceback" not in logs, logs[-3000:]
    finally:
        podman("kube", "down", str(manifest), check=False, timeout=120)
