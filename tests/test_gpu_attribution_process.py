"""GPU attribution through the real processes (issue 43 items 1 and 2): the twin serves a node of 8
GPUs (`python -m exporter.simulator --gpus 8`), a kubelet's pod-resources API answers on a unix
socket (tests/podresources_server.py, the real gRPC service in its own process) for pods holding 1,
2 and 0 of them, and `llm-exporter run --gpu-backend sim` processes beside them must report exactly
their pod's GPUs and say how (`llm_exporter_gpu_attribution{method}`), label every GPU with its
holder in DaemonSet mode, survive the kubelet restarting, and keep serving when the kubelet's answer
is huge, malformed or never comes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.podresources_server import dra_metadata, node_of_eight
from tests.support import background_process, exporter_run, free_port, stop_process, wait_until

pytestmark = pytest.mark.e2e


def _series(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=5).text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _state(base: str) -> tuple[str | None, set[str], float | None]:
    """(method, GPUs, llm_exporter_pod_resources_up) from one scrape: a cycle whose GPU source ran
    late on a loaded machine has none of them, so they are read and checked together."""
    series = _series(base)
    on = [labels["method"] for labels, v in series.get("llm_exporter_gpu_attribution", []) if v == 1.0]
    up = next((v for _, v in series.get("llm_exporter_pod_resources_up", [])), None)
    return (on[0] if len(on) == 1 else None), {labels["uuid"] for labels, _ in series.get("llm_gpu_up", [])}, up


def _value(base: str, name: str, **labels: str) -> float | None:
    return next((v for lab, v in _series(base).get(name, []) if labels.items() <= lab.items()), None)


def _settled(check, what: str, timeout: float = 30.0) -> None:
    def tolerant() -> bool:
        try:
            return bool(check())
        except httpx.HTTPError:
            return False

    assert wait_until(tolerant, timeout=timeout, interval=0.1), what


@contextlib.contextmanager
def _kubelet(sock: str, node: str, mode: str = "ok") -> Iterator[subprocess.Popen]:
    """The pod-resources server in its own process (killed as a kubelet restart kills it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock)  # a dead kubelet's socket: the new one binds afresh, as the kubelet does
    process = subprocess.Popen([sys.executable, "-m", "tests.podresources_server", sock, node, mode],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: os.path.exists(sock), timeout=20), "the pod-resources server did not start"
        yield process
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[str, list[str]]]:
    port = free_port()
    twin = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "exporter.simulator", "--port", str(port), "--gpus", "8"]
    with background_process(command, twin + "/health"):
        uuids = [g["uuid"] for g in sorted(httpx.get(twin + "/sim/gpu").json()["gpus"], key=lambda g: g["index"])]
        assert len(set(uuids)) == 8
        yield twin, uuids


