"""Which GPUs the GPU source watches, and who holds each one (docs/gpu.md, "Which GPUs").

A sidecar must watch exactly its engine's GPUs: on a node of eight 1-GPU replicas, a sidecar that
reads every GPU reports the other replicas' load as its engine's evidence and stores every GPU series
eight times. The selection comes from the first of these that answers, and the exporter says which
one it used (`llm_exporter_gpu_attribution{method}` and one log line at start and on each change):

1. `explicit`: --gpus UUID|INDEX,... (the user said so);
2. `dra`: --gpu-dra-claim names a DRA ResourceClaim shared by the engine and the exporter. Where the
   claim's device metadata is mounted (KEP-5304: DRA_METADATA_DIR/<claim>/<request>/<driver>-metadata.json,
   alpha in 1.36), the UUIDs it lists are watched; else every GPU NVML shows, since the DRA driver
   (NVIDIA's gpu.nvidia.com) injects only the claimed devices into each container that names the
   claim (CDI).
3. `pod_resources`: --pod-name and --pod-namespace (downward API) are set and the kubelet's
   pod-resources API answers for this pod: the device IDs of every `nvidia.com/*` resource (GPUs
   and MIG instances; the NVIDIA device plugin's IDs are their UUIDs) held by the engine's
   containers (--engine-containers, default every container but --exporter-container);
4. `all`: nothing above answered: every GPU NVML shows, with a warning, since on a shared node
   those include other pods' GPUs.

DaemonSet mode (--kubernetes-gpu-mapping): every GPU is watched and labelled with the pod, namespace
and container that hold it, from the kubelet's `List` (as dcgm-exporter does).

The kubelet is asked off the event loop, under the client's deadline, every REFRESH_S; when it does
not answer, the last answer is used for KEEP_S and the call retried with back-off (RETRY_MIN_S
doubling to RETRY_MAX_S); `llm_exporter_pod_resources_up` and one log line per state change say so.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter import jsonsafe
from exporter.logstate import StateLog, quote_names
from exporter.safefile import read_regular_file
from exporter.snapshot import Sample, make_labels
from exporter.sources.base import SourceData
from exporter.sources.podresources import (
    DEFAULT_SOCKET,
    PodResources,
    PodResourcesClient,
    PodResourcesError,
)

LOG = logging.getLogger("llm_exporter.gpu.attribution")

METHODS = ("dra", "pod_resources", "explicit", "all")
GPU_RESOURCE_PREFIX = "nvidia.com/"  # nvidia.com/gpu, and nvidia.com/mig-<profile> under the mixed MIG strategy
REFRESH_S = 5.0
"""How often the kubelet is asked again after an answer: a sidecar's GPUs do not change while its pod
lives, but a kubelet restart is seen within this; in DaemonSet mode pods come and go."""
KEEP_S = 300.0
"""How long the last answer stands in while the kubelet does not answer (a kubelet restart takes
seconds): past it a sidecar falls back to every GPU (with the warning), a DaemonSet to no labels."""
RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
MAX_OWNED_GPUS = 4096  # GPUs one List may attribute (a node has a few dozen with MIG instances)
OWNER_LABELS = ("pod", "namespace", "container")
DRA_METADATA_DIR = "/var/run/dra-device-attributes"
"""Where DRA device metadata appears in a container (KEP-5304, alpha in Kubernetes 1.36, a DRA driver
started with its metadata flag): `<claim>/<request>/<driver>-metadata.json`, each device with its
ResourceSlice attributes, among them NVIDIA's `uuid`."""
MAX_DRA_FILES = 64  # metadata files read for one claim (one per request and driver)
MAX_DRA_FILE_BYTES = 1 << 20  # a file lists a request's devices and their attributes: a few KB


@dataclass(frozen=True, slots=True)
class Owner:
    pod: str
    namespace: str
    container: str


