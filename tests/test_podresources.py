"""The kubelet pod-resources client (exporter/sources/podresources.py): the wire codec on its own,
then the client against a real gRPC server on a unix socket (tests/podresources_server.py), the
hostile answers included, and the attribution (exporter/sources/gpu/attribution.py) over it."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile

import pytest

from exporter.snapshot import Sample, make_labels
from exporter.sources.gpu.attribution import Attribution, AttributionOptions, OwnerLabels
from exporter.sources.podresources import (
    MAX_CONTAINERS,
    MAX_STRING_BYTES,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
    PodResourcesClient,
    PodResourcesError,
    WireError,
    _encode_varint,
    decode_get_response,
    decode_list_response,
    decode_pod,
    encode_field,
    encode_get_request,
    encode_get_response,
    encode_list_response,
)
from tests.podresources_server import dra_metadata, node_of_eight, pods_from_json, serving

UUIDS = [f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for i in range(8)]
PODS = pods_from_json(node_of_eight(UUIDS))


# --- the codec ---------------------------------------------------------------------------------

def test_a_list_answer_round_trips_with_devices_and_dra_claims() -> None:
    dra = ContainerResources("engine", (ContainerDevices("nvidia.com/gpu", (UUIDS[1],)),), (
        DynamicResource("gpu-claim", "ns1", (ClaimResource("gpu.nvidia.com", "node-1", "gpu-1",
                                                           ("nvidia.com/gpu=gpu-1", "k8s.gpu.nvidia.com/x")),)),))
    pods = (*PODS, PodResources("d", "ns3", (dra,)))
    assert decode_list_response(encode_list_response(pods)) == pods
    assert decode_get_response(encode_get_response(PODS[1])) == PODS[1]
    assert decode_get_response(b"") is None
    assert PODS[1].containers[0].device_ids("nvidia.com/gpu") == (UUIDS[3], UUIDS[5])


def test_the_get_request_is_the_protos_fields_1_and_2() -> None:
    # GetPodResourcesRequest{pod_name: "a", pod_namespace: "ns1"} as protoc encodes it.
    assert encode_get_request("a", "ns1") == b"\x0a\x01a\x12\x03ns1"
    assert decode_pod(encode_get_request("a", "ns1")) == PodResources("a", "ns1", ())


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    """A newer kubelet's additions: varint, fixed64, fixed32 and length-delimited fields unknown here,
    and cpu_ids/memory (known, not needed), change nothing."""
    extra = (_encode_varint(99 << 3 | 0) + _encode_varint(2**63) + _encode_varint(98 << 3 | 1) + b"\x00" * 8
             + _encode_varint(97 << 3 | 5) + b"\x00" * 4 + encode_field(96, b"\xff\xfe"))
    container = encode_field(1, "vllm") + encode_field(3, b"\x01\x02\x03") + encode_field(2, encode_field(
        1, "nvidia.com/gpu") + encode_field(2, UUIDS[0]) + extra) + extra
    pod = encode_field(1, "a") + encode_field(2, "ns1") + encode_field(3, container) + extra
    decoded = decode_list_response(encode_field(1, pod) + extra)
    assert decoded == (PodResources("a", "ns1", (ContainerResources(
        "vllm", (ContainerDevices("nvidia.com/gpu", (UUIDS[0],)),)),)),)


@pytest.mark.parametrize(("data", "said"), [
    (b"\x0a\x10\x0a\x03abc", "declares 16 bytes, 5 left"),  # truncated message
    (b"\x0a", "truncated varint"),
    (b"\x0a\x02\x0a\x85", "truncated varint"),  # inside the pod: its name's length is cut
    (b"\x0b", "wire type 3"),  # a proto2 group
    (b"\x08\x01", None),  # field 1 as a varint: not a pod
    (b"\x0a\x02\x08\x01", "a varint, not a string"),  # the pod's name as a varint
    (b"\x00", "field number 0"),
    (b"\x0a\x03\x0a\x01\xff", "not UTF-8"),
    (b"\x0a\x0b" + b"\xff" * 11, "longer than 10 bytes"),
    (b"\x0d\x00", "truncated fixed-width"),
])
def test_malformed_input_is_a_wire_error_saying_where(data: bytes, said: str | None) -> None:
    with pytest.raises(WireError) as raised:
        decode_list_response(data)
    assert said is None or said in str(raised.value)


def test_bounds_on_counts_and_strings() -> None:
    many = encode_field(1, "p") + b"".join(encode_field(3, encode_field(1, "c")) for _ in range(MAX_CONTAINERS + 1))
    with pytest.raises(WireError, match=f"more than {MAX_CONTAINERS} containers"):
        decode_pod(many)
    fits = encode_field(1, "p") + b"".join(encode_field(3, encode_field(1, "c")) for _ in range(MAX_CONTAINERS))
    assert len(decode_pod(fits).containers) == MAX_CONTAINERS
    with pytest.raises(WireError, match="bytes long"):
        decode_pod(encode_field(1, "x" * (MAX_STRING_BYTES + 1)))
    assert decode_pod(encode_field(1, "x" * MAX_STRING_BYTES)).name == "x" * MAX_STRING_BYTES


# --- the client against a real gRPC server on a unix socket --------------------------------------

@pytest.fixture
def sock():
    with tempfile.TemporaryDirectory() as d:  # short: a unix socket path is at most 107 bytes
        yield os.path.join(d, "kubelet.sock")


def test_list_and_get_over_the_socket(sock: str) -> None:
    with serving(sock, PODS) as kubelet:
        client = PodResourcesClient(sock)
        assert client.list() == tuple(PODS)
        assert client.get("b", "ns2") == PODS[1]
        assert client.get_supported is True
        assert kubelet.calls == ["List", "Get"]
        assert client.get("b", "other") is None  # no such pod: List says so too
        assert kubelet.calls[2:] == ["Get", "List"]
        client.close()


@pytest.mark.parametrize("mode", ["no_get", "get_disabled"])
def test_a_kubelet_without_get_is_asked_with_list(sock: str, mode: str) -> None:
    """UNIMPLEMENTED (before 1.27) or the kubelet's plain error with KubeletPodResourcesGet off."""
    with serving(sock, PODS, mode) as kubelet:
        client = PodResourcesClient(sock)
        assert client.get("a", "ns1") == PODS[0]
        assert client.get_supported is False
        assert client.get("a", "ns1") == PODS[0]  # List straight away now
        assert kubelet.calls == ["Get", "List", "List"]
        client.close()


