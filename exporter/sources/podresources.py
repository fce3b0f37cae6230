"""The kubelet's pod-resources API (`v1.PodResourcesLister`, k8s.io/kubelet pkg/apis/podresources/v1
api.proto) over its unix socket: which devices (GPU UUIDs for `nvidia.com/gpu`) each container of
each pod on this node holds. dcgm-exporter maps GPUs to pods the same way.

Two calls are used: `List` (every pod of the node) and `Get` (one pod by name and namespace; kubelet
1.27+ with the KubeletPodResourcesGet feature, beta and on by default from 1.30). A kubelet without
`Get` answers UNIMPLEMENTED; the client then remembers to use `List` and filter.

No protobuf code generation: grpcio's generic `unary_unary` carries bytes, and the few messages
needed are encoded and decoded here in the protobuf wire format (the proto3 encoding spec). What the
kubelet sends is bounded: the channel refuses a message over MAX_MESSAGE_BYTES, repeated fields past
their bounds and over-long strings are a WireError, unknown fields are skipped (a newer kubelet's
additions), and a truncated or malformed message is a WireError naming where it stopped.

grpc is imported inside the client, on first use: an exporter outside Kubernetes never loads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVICE = "/v1.PodResourcesLister"
LIST_METHOD = SERVICE + "/List"
GET_METHOD = SERVICE + "/Get"
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""A node of 110 pods (the kubelet's default cap) with a few containers and devices each answers a
few tens of KB; 4 MiB (gRPC's default receive cap) leaves room for big nodes and bounds a hostile one."""
MAX_PODS = 5000  # Kubernetes' documented node limit is 110 by default; 5000 pods is a whole large cluster
MAX_CONTAINERS = 256  # per pod (init, sidecar and app containers together)
MAX_DEVICES = 1024  # device entries per container, device IDs per entry, claim resources per claim
MAX_STRING_BYTES = 1024  # names (DNS-1123: 253 at most), device IDs (a GPU UUID is 40), CDI names
MAX_CPU_IDS = 4096  # per container: skipped, but counted, so a packed field cannot hide a huge count


class WireError(ValueError):
    """A message that is not what the proto says (truncated, malformed, or past a bound)."""


class PodResourcesError(Exception):
    """A call that did not answer: `reason` is a bounded code (unavailable, deadline, unimplemented,
    too_large, malformed, error), `message` says what happened without the kubelet's own text past
    a bounded length."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# --- the messages -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimResource:
    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DynamicResource:
    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]
    dynamic_resources: tuple[DynamicResource, ...] = ()

    def device_ids(self, resource_prefix: str) -> tuple[str, ...]:
        """The IDs of every device whose resource name starts with `resource_prefix` (`nvidia.com/`:
        GPUs and MIG instances) this container holds, in the kubelet's order."""
        return tuple(i for d in self.devices if d.resource_name.startswith(resource_prefix) for i in d.device_ids)


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


# --- the wire format ----------------------------------------------------------------------------

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:  # a varint is at most 10 bytes
            raise WireError(f"varint longer than 10 bytes at byte {pos}")


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every field of one message: a varint's int, a
    length-delimited field's bytes; fixed-width fields are skipped (none is needed)."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire == _VARINT:
            value, pos = _varint(data, pos)
            out.append((number, wire, value))
        elif wire == _LEN:
            size, pos = _varint(data, pos)
            if size > len(data) - pos:
                raise WireError(f"field {number} declares {size} bytes, {len(data) - pos} left")
            out.append((number, wire, data[pos:pos + size]))
            pos += size
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > len(data):
                raise WireError(f"truncated fixed-width field {number}")
        else:  # groups (3, 4) are proto2 only; 6 and 7 do not exist
            raise WireError(f"field {number} has wire type {wire}, which proto3 does not use")
    return out


def _text(value: int | bytes, what: str) -> str:
    if not isinstance(value, bytes):
        raise WireError(f"{what} is a varint, not a string")
    if len(value) > MAX_STRING_BYTES:
        raise WireError(f"{what} is {len(value)} bytes long (at most {MAX_STRING_BYTES})")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"{what} is not UTF-8") from None


