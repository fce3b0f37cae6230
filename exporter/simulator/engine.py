"""A continuous-batching engine, step by step, in the way vLLM V1 schedules.

Each step: running sequences first (every decoding sequence takes one token, partial prefills
continue), then waiting requests are admitted while the per-step token budget, the running-slot
limit and the paged KV pool allow (chunked prefill). When a decoding sequence needs a new KV block
and none is free, the most recently admitted sequence is preempted (recompute: its blocks are
freed and it re-enters the front of the queue). Step time comes from the roofline cost model;
the engine-core CPU time overlaps the GPU step, so whichever is longer sets the pace.

Decoding sequences are kept as offsets from a global decode-round counter, so a step costs O(1)
in the number of running sequences (an hour of traffic fast-forwards in seconds).

Prefill/decode disaggregation (`role`): a "prefill" engine prefills its workload's requests, makes
each one's first token and hands the request to `handoff` (exporter/simulator/pd.py), keeping its
KV blocks until the link has sent them (`hold`); a "decode" engine has no traffic of its own, takes
requests whose KV arrived (`receive`) and decodes them without any prefill compute. Requests sent
through the twin's API (`submit`) are served whole by the engine they reach, whatever its role.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from exporter.physics.costs import Batch, Hardware, StepCost, step_cost
from exporter.simulator.workload import Workload, next_poisson
from exporter.specs.models import ModelShape, kv_bytes_per_token, weight_bytes

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    cuda_context_bytes: int = GiB // 2  # per GPU, outside the engine's budget
    activation_reserve_bytes: int = 2 * GiB  # per GPU: activations, CUDA graphs, sampler buffers
    max_model_len: int | None = None  # None: the model's context


@dataclass(frozen=True, slots=True)
class HostConfig:
    """Host CPU work. The API server (HTTP, JSON, chat template, tokenizer, detokenizer) is one
    event-loop thread; the engine core (scheduler, input preparation) is another. Both share
    `cpu_budget_cores` (a cgroup quota, say); when their demand exceeds it both slow down.
    `pinned`: the budget is a cpuset of ceil(budget) CPUs on the GPUs' NUMA node rather than a
    quota over every CPU (exporter/simulator/host.py places the threads). Each thread is serial
    work: it can use one CPU at most, whatever the budget."""

    cpu_budget_cores: float = 8.0
    pinned: bool = False
    request_overhead_s: float = 0.5e-3
    tokenize_tokens_per_s: float = 1.0e6
    detokenize_s_per_token: float = 8e-6
    sched_base_s: float = 0.25e-3
    sched_per_seq_s: float = 3e-6
    sched_per_token_s: float = 0.05e-6


@dataclass(slots=True, eq=False)
class Request:
    rid: int
    arrival: float
    prompt: int
    output: int
    max_tokens: int
    cached: int
    ready_at: float = 0.0
    first_scheduled: float = -1.0
    first_token: float = -1.0
    last_token: float = -1.0
    target: int = 0  # tokens to prefill (prompt, or prompt + generated after a preemption)
    computed: int = 0
    generated: int = 0
    blocks: int = 0
    preemptions: int = 0
    decoding: bool = False
    k0: int = 0  # KV tokens held when decoding started (at round r0)
    r0: int = 0
    g0: int = 0
    epoch: int = 0  # bumps on preemption so stale finish-heap entries are skipped
    cache_applied: bool = False
    external: bool = False  # sent through the twin's API (Engine.submit), not by the workload
    finished_at: float = -1.0  # twin time it finished or was aborted
    aborted: bool = False
    # Prefill/decode disaggregation: when the prefill engine handed the request's KV to the link,
    # when the link started sending it, and when it arrived (twin time); its size in bytes.
    kv_handoff_at: float = -1.0
    kv_start_at: float = -1.0
    kv_done_at: float = -1.0
    kv_bytes: float = 0.0


@dataclass(slots=True)
class Activity:
    """Cumulative work, read by the GPU model and the host model as differences between slices."""

    gpu_busy_s: float = 0.0
    memory_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    dram_bytes: float = 0.0  # per GPU
    flops: float = 0.0  # per GPU
    comm_bytes: float = 0.0  # per GPU, each direction
    host_io_bytes: float = 0.0  # per GPU, host <-> device (token ids, sampled tokens, metadata)
    engine_cpu_s: float = 0.0
    frontend_cpu_s: float = 0.0
    steps: int = 0


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What an engine would log about one step."""

    end: float
    duration_s: float
    decode_seqs: int
    prefill_tokens: int
    prefill_seqs: int
    cost: StepCost
    running: int
    waiting: int


