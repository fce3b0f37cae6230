"""The transfer stage: what crosses servers for one target. Two cases from the source documents:

- prefill/decode disaggregation: a decode instance waits for the KV cache its prefill instance
  computed to cross the network before its first token (SGLang PD, vLLM NIXL/Mooncake, Dynamo,
  llm-d); the engine reports the transfer time, the requests waiting for it and failed transfers;
- tensor or pipeline parallelism across servers: every step's all-reduce crosses the NIC, and
  "8 GPUs in one NVLink box and 8 GPUs across servers can perform completely differently".

Both show on the network links the host source reads (NIC and RDMA port counters); the links it
counts as the engine's are the ones weighed here. The verdict (bottleneck._interconnect) reads
this stage's result through signals.gather: a saturated, down or erroring engine link counts fully
only when the target's work is known to cross servers (`spans`), else it is a lead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from exporter.derive.quantiles import histogram_quantile
from exporter.derive.settings import DeriveSettings
from exporter.derive.stage import Ctx, Stage, StageState, TargetKey, rounded
from exporter.derive.view import LinkView, SnapshotView
from exporter.derive.window import HistogramWindow, RateWindow, Scopes
from exporter.snapshot import Sample

WAITING_KV = "llm_requests_waiting_kv_transfer"
KV_SECONDS = "llm_kv_transfer_seconds"
KV_FAILURES = "llm_kv_transfer_failures_total"
NET_UP = "llm_host_network_up"
NET_SPEED = "llm_host_network_speed_bytes_per_second"
NET_UTIL = "llm_host_network_utilization_ratio"
NET_ERRORS = tuple(f"llm_host_network_{d}_{k}_total" for d in ("receive", "transmit") for k in ("errors", "drops"))
RDMA_KINDS = frozenset({"infiniband", "roce"})
RDMA_BUSY = 0.05  # an engine RDMA link this busy carries the engine's own cross-server traffic
TTFT = "ttft"
MAX_LINKS_NAMED = 4  # evidence names at most this many links


class Transfer(NamedTuple):
    role: str  # prefill | decode | both | "" (not reported)
    waiting: float | None  # mean requests waiting for a KV transfer over the rate window
    transfer_p50: float | None  # seconds, over the quantile window
    transfer_p99: float | None
    transfers: float  # KV transfers observed in the window
    share: float | None  # median KV transfer time / median TTFT (capped at 1)
    failures_per_s: float | None
    spans: str  # why the target's work crosses servers; "" when nothing says it does
    parallel: bool  # it crosses them by tensor or pipeline parallelism (every step), not by KV transfer
    link_util: float | None  # the busiest engine link's mean over the rate window, the busier direction
    link_what: str
    links_down: tuple[str, ...]  # engine links not up
    link_errors: tuple[str, ...]  # engine links with errors or drops in the window: "mlx5_0:1 2.0/s"
    engine_links: int


MAX_LINK_WINDOWS = 256
"""Link windows kept: links are named by the host, and pods' interfaces come and go and are renamed
(a window per name seen in forget_after_s was 1.1 MB/s of RSS under renames). The host source reads
at most 64 links a cycle (host_net.MAX_NETWORK_LINKS): four cycles' worth of fresh names."""


class Windows(StageState):
    """A rate window and a KV transfer histogram window per target, and a window per link (shared by
    the targets: the link is the host's) for its error rate and its mean utilization: the all-reduce
    of tensor parallelism comes in bursts, so one cycle's utilization swings with where the bursts fell."""

    def __init__(self, settings: DeriveSettings) -> None:
        self.rates = Scopes(lambda: RateWindow(settings.rate_window_s), settings.forget_after_s)
        self.transfers = Scopes(lambda: HistogramWindow(settings.quantile_window_s), settings.forget_after_s)
        self.links = Scopes(lambda: RateWindow(settings.rate_window_s), settings.forget_after_s, MAX_LINK_WINDOWS)
        self.link_errors: dict[str, float] = {}  # device -> errors and drops per second, over the window
        self.link_util: dict[str, float] = {}  # device -> mean utilization (busier direction) over the window

    def begin(self, view: SnapshotView) -> None:
        self.link_errors, self.link_util = {}, {}
        for link in view.links:
            window: RateWindow = self.links.get(link.device)
            totals = {name: v for name in NET_ERRORS if (v := link.get(name)) is not None}
            util = link.get(NET_UTIL)
            window.observe(view.now, totals, {} if util is None else {NET_UTIL: util})
            rates = [r for name in totals if (r := window.rate(name)) is not None]
            if rates:
                self.link_errors[link.device] = sum(rates)
            if (mean := window.mean(NET_UTIL)) is not None:
                self.link_util[link.device] = mean

    def end(self, view: SnapshotView) -> None:
        for scopes in (self.rates, self.transfers, self.links):
            scopes.sweep(view.now)