@pytest.fixture
def dirs() -> Iterator[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as d:  # short: a unix socket path is at most 107 bytes
        yield os.path.join(d, "kubelet.sock"), os.path.join(d, "node.json")


def _exporter(twin: str, *args: str, env: dict[str, str] | None = None):
    return exporter_run("--gpu-backend", "sim", "--sim-url", twin, "--log-level", "info", *args, env=env)


def test_each_pods_exporter_reports_exactly_its_gpus_and_survives_a_kubelet_restart(node, dirs) -> None:
    twin, uuids = node
    sock, node_file = dirs
    with open(node_file, "w") as f:
        json.dump(node_of_eight(uuids), f)
    pods = {"a": ("ns1", {uuids[0]}), "b": ("ns2", {uuids[3], uuids[5]}), "c": ("ns1", set())}
    with _kubelet(sock, node_file) as kubelet, contextlib.ExitStack() as stack:
        bases = {name: stack.enter_context(_exporter(twin, "--pod-name", name, "--pod-namespace", ns,
                                                     "--pod-resources-socket", sock))[0]
                 for name, (ns, _) in pods.items()}
        for name, (_, want) in pods.items():
            _settled(lambda b=bases[name], w=want: _state(b) == ("pod_resources", w, 1.0),
                     f"pod {name} reports exactly {want}")
        # Pod b's exporter never shows another pod's GPU, nor pod c's any (it holds none).
        assert not _series(bases["c"]).get("llm_gpu_power_watts")
        # The kubelet restarts: the socket goes, b keeps its GPUs from the last answer and says the
        # kubelet is not answering; when the socket is back, it answers again.
        kubelet.kill()  # as a kubelet dies: its socket file stays behind, refusing connections
        kubelet.wait()
        _settled(lambda: _state(bases["b"]) == ("pod_resources", pods["b"][1], 0.0),
                 "the kubelet's loss is seen, its last answer kept")
        assert (_value(bases["b"], "llm_exporter_pod_resources_errors_total", reason="socket_missing")
                or _value(bases["b"], "llm_exporter_pod_resources_errors_total", reason="unavailable"))
        with _kubelet(sock, node_file):
            _settled(lambda: _state(bases["b"]) == ("pod_resources", pods["b"][1], 1.0), "back after the restart")


def test_explicit_gpus_no_kubelet_and_the_daemonset_mapping(node, dirs) -> None:
    twin, uuids = node
    sock, node_file = dirs
    with open(node_file, "w") as f:
        json.dump(node_of_eight(uuids), f)
    with _exporter(twin, "--gpus", f"{uuids[2]},7", "--pod-name", "a", "--pod-namespace", "ns1",
                   "--pod-resources-socket", sock) as (base, _, _):
        # The kubelet is not asked: no llm_exporter_pod_resources_up.
        _settled(lambda: _state(base) == ("explicit", {uuids[2], uuids[7]}, None), "explicit --gpus")
    # A DRA claim shared with the engine: the driver injected only the claimed GPUs, so every GPU the
    # container sees is watched (here the twin's 8), and the kubelet is not asked.
    with _exporter(twin, "--gpu-dra-claim", "engine-gpus", "--pod-name", "a", "--pod-namespace", "ns1",
                   "--pod-resources-socket", sock) as (base, _, stderr):
        _settled(lambda: _state(base) == ("dra", set(uuids), None), "dra")
        stderr.seek(0)
        assert "GPU attribution: dra (DRA claim engine-gpus: every GPU NVML shows)" in stderr.read().decode()
    # With the claim's device metadata mounted (KEP-5304), the UUIDs it lists (any case) are watched.
    metadata = os.path.join(os.path.dirname(sock), "dra")
    dra_metadata(metadata, "engine-gpus", "gpus", "gpu.nvidia.com", [uuids[1].lower(), uuids[6]])
    with _exporter(twin, "--gpu-dra-claim", "engine-gpus", env={"LLM_EXPORTER_GPU_DRA_METADATA_DIR": metadata}) \
            as (base, _, _):
        _settled(lambda: _state(base) == ("dra", {uuids[1], uuids[6]}, None), "dra from its metadata")
    # Nothing answers (no socket): every GPU, and a warning saying why that is wrong on a shared node.
    with _exporter(twin, "--pod-name", "a", "--pod-namespace", "ns1", "--pod-resources-socket", sock) \
            as (base, _, stderr):
        _settled(lambda: _state(base) == ("all", set(uuids), 0.0), "all GPUs")
        stderr.seek(0)
        log = stderr.read().decode()
        assert "WARNING" in log and "GPU attribution: all" in log and "other pods' GPUs" in log
        assert log.count("GPU attribution:") == 1  # one line, not one a cycle
    with _kubelet(sock, node_file), _exporter(twin, "--kubernetes-gpu-mapping", "--pod-resources-socket", sock) \
            as (base, _, _):
        want = {uuids[0]: ("a", "ns1", "vllm"), uuids[3]: ("b", "ns2", "engine"), uuids[5]: ("b", "ns2", "engine")}

        def mapped() -> bool:  # one scrape
            series = _series(base)
            got = {lab["uuid"]: (lab.get("pod"), lab.get("namespace"), lab.get("container"))
                   for lab, _ in series.get("llm_gpu_power_watts", [])}
            method = [lab["method"] for lab, v in series.get("llm_exporter_gpu_attribution", []) if v == 1.0]
            return (method == ["pod_resources"] and len(got) == 8
                    and all(got[u] == want.get(u, (None, None, None)) for u in uuids))

        _settled(mapped, "every GPU labelled with its holder, the free ones with none")


@pytest.mark.parametrize("mode", ["huge", "malformed", "hang"])
def test_a_hostile_kubelet_is_a_bounded_error_and_the_exporter_keeps_serving(node, dirs, mode: str) -> None:
    twin, uuids = node
    sock, node_file = dirs
    with open(node_file, "w") as f:
        json.dump(node_of_eight(uuids), f)
    reason = {"huge": "too_large", "malformed": "malformed", "hang": "deadline"}[mode]
    engine_port = free_port()  # no engine: the exporter's own series and the GPUs still come
    with _kubelet(sock, node_file, mode), _exporter(twin, "--pod-name", "a", "--pod-namespace", "ns1",
                                                    "--pod-resources-socket", sock,
                                                    "--engine", f"http://127.0.0.1:{engine_port}/metrics") \
            as (base, process, stderr):
        _settled(lambda: (_value(base, "llm_exporter_pod_resources_errors_total", reason=reason) or 0) >= 1,
                 f"{mode}: counted as {reason}")
        _settled(lambda: _state(base) == ("all", set(uuids), 0.0), f"{mode}: every GPU, the kubelet down")
        assert process.poll() is None and httpx.get(base + "/healthz", timeout=5).status_code == 200
        stderr.seek(0)
        assert f"not answering ({reason})" in stderr.read().decode()