@pytest.mark.parametrize(("mode", "reason", "said"), [
    ("huge", "too_large", "over 4194304 bytes"),
    ("malformed", "malformed", "declares 16 bytes"),
    ("hang", "deadline", "no answer within the deadline"),
])
def test_hostile_answers_are_bounded_errors(sock: str, mode: str, reason: str, said: str) -> None:
    with serving(sock, PODS, mode):
        # A client (a connection) per call: after a refused 16 MiB answer the server may close the
        # connection (GOAWAY), which the next call on it would meet as `unavailable`.
        for call in (lambda c: c.list(), lambda c: c.get("a", "ns1")):
            client = PodResourcesClient(sock, timeout_s=0.5)
            with pytest.raises(PodResourcesError) as raised:
                call(client)
            assert raised.value.reason == reason and said in raised.value.message
            client.close()


def test_no_socket_is_unavailable(sock: str) -> None:
    with pytest.raises(PodResourcesError) as raised:
        PodResourcesClient(sock, timeout_s=0.5).list()
    assert raised.value.reason in ("unavailable", "deadline")


# --- the attribution over it, on a fake clock ---------------------------------------------------------

def _opts(**kw) -> AttributionOptions:
    """Options that wait for each kubelet call to end (its 2 s deadline bounds it): nothing here
    depends on how fast the machine is."""
    return AttributionOptions(wait_s=60.0, **kw)


def _run(attribution: Attribution):
    selection = asyncio.run(attribution.current())
    return selection, {(s.name, s.labels): s.value for s in attribution.samples()}


