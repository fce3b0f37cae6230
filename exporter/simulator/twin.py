"""The digital twin: one engine on N GPUs (or, data parallel, several such engines behind one API
server, as vLLM's --data-parallel-size runs them), its metrics page, and the GPUs' NVML view,
advanced together slice by slice so every number comes from the same step-by-step model.

With prefill/decode disaggregation (a scenario with `pd`), a twin is one instance of a pair
(`role` prefill or decode) and a `PdPair` (exporter/simulator/pd.py) advances both; build both with
`pd_pair(config)`."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.physics.costs import Hardware, NetworkLink
from exporter.simulator.engine import (
    Activity,
    Engine,
    EngineConfig,
    HostConfig,
    engine_memory_used_bytes,
    estimate_capacity,
    kv_pool_blocks,
)
from exporter.simulator.gpu import GpuModel, Slice, library_error
from exporter.simulator.host import HostModel, HostTopology
from exporter.simulator.pd import PdPair, pd_base_rate
from exporter.simulator.recorders import FORMATS, Recorder, make_recorder, render_merged
from exporter.simulator.scenarios import Scenario, get_scenario
from exporter.simulator.workload import Workload
from exporter.specs.gpus import GpuSpec, known_gpus, lookup_gpu
from exporter.specs.models import ModelShape, kv_bytes_per_token, load_model, weight_bytes

DEFAULT_GPU = "NVIDIA H100 80GB HBM3"
DEFAULT_MODEL = "llama-3.1-8b"

# llama.cpp serves a handful of slots (-np) with one context each; the others batch widely.
FORMAT_ENGINE_DEFAULTS: Mapping[str, EngineConfig] = {
    "vllm": EngineConfig(),
    "sglang": EngineConfig(gpu_memory_utilization=0.88),
    "tgi": EngineConfig(max_num_seqs=128, max_batched_tokens=4096),
    "llamacpp": EngineConfig(max_num_seqs=4, max_batched_tokens=2048, block_size=256),
}


@dataclass(frozen=True, slots=True)
class TwinConfig:
    scenario: str = "decode-heavy"
    engine_format: str = "vllm"
    gpu: str = DEFAULT_GPU
    model: str = DEFAULT_MODEL
    gpus: int = 1
    seed: int = 0
    gpu_index_base: int = 0  # first NVML index, so several twins on one demo host do not collide
    gpu_overrides: Mapping[str, float] | None = None
    engine: EngineConfig | None = None  # None: the format's defaults
    slice_s: float = 0.25  # GPU/host model resolution
    # The engine pinned to CPUs of a NUMA node that holds none of its GPUs (exporter/simulator/host.py).
    numa_mismatch: bool = False
    host: HostTopology = HostTopology()
    epoch: float | None = None  # wall-clock seconds at twin time 0 (None: now)
    # vLLM data parallel: this many engines, each on `gpus` GPUs of its own and its own share of the
    # traffic (each sees the scenario's rate), reported on one page with an `engine` label each.
    data_parallel: int = 1
    # Prefill/decode disaggregation: this twin's instance of the pair (both: not disaggregated).
    role: str = "both"


# The management port every simulated server has beside its GPU fabric: 10 GbE, carrying the
# exporter's scrapes, logs and SSH (bytes/s each way), never the engine's data.
MANAGEMENT = NetworkLink(device="eth0", kind="ethernet", bytes_per_s=1.25e9, latency_s=50e-6, numa_node=0,
                         mtu_bytes=1500)
MANAGEMENT_RX_BYTES_PER_S = 40e3
MANAGEMENT_TX_BYTES_PER_S = 120e3
MANAGEMENT_PACKET_BYTES = 800


def pd_pair(config: TwinConfig, *, decode_gpu_index_base: int | None = None) -> PdPair[Twin]:
    """The prefill and decode twins of a PD scenario (`config.scenario` declares `pd`), joined by
    their KV link; the decode twin's GPUs follow the prefill twin's in NVML index."""
    prefill = Twin(dataclasses.replace(config, role="prefill"))
    base = decode_gpu_index_base if decode_gpu_index_base is not None else config.gpu_index_base + prefill.hw.tp
    decode = Twin(dataclasses.replace(config, role="decode", seed=config.seed + 1, gpu_index_base=base,
                                      epoch=prefill.epoch))
    return PdPair(prefill, decode)


def _healthy(hw: Hardware) -> Hardware:
    return dataclasses.replace(hw, interconnect="auto", pcie_gen=None, pcie_width=None)


class Twin:
    """Drive with `advance_to(t)` / `fast_forward(s)` (twin time in seconds from start), read with
    `metrics_text()` and `gpu_state()`, steer with `set_scenario()` and `restart()`."""

    def __init__(self, config: TwinConfig | None = None, *, gpu_spec: GpuSpec | None = None,
                 model_shape: ModelShape | None = None) -> None:
        self.config = cfg = config or TwinConfig()
        if cfg.engine_format not in FORMATS:
            raise ValueError(f"unknown engine format {cfg.engine_format!r}; one of {', '.join(FORMATS)}")
        spec = gpu_spec or lookup_gpu(cfg.gpu, cfg.gpu_overrides)
        if spec is None:
            raise ValueError(f"unknown GPU {cfg.gpu!r}: the twin knows "
                             + ", ".join(sorted({g.key for g in known_gpus()}))
                             + " (by key or NVML name); another GPU needs its peak numbers as overrides")
        try:
            self.model = model_shape or load_model(cfg.model)
        except KeyError as error:  # an unknown built-in name: say it as the ValueError callers report
            raise ValueError(str(error.args[0]) if error.args else f"unknown model {cfg.model!r}") from None
        self.scenario = get_scenario(cfg.scenario)
        if cfg.role not in ("both", "prefill", "decode"):
            raise ValueError(f"role {cfg.role!r}: both, prefill or decode")
        if (self.scenario.pd is not None) != (cfg.role != "both"):
            raise ValueError(f"scenario {cfg.scenario!r} " + (
                "needs a prefill/decode pair (exporter.simulator.twin.pd_pair; the demo starts both)"
                if self.scenario.pd is not None else "runs no prefill/decode pair: role must be both"))
        if cfg.role != "both" and cfg.data_parallel != 1:
            raise ValueError("a prefill/decode instance runs one engine (no data parallel)")
        self.pair: PdPair[Twin] | None = None  # set by PdPair
        self.epoch = time.time() if cfg.epoch is None else cfg.epoch
        self.rng = random.Random(cfg.seed)
        self.engine_cfg = cfg.engine or FORMAT_ENGINE_DEFAULTS[cfg.engine_format]
        if cfg.data_parallel < 1 or (cfg.data_parallel > 1 and cfg.engine_format != "vllm"):
            raise ValueError(f"data parallel {cfg.data_parallel}: a positive size, and only the vllm format has it")
        tp = max(cfg.gpus, self.scenario.min_gpus)
        self.hw = self._hardware(Hardware(spec, tp=tp), self.scenario)
        # One GPU model per data-parallel engine, on consecutive NVML indexes.
        memory_used = engine_memory_used_bytes(self.hw, self.engine_cfg)
        self.gpu_models = [
            GpuModel(self.hw, self.scenario.thermal, memory_used_bytes=memory_used,
                     index_base=cfg.gpu_index_base + rank * tp,
                     rng=random.Random(f"{cfg.seed}/gpus" + (f"/{rank}" if rank else "")))
            for rank in range(cfg.data_parallel)]
        self.gpu = self.gpu_models[0]
        for gpu in self.gpu_models:
            gpu.set_faults(self.scenario.gpu_faults)
        self.restarts = 0
        self._net_comm_base = 0.0
        self._net_sent = 0.0  # bytes the cross-node link has carried each way
        self._kv_sent = 0.0  # bytes the pair's KV link had carried at the last slice
        self._net_steps_base = 0
        self.host_cpu_busy = 0.0  # cores in use, smoothed
        self.host = HostModel(cfg.host, self.scenario.host,
                              gpu_indices=tuple(d.index for gpu in self.gpu_models for d in gpu.devices),
                              numa_mismatch=cfg.numa_mismatch, page_cache_bytes=weight_bytes(self.model))
        self._start_engines(now=0.0)

    # --- construction ---------------------------------------------------------------------

    @staticmethod
    def _hardware(hw: Hardware, sc: Scenario) -> Hardware:
        return dataclasses.replace(hw, interconnect=sc.interconnect, pcie_gen=sc.pcie_gen, pcie_width=sc.pcie_width,
                                   network=sc.network)

    def _base_rate(self, sc: Scenario) -> float:
        if sc.pd is not None:
            # A pair's load is a share of what its KV link carries at the mean prompt.
            return pd_base_rate(sc.pd, kv_bytes_per_token(self.model), sc.workload.prompt.mean)
        return estimate_capacity(_healthy(self.hw), self.model, self.engine_cfg, HostConfig(), sc.workload).rps

    def _workload(self, sc: Scenario) -> Workload:
        """A decode instance has no traffic of its own: its requests come over the KV link."""
        return dataclasses.replace(sc.workload, arrival="none") if self.config.role == "decode" else sc.workload

    def _new_engine(self, now: float, rank: int = 0) -> tuple[Engine, Recorder]:
        sc = self.scenario
        blocks = kv_pool_blocks(self.hw, self.model, self.engine_cfg)
        max_len = min(self.engine_cfg.max_model_len or self.model.max_context, blocks * self.engine_cfg.block_size)
        recorder = make_recorder(self.config.engine_format, self.model.name, self.epoch + now, self.epoch,
                                 max_model_len=max(1, max_len), kv_capacity_tokens=blocks * self.engine_cfg.block_size,
                                 rank=rank, role=self.config.role)
        seed = f"{self.config.seed}/engine/{self.restarts}" + (f"/{rank}" if rank else "")
        engine = Engine(self.hw, self.model, self.engine_cfg, sc.host, self._workload(sc), random.Random(seed),
                        recorder, base_rate_rps=self._base_rate(sc), now=now, role=self.config.role)
        engine.clock_ratio = self.gpu_models[rank].clock_ratio
        if self.pair is not None:
            self.pair.attach(self, engine)
        return engine, recorder

    def _start_engines(self, now: float) -> None:
        pairs = [self._new_engine(now, rank) for rank in range(self.config.data_parallel)]
        self.engines = [engine for engine, _ in pairs]
        self.recorders = [recorder for _, recorder in pairs]
        self.engine, self.recorder = pairs[0]
        self._lasts = [dataclasses.replace(engine.activity) for engine in self.engines]
        self._last_tokens = [0] * len(self.engines)

    def route(self) -> Engine:
        """The engine an API request goes to: the least loaded (vLLM's DP coordinator balances on
        waiting and running requests), the first on a tie."""
        if len(self.engines) == 1:
            return self.engine
        def load(engine: Engine) -> tuple[int, int]:
            state = engine.state()
            return state.waiting, state.running
        return min(self.engines, key=load)

    # --- time -----------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.engine.t

    def advance_to(self, t: float) -> None:
        if self.pair is not None:
            self.pair.advance_to(t)  # both instances of the pair, together
        else:
            self.advance_own(t)

    def advance_own(self, t: float) -> None:
        """This twin's engines and models alone (a PdPair calls it for each of its twins)."""
        while self.engine.t < t:
            end = min(t, self.engine.t + self.config.slice_s)
            start = self.engine.t
            for engine in self.engines:
                engine.advance_to(end)
            self._integrate(self.engine.t - start)

    def fast_forward(self, seconds: float) -> None:
        self.advance_to(self.now + seconds)

    @staticmethod
    def _batched_tokens(engine: Engine) -> int:
        """Tokens the engine's steps have batched so far: prefill chunks and decoded tokens."""
        c = engine.counters
        return c.prefill_computed_tokens + c.generation_tokens

    def _kv_bytes_moved(self) -> float:
        """KV bytes the pair's link carried since the last slice (GPUDirect RDMA: the NIC reads the
        prefill GPU's memory and writes the decode GPU's, over their PCIe links)."""
        if self.pair is None:
            return 0.0
        sent = self.pair.link.bytes_sent(self.engine.t)
        moved, self._kv_sent = max(0.0, sent - self._kv_sent), max(sent, self._kv_sent)
        return moved

    def _integrate(self, dt: float) -> None:
        engine_cpu = frontend_cpu = 0.0
        for rank, (engine, gpu) in enumerate(zip(self.engines, self.gpu_models, strict=True)):
            a: Activity = engine.activity
            b = self._lasts[rank]
            tokens = self._batched_tokens(engine)
            kv = self._kv_bytes_moved() / self.hw.tp  # each GPU holds its shard of every block
            gpu.update(Slice(
                dt=dt, busy_s=a.gpu_busy_s - b.gpu_busy_s, memory_s=a.memory_s - b.memory_s,
                compute_s=a.compute_s - b.compute_s, dram_bytes=a.dram_bytes - b.dram_bytes, flops=a.flops - b.flops,
                comm_bytes=a.comm_bytes - b.comm_bytes, host_io_bytes=a.host_io_bytes - b.host_io_bytes,
                steps=a.steps - b.steps, tokens=tokens - self._last_tokens[rank],
                nic_read_bytes=kv if self.role == "prefill" else 0.0,
                nic_write_bytes=kv if self.role == "decode" else 0.0,
            ))
            self._last_tokens[rank] = tokens
            engine_cpu += a.engine_cpu_s - b.engine_cpu_s
            frontend_cpu += a.frontend_cpu_s - b.frontend_cpu_s
            self._lasts[rank] = dataclasses.replace(a)
        # Host CPU: every thread's demand (work at full speed) against the budget, which the
        # data-parallel engines share.
        used = engine_cpu + frontend_cpu
        if dt > 0:
            speed = self.engine.cpu_speed
            demand = used / dt / speed
            budget = self.scenario.host.cpu_budget_cores
            for engine in self.engines:
                engine.cpu_speed = min(1.0, budget / demand) if demand > 0 else 1.0
            self.host_cpu_busy += (used / dt - self.host_cpu_busy) * min(1.0, dt)
            self.host.update(dt, engine_cpu, frontend_cpu, speed)
        for engine, gpu in zip(self.engines, self.gpu_models, strict=True):
            engine.clock_ratio = gpu.clock_ratio
        if self.hw.link == "network" and self.hw.network is not None and dt > 0:
            # A step's all-reduce bytes are counted when it ends; on the wire they went out at the
            # link's rate during it, so the NIC counter follows at most at that rate.
            total = self._net_comm_base + sum(e.activity.comm_bytes for e in self.engines)
            self._net_sent = min(total, self._net_sent + self.hw.network.bytes_per_s * dt)

    # --- control --------------------------------------------------------------------------

    def set_scenario(self, name: str, *, keep_backlog: bool = False) -> int:
        """Switch traffic, host and hardware condition now. The previous traffic's clients go away:
        their requests, queued or running, are aborted and their KV freed (Engine.drain), so the new
        scenario starts from an empty engine as from a start (its verdict within Expect.within_s),
        not behind the old one's backlog; requests sent through the API stay. Counters keep counting:
        a load change, not an engine restart (`restart()` is that). `keep_backlog`: the old requests
        stay and run on under the new condition (a GPU that starts throttling under full KV). A
        prefill/decode pair only switches to its own scenario and keeps its requests (they also sit
        on the KV link). Returns how many requests were aborted."""
        sc = get_scenario(name)
        if (sc.pd is None) != (self.scenario.pd is None):
            raise ValueError(f"scenario {name!r} needs " + (
                "a prefill/decode pair: start the twin or the demo with --scenario " + name
                if sc.pd is not None else "a twin that is not a prefill/decode pair: start it with --scenario " + name))
        if sc.pd is not None and sc.pd != self.scenario.pd:
            raise ValueError(f"scenario {name!r} needs another KV link: start the twin with --scenario {name}")
        if sc.min_gpus > self.hw.tp:
            raise ValueError(f"scenario {name!r} needs at least {sc.min_gpus} GPUs; start the twin with --gpus "
                             f"{sc.min_gpus}")
        self.scenario = sc
        self.hw = self._hardware(self.hw, sc)
        self.host.set_host(sc.host)
        for engine, gpu in zip(self.engines, self.gpu_models, strict=True):
            engine.hw = self.hw
            engine.host = sc.host
            gpu.set_hardware(self.hw)
            gpu.set_thermal(sc.thermal)
            gpu.set_faults(sc.gpu_faults)
        dropped = 0 if keep_backlog or self.pair is not None else sum(engine.drain() for engine in self.engines)
        for engine in self.engines:
            engine.set_workload(self._workload(sc), self._base_rate(sc))
        return dropped

    def restart(self) -> None:
        """As an engine restart: requests in flight are lost, counters start from zero with a new
        `_created`; the GPUs keep their temperature and energy counter."""
        self.restarts += 1
        # The NIC's counters belong to the host: they keep what the old engine sent.
        self._net_comm_base += sum(e.activity.comm_bytes for e in self.engines)
        self._net_steps_base += sum(e.activity.steps for e in self.engines)
        self._start_engines(self.engine.t)

    # --- views ----------------------------------------------------------------------------

    @property
    def engine_format(self) -> str:
        return self.config.engine_format

    @property
    def role(self) -> str:
        return self.config.role

    @property
    def slice_s(self) -> float:
        return self.config.slice_s

    @property
    def kv_link(self) -> NetworkLink | None:
        """The KV-transfer link of a prefill/decode scenario (None otherwise)."""
        return self.scenario.pd

    def metrics_text(self) -> str:
        info = {"gpu_memory_utilization": str(self.engine_cfg.gpu_memory_utilization), "role": self.config.role,
                "enable_prefix_caching": str(self.scenario.workload.prefix_hit_rate > 0),
                # vLLM's API server sums num_gpu_blocks over its DP engines as they report ready.
                "data_parallel": str(len(self.engines))}
        if len(self.engines) == 1:
            return self.recorder.render(self.engine.state(), info)
        return render_merged([recorder.families(engine.state(), info)
                              for engine, recorder in zip(self.engines, self.recorders, strict=True)])

    def metrics_headers(self) -> dict[str, str]:
        return self.recorder.headers()

    @property
    def content_type(self) -> str:
        return self.recorder.content_type

    def gpu_state(self) -> dict[str, Any]:
        """The JSON /sim/gpu serves and SimGpuSource reads."""
        e = self.engine
        st = e.state()
        last = e.last_step
        return {
            "time": self.epoch + e.t,
            "twin_time_s": e.t,
            "scenario": self.scenario.name,
            "engine_format": self.config.engine_format,
            "model": self.model.name,
            "gpu_spec": self.hw.gpu.key,
            "tp": self.hw.tp,
            "interconnect": self.hw.link if self.hw.tp > 1 else "none",
            "role": self.config.role,
            "gpus": [device for gpu in self.gpu_models for device in gpu.state()],
            "nvml_error": library_error(self.gpu_models),  # a failing NVML library (docs/simulator.md)
            "data_parallel": len(self.engines),
            "engine": {
                "running": st.running, "waiting": st.waiting, "tokenizing": st.frontend_queue,
                "kv_blocks_total": st.kv_blocks_total, "kv_blocks_used": st.kv_blocks_used,
                "block_size": st.block_size, "max_num_seqs": st.max_num_seqs,
                "preemptions_total": e.counters.preemptions, "requests_finished_total": e.counters.finished,
                "requests_aborted_total": e.counters.aborted,
                "prompt_tokens_total": e.counters.prompt_tokens,
                "generation_tokens_total": e.counters.generation_tokens,
                "last_step_s": last.duration_s if last else 0.0,
                "last_step_bound": last.cost.bound if last else "none",
                "restarts": self.restarts,
                "kv_sending": st.kv_sending, "kv_receiving": st.kv_receiving,
                "kv_arrived_waiting": st.kv_arrived_waiting,
            },
            "host": {"cpu_budget_cores": self.scenario.host.cpu_budget_cores,
                     "cpu_busy_cores": round(self.host_cpu_busy, 4), "cpu_speed": round(e.cpu_speed, 4)},
        }

    def host_state(self) -> dict[str, Any]:
        """The JSON /sim/host serves and SimHostSource reads: what /proc and /sys would show on the
        twin's machine (exporter/simulator/host.py)."""
        return {
            "time": self.epoch + self.engine.t,
            "twin_time_s": self.engine.t,
            "scenario": self.scenario.name,
            **self.host.state(engine_cpu_seconds=sum(e.activity.engine_cpu_s + e.activity.frontend_cpu_s
                                                     for e in self.engines),
                              pcie_links=[gpu.pcie_link(d) for gpu in self.gpu_models for d in gpu.devices]),
            "cpu_budget_cores": self.scenario.host.cpu_budget_cores,
            "cpu_busy_cores": round(self.host_cpu_busy, 4),
            "cpu_speed": round(self.engine.cpu_speed, 4),
            "network": self.network_state(),
        }

    def network_state(self) -> list[dict[str, Any]]:
        """The server's network links as the host source reads them (/sys/class/net,
        /sys/class/infiniband): the management port in every scenario; the KV-transfer link of a
        prefill/decode pair; the link a cross-node tensor-parallel group all-reduces over. Counters
        are cumulative, from the twin's start, driven by the same transfers and steps as the rest."""
        t = self.now
        mgmt_rx, mgmt_tx = MANAGEMENT_RX_BYTES_PER_S * t, MANAGEMENT_TX_BYTES_PER_S * t
        links = [_link(MANAGEMENT, engine=False, receive_bytes=mgmt_rx, transmit_bytes=mgmt_tx,
                       receive_packets=int(mgmt_rx // MANAGEMENT_PACKET_BYTES),
                       transmit_packets=int(mgmt_tx // MANAGEMENT_PACKET_BYTES))]
        if self.pair is not None and self.scenario.pd is not None:
            links.append(_link(self.scenario.pd, engine=True, **self.pair.network_counters(self)))
        if self.hw.tp > 1 and self.hw.link == "network" and self.hw.network is not None:
            # A ring all-reduce over two servers: two ring edges cross them, so each node's NIC carries
            # one GPU's share each way (what the steps sent, at most at the link's rate: `_integrate`).
            net = self.hw.network
            comm = self._net_sent
            messages = (self._net_steps_base + sum(e.activity.steps for e in self.engines)) * 2 * self.model.layers
            packets = int(comm // net.mtu_bytes) + messages
            links.append(_link(net, engine=True, receive_bytes=comm, transmit_bytes=comm,
                               receive_packets=packets, transmit_packets=packets))
        return links


def _link(spec: NetworkLink, *, engine: bool, receive_bytes: float, transmit_bytes: float, receive_packets: int,
          transmit_packets: int) -> dict[str, Any]:
    return {"device": spec.device, "kind": spec.kind, "up": True, "speed_bytes_per_s": spec.bytes_per_s,
            "numa_node": spec.numa_node, "engine": engine,
            "receive_bytes": int(receive_bytes), "transmit_bytes": int(transmit_bytes),
            "receive_packets": int(receive_packets), "transmit_packets": int(transmit_packets),
            "receive_errors": 0, "transmit_errors": 0, "receive_drops": 0, "transmit_drops": 0}