class Observer(Protocol):
    """Engine-format metric recorders implement this (see recorders.py)."""

    def on_arrival(self, req: Request, now: float) -> None: ...
    def on_step(self, rec: StepRecord) -> None: ...
    def on_itl(self, value: float, count: int) -> None: ...
    def on_first_token(self, req: Request, now: float) -> None: ...
    def on_finish(self, req: Request, now: float, reason: str) -> None: ...
    def on_preempt(self, req: Request, now: float) -> None: ...
    def on_prefix_cache(self, queries: int, hits: int) -> None: ...
    def on_abort(self, req: Request, now: float) -> None: ...
    def on_kv_sent(self, req: Request, now: float) -> None: ...
    def on_kv_received(self, req: Request, now: float) -> None: ...


# Decode rounds whose end time the engine remembers (Engine.token_time): the API reads its
# requests' progress every few milliseconds, a few rounds at a time; 8 bytes a round.
ROUND_RING = 1 << 14


@dataclass(slots=True)
class _Arrivals:
    workload: Workload
    base_rate: float  # requests/s for load 1.0 of this workload
    started_at: float
    next_at: float = math.inf

    def rate(self, surge: bool) -> float:
        w = self.workload
        if w.rate_rps is not None:
            return w.rate_rps * (w.surge_load / w.load if surge and w.load else 1.0)
        return self.base_rate * (w.surge_load if surge else w.load)


@dataclass(slots=True)
class EngineState:
    """Gauges a recorder renders (read-only view, built on demand)."""

    now: float
    running: int
    waiting: int
    frontend_queue: int
    kv_blocks_total: int
    kv_blocks_used: int
    block_size: int
    max_num_seqs: int
    max_batched_tokens: int
    max_model_len: int
    decode_context_tokens: int
    kv_tokens_used: int
    role: str = "both"  # prefill | decode | both (not disaggregated)
    kv_sending: int = 0  # prefill: requests whose KV waits for or crosses the link (SGLang's inflight queue)
    # decode: KV requested, waiting for or crossing the link (the decode asks at once; the link's
    # FIFO queues it: SGLang's transfer queue, vLLM's in_progress stage)
    kv_receiving: int = 0
    kv_arrived_waiting: int = 0  # decode: KV arrived, request not running yet


@dataclass(slots=True)
class _Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    arrived: int = 0
    prefill_computed_tokens: int = 0
    aborted: int = 0