def test_each_pod_gets_exactly_its_gpus_and_the_kubelet_going_away_is_survived(sock: str, caplog) -> None:
    now = [0.0]
    caplog.set_level(logging.INFO, "llm_exporter.gpu.attribution")
    sidecars = {name: Attribution(_opts(pod_name=name, pod_namespace=ns, socket=sock),
                                  clock=lambda: now[0])
                for name, ns in (("a", "ns1"), ("b", "ns2"), ("c", "ns1"))}
    daemon = Attribution(_opts(mapping=True, socket=sock), clock=lambda: now[0])
    selection, said = _run(sidecars["a"])  # no kubelet yet: every GPU, warned
    assert selection.method == "all" and selection.ids is None
    assert said[("llm_exporter_pod_resources_up", ())] == 0.0
    assert said[("llm_exporter_pod_resources_errors_total", (("reason", "socket_missing"),))] == 1.0
    assert any(r.levelno == logging.WARNING and "GPU attribution: all" in r.getMessage()
               and "other pods' GPUs" in r.getMessage() for r in caplog.records)
    with serving(sock, PODS):
        now[0] = 1.0  # the first retry (1 s)
        got = {name: _run(a)[0] for name, a in sidecars.items()}
        assert {n: (s.method, s.ids) for n, s in got.items()} == {
            "a": ("pod_resources", frozenset({UUIDS[0]})), "b": ("pod_resources", frozenset({UUIDS[3], UUIDS[5]})),
            "c": ("pod_resources", frozenset())}
        assert got["b"].wants(5, UUIDS[5]) and not got["b"].wants(0, UUIDS[0]) and not got["c"].wants(0, UUIDS[0])
        mapping, said = _run(daemon)
        assert mapping.ids is None and said[("llm_exporter_gpu_attribution", (("method", "pod_resources"),))] == 1.0
        assert {u: (o.pod, o.namespace, o.container) for u, o in mapping.owners.items()} == {
            UUIDS[0]: ("a", "ns1", "vllm"), UUIDS[3]: ("b", "ns2", "engine"), UUIDS[5]: ("b", "ns2", "engine")}
    # The kubelet restarts: its socket goes; the last answer stands (for KEEP_S), the calls back off.
    now[0] = 10.0
    selection, said = _run(sidecars["b"])
    assert selection.method == "pod_resources" and said[("llm_exporter_pod_resources_up", ())] == 0.0
    assert any("not answering (socket_missing)" in r.getMessage() for r in caplog.records)
    with serving(sock, PODS):
        now[0] = 10.5  # before the retry: not asked
        assert _run(sidecars["b"])[1][("llm_exporter_pod_resources_up", ())] == 0.0
        now[0] = 11.0
        selection, said = _run(sidecars["b"])
        assert said[("llm_exporter_pod_resources_up", ())] == 1.0 and selection.ids == {UUIDS[3], UUIDS[5]}
    now[0] = 400.0  # gone for longer than KEEP_S: every GPU again, warned
    assert _run(sidecars["b"])[0].method == "all"
    for a in (*sidecars.values(), daemon):
        a.close()


def test_explicit_and_dra_win_and_never_ask_the_kubelet(sock: str) -> None:
    explicit = Attribution(_opts(gpus=(UUIDS[2], "7"), pod_name="a", pod_namespace="ns1", socket=sock))
    selection, said = _run(explicit)
    assert selection.method == "explicit" and selection.wants(7, "GPU-x") and selection.wants(1, UUIDS[2])
    assert not selection.wants(1, UUIDS[1])
    assert ("llm_exporter_pod_resources_up", ()) not in said  # not asked
    dra = Attribution(_opts(dra_claim="gpus", pod_name="a", pod_namespace="ns1", socket=sock))
    assert _run(dra)[0].method == "dra" and _run(dra)[0].ids is None


def test_engine_containers_and_the_exporters_own_container(sock: str) -> None:
    pods = pods_from_json([{"name": "p", "namespace": "n", "containers": [
        {"name": "prefill", "devices": {"nvidia.com/gpu": [UUIDS[0]]}},
        {"name": "decode", "devices": {"nvidia.com/mig-1g.10gb": ["MIG-1"]}},
        {"name": "side", "devices": {"nvidia.com/gpu": [UUIDS[1]]}}]}])
    with serving(sock, pods):
        every = Attribution(_opts(pod_name="p", pod_namespace="n", socket=sock, exporter_container="side"))
        assert _run(every)[0].ids == {UUIDS[0], "MIG-1"}
        named = Attribution(_opts(pod_name="p", pod_namespace="n", socket=sock,
                                               engine_containers=("pre*",)))
        assert _run(named)[0].ids == {UUIDS[0]}
        every.close()
        named.close()