def spans_servers(role: str, transfers: bool, tp: int, local_gpus: int, rdma_busy: Sequence[str]) -> str:
    """Why this target's work crosses servers, in words ("" when nothing says it does)."""
    if role in ("prefill", "decode"):
        return f"a {role} instance of a prefill/decode disaggregated deployment: KV caches cross the network"
    if transfers:
        return "KV transfers between instances are reported"
    if local_gpus and tp > local_gpus:
        return f"tensor parallel over {tp} GPUs with {local_gpus} on this server"
    if rdma_busy:
        return "the engine's RDMA links carry traffic (" + ", ".join(rdma_busy[:MAX_LINKS_NAMED]) + ")"
    return ""


def _links(links: Sequence[LinkView], errors: Mapping[str, float], utilization: Mapping[str, float]
           ) -> dict[str, Any]:
    util, what = None, ""
    down, erring, busy_rdma = [], [], []
    mine = [link for link in links if link.engine]
    for link in mine:
        up = link.get(NET_UP)
        if up is not None and up < 0.5:
            down.append(f"{link.device} ({link.kind or 'link'}) down")
            continue
        u = utilization.get(link.device)
        if u is not None and (util is None or u > util):
            speed = link.get(NET_SPEED)
            rate = f" of {speed * 8 / 1e9:g} Gb/s" if speed else ""
            util, what = u, f"{link.device} ({link.kind or 'link'}){rate}"
        if u is not None and u >= RDMA_BUSY and link.kind in RDMA_KINDS:
            busy_rdma.append(link.device)
        error_rate = errors.get(link.device)
        if error_rate:
            erring.append(f"{link.device} {error_rate:.2g} errors+drops/s")
    return {"link_util": util, "link_what": what, "links_down": tuple(down), "link_errors": tuple(erring),
            "busy_rdma": busy_rdma, "engine_links": len(mine)}


def compute(ctx: Ctx, state: Windows) -> Transfer:
    engine = ctx.engine
    window: RateWindow = state.rates.get(engine.target)
    gauges = {WAITING_KV: v} if (v := engine.get(WAITING_KV)) is not None else {}
    counters = {KV_FAILURES: v} if (v := engine.get(KV_FAILURES)) is not None else {}
    window.observe(ctx.now, counters, gauges)
    p50 = p99 = share = None
    transfers = 0.0
    hist = engine.histograms.get(KV_SECONDS)
    if hist is not None:
        delta = state.transfers.get(engine.target).observe(ctx.now, hist.bounds, hist.counts, hist.series)
        if delta is not None and delta and delta[-1] > 0:
            transfers = delta[-1]
            p50 = histogram_quantile(0.5, hist.bounds, delta)
            p99 = histogram_quantile(0.99, hist.bounds, delta)
            ttft = (ctx.get("quantiles") or {}).get(TTFT)
            ttft50 = ttft.quantile(0.5) if ttft is not None else None
            # A prefill instance's TTFT ends before its KV leaves: only a decode (or unknown) one's includes it.
            if p50 is not None and ttft50 and engine.role != "prefill":
                share = min(1.0, p50 / ttft50)
    links = _links(ctx.view.links, state.link_errors, state.link_util)
    waiting = window.mean(WAITING_KV)
    disaggregated = engine.role in ("prefill", "decode") or transfers > 0 or (waiting or 0) > 0
    spans = spans_servers(engine.role, disaggregated, ctx.tp, len(ctx.gpus), links.pop("busy_rdma"))
    return Transfer(role=engine.role, waiting=waiting, transfer_p50=p50, transfer_p99=p99, transfers=transfers,
                    share=share, failures_per_s=window.rate(KV_FAILURES), spans=spans,
                    parallel=bool(spans) and not disaggregated, **links)


def numbers(t: Transfer) -> dict[str, Any]:
    return {"role": t.role or None, "kv_transfer_waiting_mean": rounded(t.waiting, 2),
            "kv_transfer_p50_seconds": rounded(t.transfer_p50, 6),
            "kv_transfer_p99_seconds": rounded(t.transfer_p99, 6),
            "kv_transfers_in_window": t.transfers, "kv_transfer_share_of_ttft": rounded(t.share),
            "kv_transfer_failures_per_second": rounded(t.failures_per_s), "crosses_servers": t.spans or None,
            "engine_links": t.engine_links, "busiest_engine_link": t.link_what or None,
            "busiest_engine_link_utilization": rounded(t.link_util), "engine_links_down": list(t.links_down),
            "engine_links_with_errors": list(t.link_errors)}


def samples(t: Transfer, key: TargetKey) -> list[Sample]:
    return []


STAGE = Stage(
    name="transfer", compute=compute, samples=samples, numbers=numbers, state=Windows, emits=(),
    after=("quantiles",),
    engine=(WAITING_KV, KV_FAILURES),
    histograms=(KV_SECONDS,),
    host=(NET_UP, NET_SPEED, NET_UTIL, *NET_ERRORS),
)