class Engine:
    def __init__(
        self,
        hw: Hardware,
        model: ModelShape,
        cfg: EngineConfig,
        host: HostConfig,
        workload: Workload,
        rng: random.Random,
        observer: Observer,
        *,
        base_rate_rps: float = 1.0,
        now: float = 0.0,
        role: str = "both",
    ) -> None:
        if role not in ("both", "prefill", "decode"):
            raise ValueError(f"engine role {role!r}: both, prefill or decode")
        self.role = role
        # prefill: called with each request whose first token is made (the PD link takes its KV);
        # returns the twin time its KV has left, when the engine frees its blocks.
        self.handoff: Callable[[Request, float], float] | None = None
        self.held: list[tuple[float, int, Request]] = []  # prefill: (release at, rid, request) heap
        self.inbox: deque[Request] = deque()  # decode: handed off, KV not arrived (kv_done_at order)
        self.arrived: deque[Request] = deque()  # decode: KV arrived, waiting for a slot and blocks
        self.hw = hw
        self.model = model
        self.cfg = cfg
        self.host = host
        self.rng = rng
        self.observer = observer
        self.t = now
        self.num_blocks = kv_pool_blocks(hw, model, cfg)
        if self.num_blocks < 1:
            raise ValueError(
                f"{model.name} ({weight_bytes(model) / GiB:.0f} GiB of weights) does not fit on "
                f"{hw.tp} x {hw.gpu.display}; use more GPUs (--gpus) or a smaller model"
            )
        self.max_model_len = min(cfg.max_model_len or model.max_context, self.num_blocks * cfg.block_size)
        self.free_blocks = self.num_blocks
        self.running: dict[int, Request] = {}  # in admission order; preemption takes the last
        self.prefilling: dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self.frontend: deque[Request] = deque()  # being tokenized, ready_at non-decreasing
        self.frontend_free_at = now
        self.R = 0  # decode rounds so far
        self.round_end = array("d", bytes(8 * ROUND_RING))  # round r ended at round_end[r % ROUND_RING]
        self.n_decoding = 0
        self.decode_ctx = 0  # KV tokens held by decoding sequences, summed
        self.phase = [0] * cfg.block_size
        self.finish_heap: list[tuple[int, int, int]] = []
        self.by_id: dict[int, Request] = {}
        self.next_rid = 0
        self.cpu_speed = 1.0  # set by the host model: < 1 when the CPU budget is oversubscribed
        self.clock_ratio = 1.0  # set by the GPU model: SM clock / max under throttling
        self.activity = Activity()
        self.counters = _Counters()
        self.last_step: StepRecord | None = None
        self.arrivals = _Arrivals(workload, base_rate_rps, now)
        self._start_arrivals(now)

    # --- traffic --------------------------------------------------------------------------

    def set_workload(self, workload: Workload, base_rate_rps: float) -> None:
        """Switch traffic at run time; requests in flight stay."""
        self.arrivals = _Arrivals(workload, base_rate_rps, self.t)
        self._start_arrivals(self.t)

    def _start_arrivals(self, now: float) -> None:
        w = self.arrivals.workload
        if w.arrival == "fixed":
            in_flight = sum(1 for r in self.by_id.values() if not r.external)
            for _ in range(max(0, w.concurrency - in_flight)):
                self._arrive(now)
            self.arrivals.next_at = math.inf
        elif w.arrival == "poisson":
            self._schedule_next_arrival(now)
        else:
            self.arrivals.next_at = math.inf

    def _schedule_next_arrival(self, now: float) -> None:
        a = self.arrivals
        w = a.workload
        switch = None if w.surge_after_s is None else a.started_at + w.surge_after_s
        surge_now = switch is not None and now >= switch
        a.next_at = next_poisson(self.rng, now, a.rate(surge_now), a.rate(True), switch)

    def _arrive(self, now: float) -> None:
        w = self.arrivals.workload
        limit = self.max_model_len
        prompt = min(w.prompt.sample(self.rng), limit - 1)
        max_tokens = max(1, min(w.output.hi, limit - prompt))
        output = min(w.output.sample(self.rng), max_tokens)
        cached = int(prompt * w.prefix_hit_rate) // self.cfg.block_size * self.cfg.block_size
        self._enqueue(Request(self.next_rid, now, prompt, output, max_tokens, min(cached, prompt - 1), target=prompt),
                      now)

    def submit(self, prompt: int, max_tokens: int) -> Request:
        """A request from outside (the twin's OpenAI-compatible API), arriving now: it queues,
        batches and is counted like the workload's own, never stops early (output = max_tokens),
        and finds nothing in the prefix cache. Read its progress with `generated()` and
        `token_time()`; `abort()` it if its client goes away."""
        if prompt < 1 or max_tokens < 1 or prompt + max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({prompt}) + max_tokens ({max_tokens}) must fit the model's "
                             f"{self.max_model_len} tokens, each at least 1")
        req = Request(self.next_rid, self.t, prompt, max_tokens, max_tokens, 0, target=prompt, external=True)
        self._enqueue(req, self.t)
        return req

    def _enqueue(self, req: Request, now: float) -> None:
        prompt = req.prompt
        self.next_rid += 1
        self.by_id[req.rid] = req
        self.counters.arrived += 1
        # The API server is one event-loop thread: tokenization queues behind earlier work.
        service = (self.host.request_overhead_s + prompt / self.host.tokenize_tokens_per_s) / self.cpu_speed
        start = max(now, self.frontend_free_at)
        req.ready_at = start + service
        self.frontend_free_at = req.ready_at
        self.activity.frontend_cpu_s += service * self.cpu_speed
        self.frontend.append(req)
        self.observer.on_arrival(req, now)

    def _admit_ready(self) -> None:
        # An idle engine wakes on its first request and forms the batch after its per-step CPU work
        # (scheduling, input preparation): requests that clients sent together (a closed loop whose
        # answers ended in one step) but the API server handed over one after another join it.
        if not self.frontend or self.frontend[0].ready_at > self.t:
            return
        idle = not (self.running or self.waiting or self.arrived)
        horizon = self.t + (self.hw.step_overhead_s if idle else 0.0)
        while self.frontend and self.frontend[0].ready_at <= horizon:
            req = self.frontend.popleft()
            self.waiting.append(req)
            self.t = max(self.t, req.ready_at)  # the batch forms once its last request is handed over

    def _next_event_time(self) -> float:
        nxt = self.arrivals.next_at
        if self.frontend:
            nxt = min(nxt, self.frontend[0].ready_at)
        if self.held:
            nxt = min(nxt, self.held[0][0])
        if self.inbox:
            nxt = min(nxt, self.inbox[0].kv_done_at)
        return nxt

    # --- main loop ------------------------------------------------------------------------

    def advance_to(self, until: float) -> None:
        """Run steps until engine time reaches `until` (the last step may end a little past it)."""
        while self.t < until:
            while self.arrivals.next_at <= self.t:
                at = self.arrivals.next_at
                self._arrive(at)
                self._schedule_next_arrival(at)
            self._admit_ready()
            if self.held or self.inbox:
                self._kv_events()
            if (self.running or self.waiting or self.arrived) and self._step():
                continue
            # Nothing schedulable: the GPU idles until the next arrival or tokenized request.
            self.t = min(until, max(self.t, self._next_event_time()))

    def _step(self) -> bool:
        cfg = self.cfg
        bs = cfg.block_size
        preempted = False
        if self.arrived:
            self._admit_arrived()

        # 1. Decoding sequences each need a new block when their KV crosses a block boundary.
        need = self.phase[(-self.R) % bs] if self.n_decoding else 0
        while need > self.free_blocks and self.running:
            victim = self.running[next(reversed(self.running))]
            if victim.decoding and (victim.k0 - victim.r0 + self.R) % bs == 0:
                need -= 1
            self._preempt(victim)
            preempted = True
        self.free_blocks -= need
        budget = cfg.max_batched_tokens - self.n_decoding

        # 2. Partial prefills continue; 3. waiting requests are admitted (not after a preemption).
        chunks: list[tuple[Request, int, int]] = []
        for req in list(self.prefilling.values()):
            if budget <= 0:
                break
            if req.rid not in self.prefilling:
                continue  # preempted while making room for an earlier one
            chunk = self._allocate_chunk(req, budget, may_preempt=True)
            if chunk is None:
                preempted = True
                continue
            chunks.append((req, req.computed, chunk))
            budget -= chunk
        if not preempted:
            while budget > 0 and self.waiting and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                if not req.cache_applied:
                    req.cache_applied = True
                    req.computed = req.cached
                    self.observer.on_prefix_cache(req.prompt, req.cached)
                chunk = self._allocate_chunk(req, budget, may_preempt=False)
                if chunk is None:
                    break  # KV pool full: new requests wait
                self.waiting.popleft()
                self.running[req.rid] = req
                self.prefilling[req.rid] = req
                if req.first_scheduled < 0:
                    req.first_scheduled = self.t
                chunks.append((req, req.computed, chunk))
                budget -= chunk

        n_dec = self.n_decoding
        if n_dec == 0 and not chunks:
            return False
        prefill_tokens = sum(c for _, _, c in chunks)
        finishing = sum(1 for r, start, c in chunks if start + c == r.target)
        batch = Batch(
            decode_seqs=n_dec,
            decode_context=self.decode_ctx,
            prefill_tokens=prefill_tokens,
            prefill_context=sum(c * (start + c / 2.0) for _, start, c in chunks),
            prefill_cached_read=sum(start for _, start, _ in chunks),
            logits_tokens=n_dec + finishing,
        )
        cost = step_cost(self.hw, self.model, batch, clock_ratio=self.clock_ratio)
        host = self.host
        cpu = (host.sched_base_s + host.sched_per_seq_s * len(self.running)
               + host.sched_per_token_s * batch.tokens) / self.cpu_speed
        # The engine core prepares step n+1 while the GPU runs step n: the longer one sets the pace.
        wall = max(cost.time_s, cpu)
        self.t += wall
        self._account(cost, cpu, n_dec + finishing)

        if n_dec:
            self.R += 1
            self.round_end[self.R % ROUND_RING] = self.t
            self.decode_ctx += n_dec
            self.counters.generation_tokens += n_dec
            self.observer.on_itl(wall, n_dec)
            self._detokenize(n_dec)
            self._finish_decoded()
        for req, start, c in chunks:
            req.computed = start + c
            self.counters.prefill_computed_tokens += c
            if req.computed == req.target:
                self._prefill_done(req)
        rec = StepRecord(self.t, wall, n_dec, prefill_tokens, len(chunks), cost, len(self.running), len(self.waiting))
        self.last_step = rec
        self.observer.on_step(rec)
        return True

    def _account(self, cost: StepCost, cpu_s: float, sampled_tokens: int) -> None:
        a = self.activity
        a.gpu_busy_s += cost.time_s
        a.memory_s += cost.memory_time_s
        a.compute_s += cost.compute_time_s
        a.comm_s += cost.comm_time_s
        a.dram_bytes += cost.bytes_per_gpu
        a.flops += cost.flops_per_gpu
        a.comm_bytes += cost.comm_bytes_per_gpu
        # Input ids, positions, block tables and sampled ids cross PCIe each step.
        a.host_io_bytes += 16 * 1024 + 64 * sampled_tokens + 8 * len(self.running)
        a.engine_cpu_s += cpu_s * self.cpu_speed
        a.steps += 1

    def _detokenize(self, tokens: int) -> None:
        # Streaming detokenization and SSE framing run on the API-server thread, delaying tokenization.
        work = tokens * self.host.detokenize_s_per_token / self.cpu_speed
        self.frontend_free_at = max(self.frontend_free_at, self.t) + work
        self.activity.frontend_cpu_s += work * self.cpu_speed

    def _allocate_chunk(self, req: Request, budget: int, *, may_preempt: bool) -> int | None:
        bs = self.cfg.block_size
        chunk = min(req.target - req.computed, budget)
        need = -(-(req.computed + chunk) // bs) - req.blocks
        while may_preempt and need > self.free_blocks and len(self.running) > 1:
            victim = self.running[next(reversed(self.running))]
            if victim is req:
                break
            self._preempt(victim)
        if need > self.free_blocks:
            # Take what fits (a partial chunk), else nothing.
            chunk = (req.blocks + self.free_blocks) * bs - req.computed
            if chunk <= 0:
                if may_preempt:
                    self._preempt(req)
                return None
            chunk = min(chunk, budget)
            need = -(-(req.computed + chunk) // bs) - req.blocks
        self.free_blocks -= need
        req.blocks += need
        return chunk

    def _prefill_done(self, req: Request) -> None:
        now = self.t
        self.prefilling.pop(req.rid, None)
        req.generated += 1
        self.counters.generation_tokens += 1
        if req.first_token < 0:
            req.first_token = now
            self.counters.prompt_tokens += req.prompt
            self.observer.on_first_token(req, now)
        else:
            self.observer.on_itl(now - req.last_token, 1)  # recompute after preemption: a long gap
        req.last_token = now
        if self.role == "prefill" and not req.external and self.handoff is not None:
            self._hand_off(req)
            return
        if req.generated >= req.output:
            self._finish(req)
            return
        req.decoding = True
        req.k0, req.r0, req.g0 = req.computed, self.R, req.generated
        req.blocks = 0  # from here the block count follows from k (ceil(k / block_size))
        self.phase[(req.k0 - req.r0) % self.cfg.block_size] += 1
        self.n_decoding += 1
        self.decode_ctx += req.k0
        heapq.heappush(self.finish_heap, (self.R + req.output - req.generated, req.rid, req.epoch))

    # --- prefill/decode disaggregation ---------------------------------------------------------

    def _hand_off(self, req: Request) -> None:
        """Prefill side: the first token is made; the KV stays in this engine's blocks (out of the
        running batch, in SGLang's inflight queue) until the link has sent it."""
        assert self.handoff is not None
        self.running.pop(req.rid, None)
        req.kv_handoff_at = self.t
        release_at = self.handoff(req, self.t)
        heapq.heappush(self.held, (release_at, req.rid, req))

    def _kv_events(self) -> None:
        """KV that left (prefill: free its blocks, the request is done here) or arrived (decode:
        the request waits for a slot) by now."""
        while self.held and self.held[0][0] <= self.t:
            _, _, req = heapq.heappop(self.held)
            if self.by_id.get(req.rid) is not req:
                continue
            self.observer.on_kv_sent(req, req.kv_done_at)
            self._release(req)
            req.finished_at = req.kv_done_at
            self.counters.finished += 1
            self.observer.on_finish(req, self.t, "length")
        while self.inbox and self.inbox[0].kv_done_at <= self.t:
            req = self.inbox.popleft()
            self.observer.on_kv_received(req, req.kv_done_at)
            self.arrived.append(req)

    def receive(self, req: Request) -> None:
        """Decode side: a request whose KV the link delivers at `req.kv_done_at` (non-decreasing:
        the link is FIFO). It joins this engine with a new id; its arrival is the client's."""
        req.rid = self.next_rid
        self.next_rid += 1
        self.by_id[req.rid] = req
        self.counters.arrived += 1
        self.observer.on_arrival(req, req.arrival)
        self.inbox.append(req)

    def _admit_arrived(self) -> None:
        """Requests whose KV arrived take a slot and the blocks their prompt fills, and decode from
        the next step on: no prefill compute here (the transferred first token is streamed now, so
        this instance's TTFT includes the transfer)."""
        bs = self.cfg.block_size
        while self.arrived and len(self.running) < self.cfg.max_num_seqs:
            req = self.arrived[0]
            need = -(-req.prompt // bs)
            if need > self.free_blocks:
                return
            self.arrived.popleft()
            self.free_blocks -= need
            req.blocks = need
            req.computed = req.target = req.prompt
            req.first_scheduled = self.t
            req.ready_at = min(req.ready_at, self.t)
            self.running[req.rid] = req
            self._prefill_done(req)

    def _finish_decoded(self) -> None:
        heap = self.finish_heap
        while heap and heap[0][0] <= self.R:
            _, rid, epoch = heapq.heappop(heap)
            req = self.by_id.get(rid)
            if req is None or req.epoch != epoch or not req.decoding:
                continue
            self._stop_decoding(req)
            req.last_token = self.t
            self._finish(req)

    def _stop_decoding(self, req: Request) -> int:
        """Take a sequence out of the decode set; returns the KV blocks it holds."""
        bs = self.cfg.block_size
        m = self.R - req.r0
        k = req.k0 + m
        req.generated = req.g0 + m
        self.phase[(req.k0 - req.r0) % bs] -= 1
        self.n_decoding -= 1
        self.decode_ctx -= k
        req.decoding = False
        req.epoch += 1
        req.computed = k
        req.blocks = -(-k // bs)
        return req.blocks

    def _release(self, req: Request) -> None:
        """Free a request's KV blocks and forget it: what finishing and aborting share."""
        self.free_blocks += req.blocks
        req.blocks = 0
        self.running.pop(req.rid, None)
        self.prefilling.pop(req.rid, None)
        self.by_id.pop(req.rid, None)
        req.finished_at = self.t

    def _finish(self, req: Request) -> None:
        self._release(req)
        self.counters.finished += 1
        reason = "length" if req.generated >= req.max_tokens else "stop"
        self.observer.on_finish(req, self.t, reason)
        if self.arrivals.workload.arrival == "fixed" and not req.external:
            # Closed loop: the client sends its next request once it has turned the answer around.
            self._arrive(self.t + self.arrivals.workload.think_s)

    def abort(self, req: Request) -> bool:
        """Take a request out wherever it is (tokenizing, waiting, prefilling, decoding) and free
        its KV blocks, as an engine does when the client disconnects; False if it had finished."""
        if req.finished_at >= 0 or self.by_id.get(req.rid) is not req:
            return False
        if req.decoding:
            self._stop_decoding(req)  # its finish-heap entry goes stale with the epoch
            req.last_token = self.t
        # A queued request sits in one of the deques: O(queue), only on an abort.
        for queue in (self.frontend, self.waiting):
            if req in queue:
                queue.remove(req)
        self._release(req)
        req.aborted = True
        self.counters.aborted += 1
        self.observer.on_abort(req, self.t)
        return True

    def drain(self) -> int:
        """The workload's own clients go away (a traffic switch, exporter/simulator/twin.py): each of
        their requests is aborted wherever it is (tokenizing, waiting, prefilling, decoding) and its KV
        blocks freed, as `abort` does for one client; requests sent through the API stay. Counters
        keep counting (the aborts under finish reason abort). Returns how many were aborted. Not for
        an instance of a prefill/decode pair (its requests also sit on the KV link)."""
        own = [req for req in self.by_id.values() if not req.external]
        if not own:
            return 0
        kept = [req for req in self.frontend if req.external]
        self.frontend.clear()
        waiting = [req for req in self.waiting if req.external]
        self.waiting.clear()
        self.waiting.extend(waiting)
        for req in own:
            if req.decoding:
                self._stop_decoding(req)
                req.last_token = self.t
            self._release(req)
            req.aborted = True
            self.counters.aborted += 1
            self.observer.on_abort(req, self.t)
        # The API server's thread no longer has the old traffic to tokenize (or detokenize): the
        # requests still queued there move up, never later than they were due.
        free = self.t
        for req in kept:
            service = (self.host.request_overhead_s + req.prompt / self.host.tokenize_tokens_per_s) / self.cpu_speed
            req.ready_at = min(req.ready_at, max(free, req.arrival) + service)
            free = req.ready_at
            self.frontend.append(req)
        self.frontend_free_at = free
        return len(own)

    def _preempt(self, req: Request) -> None:
        if req.decoding:
            self._stop_decoding(req)
            req.last_token = self.t
        self.free_blocks += req.blocks
        req.blocks = 0
        req.computed = 0
        req.target = req.prompt + req.generated
        req.preemptions += 1
        self.running.pop(req.rid, None)
        self.prefilling.pop(req.rid, None)
        self.waiting.appendleft(req)
        self.counters.preemptions += 1
        self.observer.on_preempt(req, self.t)

    # --- views ----------------------------------------------------------------------------

    def generated(self, req: Request) -> int:
        """Tokens the request has so far: a decoding sequence's count follows from the round."""
        return req.g0 + self.R - req.r0 if req.decoding else req.generated

    def token_time(self, req: Request, k: int) -> float:
        """Twin time at which the request's k-th token (1-based, k <= generated(req)) came out.
        The first token of each (re)prefill is at `last_token`; tokens of the latest decode run
        (after token g0, started at round r0) at the end of their round, while the ring holds it."""
        if req.decoding:
            if k <= req.g0:
                return req.last_token
        elif k >= req.generated or k <= req.g0:
            return req.last_token
        r = req.r0 + k - req.g0
        if 0 < r <= self.R and self.R - r < ROUND_RING:
            return self.round_end[r % ROUND_RING]
        return req.last_token if not req.decoding else self.t

    def kv_blocks_used(self) -> int:
        return self.num_blocks - self.free_blocks

    def state(self) -> EngineState:
        return EngineState(
            now=self.t,
            running=len(self.running),
            waiting=len(self.waiting),
            frontend_queue=len(self.frontend),
            kv_blocks_total=self.num_blocks,
            kv_blocks_used=self.kv_blocks_used(),
            block_size=self.cfg.block_size,
            max_num_seqs=self.cfg.max_num_seqs,
            max_batched_tokens=self.cfg.max_batched_tokens,
            max_model_len=self.max_model_len,
            decode_context_tokens=self.decode_ctx,
            kv_tokens_used=self.decode_ctx + sum(r.computed for r in self.prefilling.values())
            + sum(r.computed for _, _, r in self.held),
            role=self.role,
            kv_sending=len(self.held),
            kv_receiving=len(self.inbox),
            kv_arrived_waiting=len(self.arrived),
        )


def kv_pool_blocks(hw: Hardware, model: ModelShape, cfg: EngineConfig) -> int:
    """Blocks = what fits in the engine's memory share after weights and reserves, per GPU;
    each GPU holds its shard of every block, so the count is the same on all of them."""
    budget = hw.gpu.memory_bytes * cfg.gpu_memory_utilization
    free = budget - weight_bytes(model) / hw.tp - cfg.activation_reserve_bytes
    block_bytes = cfg.block_size * kv_bytes_per_token(model) / min(hw.tp, model.kv_heads)
    return max(0, int(free // block_bytes))


def engine_memory_used_bytes(hw: Hardware, cfg: EngineConfig) -> float:
    """What NVML shows as used per GPU: the engine preallocates its whole share at start-up,
    so memory used stays flat whatever the load (a classic source of confusion)."""
    return hw.gpu.memory_bytes * cfg.gpu_memory_utilization + cfg.cuda_context_bytes


@dataclass(frozen=True, slots=True)
class Capacity:
    rps: float
    batch: float
    decode_step_s: float
    prefill_s: float


def estimate_capacity(hw: Hardware, model: ModelShape, cfg: EngineConfig, host: HostConfig,
                      workload: Workload) -> Capacity:
    """Requests/s this engine sustains for the workload's mean lengths: decode at the largest batch
    that slots and KV allow, plus each request's prefill. Used to express load as a fraction."""
    p = workload.prompt.mean
    o = max(1.0, workload.output.mean)
    blocks = kv_pool_blocks(hw, model, cfg)
    kv_tokens = blocks * cfg.block_size
    batch = max(1.0, min(cfg.max_num_seqs, kv_tokens / (p + o)))
    ctx = p + o / 2
    dec = step_cost(hw, model, Batch(decode_seqs=int(batch), decode_context=int(batch * ctx),
                                     logits_tokens=int(batch)))
    cpu = host.sched_base_s + host.sched_per_seq_s * batch
    step = max(dec.time_s, cpu)
    new = p * (1 - workload.prefix_hit_rate)
    pre = step_cost(hw, model, Batch(prefill_tokens=int(new), prefill_context=new * (p - new / 2),
                                     prefill_cached_read=int(p - new), logits_tokens=1))
    per_request = o * step / batch + pre.time_s
    return Capacity(rps=1.0 / per_request, batch=batch, decode_step_s=step, prefill_s=pre.time_s)