def test_label_owners_adds_the_holder_to_gpu_series_only() -> None:
    from exporter.sources.gpu.attribution import Owner

    gpu = Sample("llm_gpu_up", make_labels({"gpu": "0", "uuid": UUIDS[0], "name": "H100"}), 1.0)
    free = Sample("llm_gpu_up", make_labels({"gpu": "1", "uuid": UUIDS[1], "name": "H100"}), 1.0)
    other = Sample("llm_exporter_source_up", make_labels({"uuid": UUIDS[0]}), 1.0)
    out = OwnerLabels().apply((gpu, free, other), {UUIDS[0]: Owner("a", "ns1", "vllm")})
    assert dict(out[0].labels) == {"gpu": "0", "uuid": UUIDS[0], "name": "H100", "pod": "a", "namespace": "ns1",
                                   "container": "vllm"}
    assert out[1:] == (free, other)


def test_a_call_in_flight_is_never_started_twice_and_is_picked_up_later(sock: str) -> None:
    """A kubelet that does not answer within the cycle: the cycle goes on with the last answer (here
    none: every GPU), the next cycles start no second call, and the answer, once in, is used."""
    import socket
    import threading

    release = threading.Event()
    calls: list[str] = []

    class Slow:
        def get(self, name: str, namespace: str) -> PodResources:
            calls.append(name)
            release.wait(60)
            return PODS[1]

        def close(self) -> None:
            pass

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(sock)  # _ask looks for the socket file before it calls
        attribution = Attribution(AttributionOptions(pod_name="b", pod_namespace="ns2", socket=sock, wait_s=0.0),
                                  client=Slow())

        async def cycles() -> list[str]:
            methods = [(await attribution.current()).method for _ in range(3)]
            release.set()
            while attribution._inflight is not None and not attribution._inflight.done():
                await asyncio.sleep(0.01)
            methods.append((await attribution.current()).method)
            return methods

        assert asyncio.run(cycles()) == ["all", "all", "all", "pod_resources"]
        assert calls == ["b"]
        assert attribution.selection is not None and attribution.selection.ids == {UUIDS[3], UUIDS[5]}


def test_grpc_is_loaded_only_when_the_kubelet_is_asked() -> None:
    """The exporter's RSS without Kubernetes does not carry grpc (about 10 MB): importing every
    module the run command loads, and resolving an attribution whose socket is missing, load none."""
    import subprocess
    import sys

    code = ("import asyncio, sys\n"
            "import exporter.cli, exporter.app, exporter.collectors\n"
            "import exporter.sources.gpu.nvml, exporter.sources.gpu.sim\n"
            "from exporter.sources.gpu.attribution import Attribution, AttributionOptions\n"
            "a = Attribution(AttributionOptions(pod_name='a', pod_namespace='n', socket='/nonexistent/kubelet.sock'))\n"
            "assert asyncio.run(a.current()).method == 'all'\n"
            "print('grpc' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_dra_device_metadata_names_the_claims_gpus_and_a_bad_file_is_skipped(caplog) -> None:
    with tempfile.TemporaryDirectory() as root:
        dra_metadata(root, "engine-gpus", "gpus", "gpu.nvidia.com", [UUIDS[1].lower(), UUIDS[6]])
        with open(os.path.join(root, "engine-gpus", "gpus", "other.example-metadata.json"), "w") as f:
            f.write('{"kind": "DeviceMetadata", "requests": [{"devices": ')  # cut short
        os.makedirs(os.path.join(root, "engine-gpus", "deep"))
        with open(os.path.join(root, "engine-gpus", "deep", "x-metadata.json"), "w") as f:
            f.write("[" * 1000 + "]" * 1000)  # nested past jsonsafe's bound
        caplog.set_level(logging.WARNING, "llm_exporter.gpu.attribution")
        claimed = Attribution(_opts(dra_claim="engine-gpus", dra_metadata_dir=root))
        selection, _ = _run(claimed)
        assert selection.method == "dra" and selection.ids == {UUIDS[1].lower(), UUIDS[6]}
        assert selection.wants(1, UUIDS[1]) and selection.wants(6, UUIDS[6]) and not selection.wants(0, UUIDS[0])
        unreadable = [r.getMessage() for r in caplog.records if "DRA device metadata" in r.getMessage()]
        assert len(unreadable) == 2 and all("not used" in m for m in unreadable)
        other = Attribution(_opts(dra_claim="another-claim", dra_metadata_dir=root))
        assert _run(other)[0].ids is None  # no metadata for it: every GPU the container sees