@dataclass(frozen=True, slots=True)
class GpuSelection:
    """The GPUs to watch: `ids` holds UUIDs and/or NVML indices as text (None: every GPU); `owners`
    maps a GPU UUID to the container that holds it (DaemonSet mode)."""

    method: str
    ids: frozenset[str] | None = None
    owners: Mapping[str, Owner] = field(default_factory=lambda: MappingProxyType({}))

    matched: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)
    """`ids` in lower case, what `wants` compares: a UUID's hex digits in either case (DRA's metadata
    may write `gpu-...`, NVML writes `GPU-...`)."""

    def __post_init__(self) -> None:
        if self.ids is not None:
            object.__setattr__(self, "matched", frozenset(i.lower() for i in self.ids))

    def wants(self, index: int, uuid: str) -> bool:
        matched = self.matched
        return matched is None or (bool(uuid) and uuid.lower() in matched) or str(index) in matched


EVERY_GPU = GpuSelection("all")
_NO_OWNERS: Mapping[str, Owner] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AttributionOptions:
    gpus: tuple[str, ...] | None = None
    dra_claim: str | None = None
    pod_name: str | None = None
    pod_namespace: str | None = None
    engine_containers: tuple[str, ...] | None = None
    exporter_container: str = "llm-exporter"
    socket: str = DEFAULT_SOCKET
    mapping: bool = False  # DaemonSet mode
    dra_metadata_dir: str = DRA_METADATA_DIR
    timeout_s: float = 2.0  # each kubelet call's deadline
    wait_s: float = 0.5  # how long a cycle waits for a call in flight before using the last answer
    in_kubernetes: bool = False  # KUBERNETES_SERVICE_HOST is set: falling back to every GPU is warned

    @property
    def asks_kubelet(self) -> bool:
        return self.mapping or (not self.gpus and not self.dra_claim and bool(self.pod_name and self.pod_namespace))


@dataclass(slots=True)
class _Kubelet:
    """The pod-resources side: the last answer, when it came, and the retry schedule."""

    answer: tuple[PodResources, ...] | None = None
    answered_at: float = 0.0
    next_at: float = 0.0
    delay: float = RETRY_MIN_S
    state: str = "unknown"  # ok, or the last failure's reason
    errors: dict[str, int] = field(default_factory=dict)
    up: bool = False


