"""Prefill/decode disaggregation: a prefill twin and a decode twin (each its own engine, GPUs, host
and /metrics page) joined by one simulated KV-transfer link.

A request arrives at the prefill instance, is prefilled there and makes its first token; its KV
cache (prompt tokens x the model's KV bytes per token) then crosses the link, first in, first out,
at the link's rate (a transfer of B bytes holds the link B / rate seconds; delivery adds the
link's latency); only then does the decode instance take it and decode it, with no prefill
compute. While its KV waits for or crosses the link the request sits in the prefill instance's
inflight queue (its KV blocks still held there) and in the decode instance's transfer queue.
The decode instance's TTFT therefore includes the wait for the link and the transfer.

`PdPair` advances both twins together, slice by slice (the prefill first, so every transfer that
completes within a slice is known to the decode twin before it runs that slice).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, Protocol, TypeVar

from exporter.physics.costs import NetworkLink
from exporter.simulator.engine import Engine, Request
from exporter.specs.models import ModelShape, kv_bytes_per_token


class Instance(Protocol):
    """What a pair needs of each of its twins (exporter.simulator.twin.Twin)."""

    pair: PdPair[Any] | None
    model: ModelShape
    engine: Engine

    @property
    def now(self) -> float: ...
    @property
    def role(self) -> str: ...
    @property
    def slice_s(self) -> float: ...
    @property
    def kv_link(self) -> NetworkLink | None: ...
    def advance_own(self, t: float) -> None: ...

# Per transfer, the decode side's messages back (RDMA READ requests or the completion notice).
CONTROL_BYTES_PER_TRANSFER = 256


class KvLink:
    """One link, FIFO: `submit` returns (start, done) of a transfer; `bytes_sent(t)` is what has
    crossed by twin time t (partial transfers included), so the NIC counters and the transfer times
    come from the same schedule and the link's utilization is at most 1."""

    def __init__(self, spec: NetworkLink) -> None:
        self.spec = spec
        self.free_at = 0.0  # when the link finishes serializing what it has been given
        self.pending: deque[tuple[float, float, float]] = deque()  # (start, end of serialization, bytes)
        self.sent_done = 0.0  # bytes of the transfers pruned (fully serialized by `_pruned`)
        self._pruned = 0.0
        self.transfers = 0
        self.bytes_submitted = 0.0
        self.busy_s = 0.0  # serialization time given to the link so far

    def submit(self, now: float, nbytes: float) -> tuple[float, float]:
        start = max(now, self.free_at)
        duration = self.spec.transfer_s(nbytes)
        self.free_at = start + duration
        self.pending.append((start, self.free_at, nbytes))
        self.transfers += 1
        self.bytes_submitted += nbytes
        self.busy_s += duration
        return start, self.free_at + self.spec.latency_s

    def bytes_sent(self, t: float) -> float:
        """Bytes that have crossed by twin time t (not before the last `prune`)."""
        t = max(t, self._pruned)
        total = self.sent_done
        for start, end, nbytes in self.pending:
            if start >= t:
                break
            total += nbytes if end <= t else nbytes * (t - start) / (end - start)
        return total

    def prune(self, t: float) -> None:
        """Forget the transfers done by t: no twin asks about an earlier time any more."""
        while self.pending and self.pending[0][1] <= t:
            self.sent_done += self.pending.popleft()[2]
        self._pruned = max(self._pruned, t)

    def transfers_started(self, t: float) -> int:
        """Transfers whose first byte has gone by t (for packet counts)."""
        return self.transfers - sum(1 for start, _, _ in self.pending if start > t)


_T = TypeVar("_T", bound=Instance)  # the twins' class (Twin), which this module cannot import: twin.py imports it


class PdPair(Generic[_T]):
    """A prefill twin and a decode twin sharing one KV-transfer link (`scenario.pd`)."""

    def __init__(self, prefill: _T, decode: _T) -> None:
        spec = prefill.kv_link
        if spec is None or decode.kv_link != spec:
            raise ValueError("a prefill/decode pair runs a scenario that declares its KV link (Scenario.pd)")
        if prefill.role != "prefill" or decode.role != "decode":
            raise ValueError("a pair is a twin with role prefill and one with role decode")
        self.prefill = prefill
        self.decode = decode
        self.link = KvLink(spec)
        self.kv_bytes_per_token = kv_bytes_per_token(prefill.model)
        prefill.pair = decode.pair = self
        self.attach(prefill, prefill.engine)

    @property
    def twins(self) -> tuple[_T, _T]:
        return self.prefill, self.decode

    def attach(self, twin: Instance, engine: Engine) -> None:
        """Wire a (new, after a restart) engine of one of the twins to the link."""
        if twin is self.prefill:
            engine.handoff = self._handoff

    def _handoff(self, req: Request, now: float) -> float:
        nbytes = req.prompt * self.kv_bytes_per_token
        start, done = self.link.submit(now, nbytes)
        req.kv_start_at, req.kv_done_at, req.kv_bytes = start, done, nbytes
        self.decode.engine.receive(Request(
            0, req.arrival, req.prompt, req.output, req.max_tokens, 0, ready_at=done, target=req.prompt,
            kv_handoff_at=now, kv_start_at=start, kv_done_at=done, kv_bytes=nbytes))
        return done

    def advance_to(self, t: float) -> None:
        slice_s = self.prefill.slice_s
        while self.prefill.now < t or self.decode.now < t:
            end = min(t, min(self.prefill.now, self.decode.now) + slice_s)
            self.prefill.advance_own(end)
            self.decode.advance_own(end)
        self.link.prune(min(self.prefill.now, self.decode.now))

    def network_counters(self, twin: Instance) -> dict[str, Any]:
        """The KV link's NIC counters as the given twin's node sees them: the prefill node sends the
        KV, the decode node receives it; control messages go the other way. Both read at the time
        both twins have reached (a step may take one a little past the other)."""
        link = self.link
        t = min(self.prefill.now, self.decode.now)
        data = link.bytes_sent(t)
        started = link.transfers_started(t)
        mtu = link.spec.mtu_bytes
        data_packets = int(data // mtu) + started
        control = started * CONTROL_BYTES_PER_TRANSFER
        sent, received = (data, control) if twin is self.prefill else (control, data)
        sent_packets, received_packets = (data_packets, started) if twin is self.prefill else (started, data_packets)
        return {"transmit_bytes": int(sent), "receive_bytes": int(received),
                "transmit_packets": sent_packets, "receive_packets": received_packets}


def pd_base_rate(link: NetworkLink, kv_bytes_per_token_: float, mean_prompt: float) -> float:
    """Requests/s the KV link carries at the workload's mean prompt: the pair's load is a share of it."""
    return link.bytes_per_s / max(1.0, mean_prompt * kv_bytes_per_token_)