def _message(value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise WireError(f"{what} is a varint, not a message")
    return value


def _bounded(items: list[Any], bound: int, what: str) -> None:
    if len(items) >= bound:
        raise WireError(f"more than {bound} {what}")


def _decode_container_devices(data: bytes) -> ContainerDevices:
    name, ids = "", list[str]()
    for number, _, value in _fields(data):
        if number == 1:
            name = _text(value, "resource_name")
        elif number == 2:
            _bounded(ids, MAX_DEVICES, "device IDs in one entry")
            ids.append(_text(value, "device_id"))
    return ContainerDevices(name, tuple(ids))


def _decode_claim_resource(data: bytes) -> ClaimResource:
    driver = pool = device = ""
    cdi: list[str] = []
    for number, _, value in _fields(data):
        if number == 1:
            _bounded(cdi, MAX_DEVICES, "CDI devices in one claim resource")
            cdi.append(next((_text(v, "cdi name") for n, _, v in _fields(_message(value, "cdi_devices")) if n == 1),
                            ""))
        elif number == 2:
            driver = _text(value, "driver_name")
        elif number == 3:
            pool = _text(value, "pool_name")
        elif number == 4:
            device = _text(value, "device_name")
    return ClaimResource(driver, pool, device, tuple(cdi))


def _decode_dynamic(data: bytes) -> DynamicResource:
    claim = namespace = ""
    resources: list[ClaimResource] = []
    for number, _, value in _fields(data):
        if number == 2:
            claim = _text(value, "claim_name")
        elif number == 3:
            namespace = _text(value, "claim_namespace")
        elif number == 4:
            _bounded(resources, MAX_DEVICES, "claim resources in one claim")
            resources.append(_decode_claim_resource(_message(value, "claim_resources")))
    return DynamicResource(claim, namespace, tuple(resources))


def _decode_container(data: bytes) -> ContainerResources:
    name = ""
    devices: list[ContainerDevices] = []
    dynamic: list[DynamicResource] = []
    for number, _, value in _fields(data):
        if number == 1:
            name = _text(value, "container name")
        elif number == 2:
            _bounded(devices, MAX_DEVICES, "device entries in one container")
            devices.append(_decode_container_devices(_message(value, "devices")))
        elif number == 5:
            _bounded(dynamic, MAX_DEVICES, "dynamic resources in one container")
            dynamic.append(_decode_dynamic(_message(value, "dynamic_resources")))
        # 3 cpu_ids and 4 memory: not needed, skipped (their size is bounded by the message's)
    return ContainerResources(name, tuple(devices), tuple(dynamic))


def decode_pod(data: bytes) -> PodResources:
    name = namespace = ""
    containers: list[ContainerResources] = []
    for number, _, value in _fields(data):
        if number == 1:
            name = _text(value, "pod name")
        elif number == 2:
            namespace = _text(value, "pod namespace")
        elif number == 3:
            _bounded(containers, MAX_CONTAINERS, "containers in one pod")
            containers.append(_decode_container(_message(value, "containers")))
    return PodResources(name, namespace, tuple(containers))


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """ListPodResourcesResponse: `repeated PodResources pod_resources = 1`."""
    pods: list[PodResources] = []
    for number, _, value in _fields(data):
        if number == 1:
            _bounded(pods, MAX_PODS, "pods")
            pods.append(decode_pod(_message(value, "pod_resources")))
    return tuple(pods)


def decode_get_response(data: bytes) -> PodResources | None:
    """GetPodResourcesResponse: `PodResources pod_resources = 1` (None when absent)."""
    pod = None
    for number, _, value in _fields(data):
        if number == 1:
            pod = decode_pod(_message(value, "pod_resources"))
    return pod


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_field(number: int, value: str | bytes) -> bytes:
    """One length-delimited field (a string or an embedded message); empty strings are left out,
    as proto3 leaves out every default value."""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if not raw:
        return b""
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(raw)) + raw


def encode_get_request(pod_name: str, pod_namespace: str) -> bytes:
    """GetPodResourcesRequest: `string pod_name = 1; string pod_namespace = 2`."""
    return encode_field(1, pod_name) + encode_field(2, pod_namespace)


# Encoders for the other messages: the test server answers with them (and they document the proto).

def encode_pod(pod: PodResources) -> bytes:
    out = encode_field(1, pod.name) + encode_field(2, pod.namespace)
    for c in pod.containers:
        body = encode_field(1, c.name)
        for d in c.devices:
            body += encode_field(2, encode_field(1, d.resource_name) + b"".join(encode_field(2, i)
                                                                                 for i in d.device_ids))
        for dyn in c.dynamic_resources:
            inner = encode_field(2, dyn.claim_name) + encode_field(3, dyn.claim_namespace)
            for r in dyn.claim_resources:
                inner += encode_field(4, b"".join(encode_field(1, encode_field(1, n)) for n in r.cdi_devices)
                                      + encode_field(2, r.driver_name) + encode_field(3, r.pool_name)
                                      + encode_field(4, r.device_name))
            body += encode_field(5, inner)
        out += _encode_varint(3 << 3 | _LEN) + _encode_varint(len(body)) + body  # an empty container too
    return out