class Attribution:
    """Resolves the selection each cycle (cheap: the kubelet is asked every REFRESH_S at most)."""

    def __init__(self, options: AttributionOptions, *, clock: Callable[[], float] = time.monotonic,
                 client: Any = None) -> None:
        self.options = options
        self._clock = clock
        self._client = client  # a PodResourcesClient, made on first use (and grpc imported then)
        self._kubelet = _Kubelet()
        self._log = StateLog(clock=clock)
        self.selection: GpuSelection | None = None
        self._inflight: asyncio.Future[tuple[PodResources, ...]] | None = None
        self._owner_map: Mapping[str, Owner] = _NO_OWNERS
        self._dra: tuple[frozenset[str] | None] | None = None  # the DRA metadata's UUIDs, once read

    # -- the cycle ----------------------------------------------------------------------------

    async def current(self) -> GpuSelection:
        o = self.options
        if o.asks_kubelet:
            await self._refresh()
        if o.dra_claim and not o.gpus and self._dra is None:  # files on a mount: off the event loop, once
            self._dra = (await asyncio.to_thread(self._read_dra_metadata),)
        selection = self._resolve()
        self._say(selection)
        self.selection = selection
        return selection

    def _resolve(self) -> GpuSelection:
        o = self.options
        if o.mapping:
            return GpuSelection("pod_resources" if self._fresh() is not None else "all",
                                owners=self._owners())
        if o.gpus:
            return GpuSelection("explicit", frozenset(o.gpus))
        if o.dra_claim:
            return GpuSelection("dra", self._dra_uuids())
        pods = self._fresh()
        if pods is not None:
            pod = next((p for p in pods if p.name == o.pod_name and p.namespace == o.pod_namespace), None)
            if pod is not None:
                return GpuSelection("pod_resources", frozenset(self._engine_gpus(pod)))
        return EVERY_GPU

    def _dra_uuids(self) -> frozenset[str] | None:
        """The claim's device UUIDs from its DRA device metadata where it is mounted (read once, by
        `current`: a claim's devices do not change while the pod lives), else None: every GPU NVML
        shows, which the driver's CDI injection limited to the claim's."""
        return self._dra[0] if self._dra is not None else None

    def _read_dra_metadata(self) -> frozenset[str] | None:
        o = self.options
        assert o.dra_claim
        claim_dir = os.path.join(o.dra_metadata_dir, o.dra_claim)
        try:
            requests = sorted(os.listdir(claim_dir))[:MAX_DRA_FILES]
        except OSError:
            return None  # not mounted: the usual case before KEP-5304, or a driver without metadata
        uuids: set[str] = set()
        files = 0
        for request in requests:
            try:
                names = sorted(n for n in os.listdir(os.path.join(claim_dir, request)) if n.endswith("-metadata.json"))
            except OSError:
                continue
            for name in names[:MAX_DRA_FILES - files]:
                files += 1
                path = os.path.join(claim_dir, request, name)
                try:
                    doc = jsonsafe.loads(read_regular_file(path, MAX_DRA_FILE_BYTES))
                    uuids.update(_metadata_uuids(doc))
                except (OSError, ValueError, TypeError, AttributeError) as exc:
                    LOG.warning("DRA device metadata %s unreadable, not used: %s", path, str(exc)[:200])
        return frozenset(uuids) if uuids else None

    def _engine_gpus(self, pod: PodResources) -> list[str]:
        o = self.options
        out: list[str] = []
        for c in pod.containers:
            if o.engine_containers is not None:
                if not any(fnmatch.fnmatchcase(c.name, pattern) for pattern in o.engine_containers):
                    continue
            elif c.name == o.exporter_container:
                continue
            out.extend(c.device_ids(GPU_RESOURCE_PREFIX))
        return out

    def _owners(self) -> Mapping[str, Owner]:
        """The holders from the last answer while it stands (the same object until the next answer,
        so that OwnerLabels keeps what it remembered), else none."""
        return self._owner_map if self._fresh() is not None else _NO_OWNERS

    @staticmethod
    def _owners_of(pods: tuple[PodResources, ...]) -> Mapping[str, Owner]:
        owners: dict[str, Owner] = {}
        for pod in pods:
            for c in pod.containers:
                for uuid in c.device_ids(GPU_RESOURCE_PREFIX):
                    if len(owners) < MAX_OWNED_GPUS:
                        owners[uuid] = Owner(pod.name, pod.namespace, c.name)
        return MappingProxyType(owners)

    def _fresh(self) -> tuple[PodResources, ...] | None:
        k = self._kubelet
        if k.answer is None or self._clock() - k.answered_at > KEEP_S:
            return None
        return k.answer

    # -- the kubelet ----------------------------------------------------------------------------

    async def _refresh(self) -> None:
        """Ask the kubelet when it is time, in a worker thread, one call at a time: a call still
        running (bounded by the client's deadline) is waited for up to `wait_s` and otherwise picked
        up by a later cycle, so a kubelet that never answers neither stalls the GPU series nor piles
        up threads."""
        k = self._kubelet
        task = self._inflight
        if task is None:
            if self._clock() < k.next_at:
                return
            task = self._inflight = asyncio.ensure_future(asyncio.to_thread(self._ask))
        if not task.done():
            await asyncio.wait({task}, timeout=self.options.wait_s)
            if not task.done():
                return
        self._inflight = None
        if task.cancelled():  # its loop ended under it (a shutdown): asked again next cycle
            return
        try:
            pods = task.result()
        except PodResourcesError as exc:
            k.up = False
            k.errors[exc.reason] = k.errors.get(exc.reason, 0) + 1
            k.next_at = self._clock() + k.delay
            k.delay = min(k.delay * 2, RETRY_MAX_S)
            self._state(exc.reason, exc.message)
            return
        if self.options.mapping and pods != k.answer:
            self._owner_map = self._owners_of(pods)
        k.answer, k.answered_at, k.up = pods, self._clock(), True
        k.next_at = k.answered_at + REFRESH_S
        k.delay = RETRY_MIN_S
        self._state("ok", f"{len(pods)} pod{'s' if len(pods) != 1 else ''} answered")

    def _ask(self) -> tuple[PodResources, ...]:
        o = self.options
        try:
            mode = os.stat(o.socket).st_mode
        except OSError as exc:  # checked first: no gRPC connection (nor grpc import) without a socket
            raise PodResourcesError("socket_missing", f"no kubelet socket at {o.socket}: {exc.strerror}") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError("socket_missing", f"{o.socket} is not a socket")
        if self._client is None:
            self._client = PodResourcesClient(o.socket, timeout_s=o.timeout_s)
        if o.mapping:
            return tuple(self._client.list())
        assert o.pod_name and o.pod_namespace
        pod = self._client.get(o.pod_name, o.pod_namespace)
        if pod is None:
            raise PodResourcesError("not_found", f"the kubelet does not know pod {o.pod_namespace}/{o.pod_name}")
        return (pod,)

    def _state(self, state: str, message: str) -> None:
        k = self._kubelet
        k.state = state

        def write(suffix: str) -> None:
            if state == "ok":
                LOG.info("kubelet pod-resources API at %s answers: %s%s", self.options.socket, message, suffix)
            else:
                kept = f" (its last answer is used for up to {KEEP_S:g}s)" if k.answer is not None else ""
                LOG.warning("kubelet pod-resources API not answering (%s): %s; retrying with back-off%s%s",
                            state, message, kept, suffix)

        self._log.update("pod_resources", state, "pod_resources", write)

    def _say(self, selection: GpuSelection) -> None:
        o = self.options

        def write(suffix: str) -> None:
            if selection.method == "all":
                why = ("the kubelet's pod-resources API did not answer" if o.asks_kubelet
                       else "no --gpus, --gpu-dra-claim or --pod-name/--pod-namespace")
                if o.mapping:
                    LOG.warning("GPU attribution: all, without pod labels: %s%s", why, suffix)
                    return
                # Outside Kubernetes a machine usually runs one engine on its GPUs: said, not warned.
                level = logging.WARNING if o.asks_kubelet or o.in_kubernetes else logging.INFO
                LOG.log(level, "GPU attribution: all: watching every GPU NVML shows (%s). On a node shared by "
                            "several engines that includes other pods' GPUs: their load reads as this engine's "
                            "and every GPU series is stored once per sidecar; set --gpus, --gpu-dra-claim, or "
                            "--pod-name/--pod-namespace with the kubelet's pod-resources socket mounted%s",
                            why, suffix)
            elif o.mapping:
                LOG.info("GPU attribution: pod_resources (DaemonSet mode): %d GPUs held by pods%s",
                         len(selection.owners), suffix)
            else:
                shown = quote_names(sorted(selection.ids)) if selection.ids else (
                    "none" if selection.ids is not None else "all")
                dra = "its device metadata" if selection.ids is not None else "every GPU NVML shows"
                source = {"explicit": "--gpus", "dra": f"DRA claim {o.dra_claim}: {dra}",
                          "pod_resources": f"pod {o.pod_namespace}/{o.pod_name}"}[selection.method]
                LOG.info("GPU attribution: %s (%s): %s%s", selection.method, source, shown, suffix)

        key = (selection.method, selection.ids, len(selection.owners) if o.mapping else 0)
        self._log.update("attribution", key, "gpu_attribution", write)

    # -- what it says ---------------------------------------------------------------------------

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        if self.selection is not None:
            out.extend(Sample("llm_exporter_gpu_attribution", make_labels({"method": m}),
                              1.0 if m == self.selection.method else 0.0) for m in METHODS)
        if self.options.asks_kubelet:
            k = self._kubelet
            out.append(Sample("llm_exporter_pod_resources_up", make_labels({}), 1.0 if k.up else 0.0))
            out.extend(Sample("llm_exporter_pod_resources_errors_total", make_labels({"reason": r}), float(n))
                       for r, n in sorted(k.errors.items()))
        out.extend(Sample("llm_exporter_log_lines_suppressed_total", make_labels({"source": "gpu", "reason": r}),
                          float(n)) for r, n in sorted(self._log.suppressed.items()))
        return out

    def close(self) -> None:
        if self._inflight is not None:
            self._inflight.cancel()  # the thread ends at its deadline; its answer is not wanted
        if self._client is not None:
            self._client.close()


