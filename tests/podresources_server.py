"""A kubelet's pod-resources API for the tests: the real gRPC service (`v1.PodResourcesLister`, List
and Get) on a unix socket, answering from a node the test describes, with the hostile answers a
broken or malicious kubelet could give (huge, malformed, never answering, no Get).

Runnable on its own, so a test can kill it and start it again as a kubelet restarts:
`python -m tests.podresources_server SOCKET NODE_JSON [MODE]`, NODE_JSON a list of
{"name", "namespace", "containers": [{"name", "devices": {resource: [ids]}}]}.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from exporter.sources.podresources import (
    GET_METHOD,
    LIST_METHOD,
    ContainerDevices,
    ContainerResources,
    PodResources,
    decode_pod,
    encode_get_response,
    encode_list_response,
)

MODES = ("ok", "no_get", "get_disabled", "huge", "malformed", "hang")


def pods_from_json(data: Sequence[dict]) -> list[PodResources]:
    return [PodResources(p["name"], p["namespace"], tuple(
        ContainerResources(c["name"], tuple(ContainerDevices(r, tuple(ids)) for r, ids in c.get("devices", {}).items()))
        for c in p["containers"])) for p in data]


def node_of_eight(uuids: Sequence[str]) -> list[dict]:
    """The issue's node: 8 GPUs; pod a holds 1 (container vllm), pod b holds 2 (container engine,
    beside an exporter container that holds none), pod c holds none; 5 GPUs are free."""
    return [
        {"name": "a", "namespace": "ns1", "containers": [
            {"name": "vllm", "devices": {"nvidia.com/gpu": [uuids[0]]}}, {"name": "llm-exporter"}]},
        {"name": "b", "namespace": "ns2", "containers": [
            {"name": "engine", "devices": {"nvidia.com/gpu": [uuids[3], uuids[5]], "example.com/nic": ["nic0"]}},
            {"name": "llm-exporter"}]},
        {"name": "c", "namespace": "ns1", "containers": [{"name": "cpu-only"}, {"name": "llm-exporter"}]},
    ]


def dra_metadata(root: str, claim: str, request: str, driver: str, uuids: list[str]) -> None:
    """A KEP-5304 DeviceMetadata file, as the DRA framework writes it (the KEP's example's shape)."""
    os.makedirs(os.path.join(root, claim, request), exist_ok=True)
    doc = {"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata",
           "metadata": {"name": claim, "namespace": "ns1", "uid": "u", "generation": 1},
           "requests": [{"name": request, "devices": [
               {"name": f"gpu-{i}", "driver": driver, "pool": "node-1", "attributes": {
                   "index": {"int": i}, "uuid": {"string": u}, "productName": {"string": "H100"}}}
               for i, u in enumerate(uuids)]}]}
    with open(os.path.join(root, claim, request, f"{driver}-metadata.json"), "w") as f:
        json.dump(doc, f)


@dataclass
class Kubelet:
    pods: list[PodResources]
    mode: str = "ok"
    calls: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _answer(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls.append(method.rsplit("/", 1)[-1])
        if self.mode == "hang":
            self.stop.wait(60)
            context.abort(grpc.StatusCode.CANCELLED, "stopped")
        if self.mode == "huge":
            return b"\x0a" + b"\xff\xff\xff\x07" + b"\x00" * (16 * 1024 * 1024 - 1)  # 16 MiB
        if self.mode == "malformed":
            return b"\x0a\x10\x0a\x03abc"  # a pod of 16 bytes, 5 sent
        if method == GET_METHOD:
            if self.mode == "no_get":  # a kubelet before 1.27
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method Get")
            if self.mode == "get_disabled":  # KubeletPodResourcesGet off: the kubelet answers a plain error
                context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
            want = decode_pod(request)  # GetPodResourcesRequest has PodResources' first two fields
            pod = next((p for p in self.pods if p.name == want.name and p.namespace == want.namespace), None)
            if pod is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"pod {want.name} in namespace {want.namespace} not found")
            return encode_get_response(pod)
        return encode_list_response(self.pods)

    def handler(self) -> grpc.GenericRpcHandler:
        kubelet = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):  # noqa: ANN001 - grpc's interface
                if details.method not in (LIST_METHOD, GET_METHOD):
                    return None
                return grpc.unary_unary_rpc_method_handler(
                    lambda request, context: kubelet._answer(details.method, request, context))

        return Handler()


@contextlib.contextmanager
def serving(socket_path: str, pods: list[PodResources], mode: str = "ok") -> Iterator[Kubelet]:
    kubelet = Kubelet(pods, mode)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    server.add_generic_rpc_handlers((kubelet.handler(),))
    server.add_insecure_port("unix:" + socket_path)
    server.start()
    try:
        yield kubelet
    finally:
        kubelet.stop.set()
        server.stop(grace=None).wait(5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)


def main(argv: Sequence[str]) -> None:
    socket_path, node = argv[0], argv[1]
    mode = argv[2] if len(argv) > 2 else "ok"
    with open(node) as f:
        pods = pods_from_json(json.load(f))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with serving(socket_path, pods, mode):
        print("serving", flush=True)
        done.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