def encode_list_response(pods: tuple[PodResources, ...] | list[PodResources]) -> bytes:
    return b"".join(_encode_varint(1 << 3 | _LEN) + _encode_varint(len(p)) + p for p in map(encode_pod, pods))


def encode_get_response(pod: PodResources | None) -> bytes:
    return b"" if pod is None else encode_field(1, encode_pod(pod))


# --- the client ---------------------------------------------------------------------------------

def _identity(data: bytes) -> bytes:
    return data


class PodResourcesClient:
    """Blocking calls to the kubelet over `socket_path`, each with a deadline (run them off the event
    loop). The channel is created on first use and kept; gRPC reconnects it by itself when the kubelet
    restarts and the socket comes back."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._channel: Any = None
        self._calls: dict[str, Callable[..., bytes]] = {}
        self.get_supported: bool | None = None  # None until a Get answered or was refused

    def _call(self, method: str, request: bytes) -> bytes:
        import grpc  # lazily: an exporter that never asks the kubelet does not load grpc

        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    "unix://" + self.socket_path,
                    options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                             ("grpc.max_send_message_length", 64 * 1024),
                             ("grpc.enable_http_proxy", 0),  # a unix socket, never through a proxy
                             ("grpc.initial_reconnect_backoff_ms", 500),
                             ("grpc.max_reconnect_backoff_ms", 5000)])
                self._calls = {}
            stub = self._calls.get(method)
            if stub is None:
                stub = self._calls[method] = self._channel.unary_unary(
                    method, request_serializer=_identity, response_deserializer=_identity)
        try:
            return stub(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise _rpc_error(grpc, exc, method) from None

    def list(self) -> tuple[PodResources, ...]:
        data = self._call(LIST_METHOD, b"")
        try:
            return decode_list_response(data)
        except WireError as exc:
            raise PodResourcesError("malformed", f"List answered a malformed message: {exc}") from None

    def get(self, pod_name: str, pod_namespace: str) -> PodResources | None:
        """The pod, by Get where the kubelet has it, else by List filtered by name and namespace.
        None: the kubelet does not know the pod (not yet admitted, or a wrong name)."""
        if self.get_supported is not False:
            try:
                data = self._call(GET_METHOD, encode_get_request(pod_name, pod_namespace))
            except PodResourcesError as exc:
                if exc.reason not in ("unimplemented", "not_found", "error"):
                    raise  # the kubelet is not answering: List would not either
                # UNIMPLEMENTED: a kubelet before 1.27. The kubelet's own error (gRPC Unknown): "PodResources
                # API Get method disabled" where KubeletPodResourcesGet is off (alpha in 1.27-1.29), or
                # "pod ... not found". List answers all three: it is used from now on.
                self.get_supported = False
            else:
                self.get_supported = True
                try:
                    pod = decode_get_response(data)
                except WireError as exc:
                    raise PodResourcesError("malformed", f"Get answered a malformed message: {exc}") from None
                return pod if pod is not None and pod.name else None
        return next((p for p in self.list() if p.name == pod_name and p.namespace == pod_namespace), None)

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._calls = self._channel, None, {}
        if channel is not None:
            channel.close()


def _rpc_error(grpc: Any, exc: Any, method: str) -> PodResourcesError:
    code = exc.code() if hasattr(exc, "code") else None
    details = str(exc.details() if hasattr(exc, "details") else exc)[:200]
    name = method.rsplit("/", 1)[-1]
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError("deadline", f"{name}: no answer within the deadline")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return PodResourcesError("unimplemented", f"{name}: not offered by this kubelet")
    if code == grpc.StatusCode.NOT_FOUND:
        return PodResourcesError("not_found", f"{name}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return PodResourcesError("too_large", f"{name}: answer over {MAX_MESSAGE_BYTES} bytes ({details})")
    if code == grpc.StatusCode.UNAVAILABLE:
        return PodResourcesError("unavailable", f"{name}: kubelet socket unavailable ({details})")
    if code == grpc.StatusCode.INTERNAL and "parse" in details.lower():
        return PodResourcesError("malformed", f"{name}: {details}")
    return PodResourcesError("error", f"{name}: {code.name if code is not None else 'error'} ({details})")