MAX_LABEL_CACHE = 65536  # label sets remembered by OwnerLabels: a node's GPUs x their series, many times over


def _metadata_uuids(doc: Any) -> list[str]:
    """The `uuid` attribute (`{"string": ...}`) of every device of every request of a KEP-5304
    DeviceMetadata document; raises TypeError/AttributeError on another shape."""
    if not isinstance(doc, dict) or doc.get("kind") != "DeviceMetadata":
        raise TypeError("not a DeviceMetadata document")
    out = []
    for request in doc.get("requests") or ():
        for device in request.get("devices") or ():
            uuid = ((device.get("attributes") or {}).get("uuid") or {}).get("string")
            if isinstance(uuid, str) and 0 < len(uuid) <= 128:
                out.append(uuid)
    return out[:MAX_OWNED_GPUS]


class OwnerLabels:
    """Adds `pod`, `namespace` and `container` of the GPU's holder to the GPU series (a GPU no pod
    holds keeps its labels as they are). The labelled sets are remembered while the holders stay the
    same, so a steady cycle costs a dictionary lookup per sample."""

    def __init__(self) -> None:
        self._owners: Mapping[str, Owner] | None = None
        self._cache: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    def apply(self, samples: tuple[Sample, ...], owners: Mapping[str, Owner]) -> tuple[Sample, ...]:
        if not owners:
            return samples
        if owners is not self._owners:
            self._owners, self._cache = owners, {}
        cache = self._cache
        out = []
        for s in samples:
            if not s.name.startswith("llm_gpu_"):
                out.append(s)
                continue
            labels = cache.get(s.labels)
            if labels is None:
                uuid = next((v for k, v in s.labels if k == "uuid"), "")
                owner = owners.get(uuid) if uuid else None
                labels = s.labels if owner is None else make_labels(s.labels + (
                    ("pod", owner.pod), ("namespace", owner.namespace), ("container", owner.container)))
                if len(cache) < MAX_LABEL_CACHE:
                    cache[s.labels] = labels
            out.append(s if labels is s.labels else Sample(s.name, labels, s.value))
        return tuple(out)


class AttributedGpuSource:
    """The GPU source, watching the GPUs the attribution selects (the inner source's `select`) and
    adding the attribution's own series; in DaemonSet mode, the holder labels on the GPU series."""

    kind: Any

    def __init__(self, inner: Any, attribution: Attribution) -> None:
        self.inner = inner
        self.attribution = attribution
        self.name = inner.name
        self.kind = inner.kind
        self.timeout_s = inner.timeout_s
        self._owner_labels = OwnerLabels()

    async def collect(self) -> SourceData:
        selection = await self.attribution.current()
        self.inner.select(selection)
        data = await self.inner.collect()
        samples = self._owner_labels.apply(data.samples, selection.owners)
        return SourceData(samples + tuple(self.attribution.samples()),
                          {**data.attrs, "attribution": selection.method})

    async def close(self) -> None:
        await asyncio.to_thread(self.attribution.close)
        await self.inner.close()
