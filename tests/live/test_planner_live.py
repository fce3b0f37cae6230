"""Issue 31 and issue 41 item 4: `llm-exporter plan` against real engines, honest about this machine's
noise. The planner calibrates on one configuration of a real engine (a load test's JSON, or a window of
the running exporter) and predicts others, which are then run for real and measured; only the
calibration's steps ever reach the planner.

llama.cpp serves the planner's validation model (tests/live/tiny_models.py PLAN: 134 M parameters,
275 MB in F16, 146 MB Q8_0, 77 MB Q4_0, far past the CPU's caches). Calibrated on F16 with the tier's
threads, on a load test's sweep at concurrency 1, 2, 4 and 8, it predicts concurrency 3 and 6, Q8_0
and Q4_0 at 1 and 4, and twice the threads at 1 and 4. vLLM (CPU) serves the tiny model: calibrated
at --max-num-seqs 4 on concurrency 1, 2 and 4, it predicts concurrency 3 and --max-num-seqs 8 at 8.
The issue's own example (calibrate at 1 and 4, predict 2 and 8) is run too and reported as
extrapolation, beyond the batches observed.

Noise (tests/live/plan_noise.py): every configuration's server is started once and kept up, and the
sweeps are interleaved in rounds (calibration sweep, each truth sweep, calibration sweep, ...), so a
drift of the shared machine hits calibration and truth alike; each configuration is measured once per
round, ROUNDS times. The measured value is the median over the rounds, and the calibration is given, per
level, the round whose TPOT is the median (a real step). Each configuration's noise floor is
max |run / median - 1| over its rounds; an error counts against the model only beyond it. Each load
test sends prompts no other sent (DATASET_REQUESTS), so no prefix cache serves a later round.

Profiles ($LLM_EXPORTER_PLAN_PROFILE, PROFILES): "short", the default and what `make test-live` runs in
CI, measures F16 at 1, 2, 3, 4 and 8, Q8_0 and both vLLM servers, at the cost of the best-of-two run it
replaced; "full", `make planner-validation` (outside CI), measures every configuration above, and
docs/planner.md's table comes from it. $LLM_EXPORTER_PLAN_ROUNDS sets another number of rounds.

Latencies are compared on the statistic the planner calibrates on and compares (observe.Stat.centre):
the engine's own means where the exporter watched the load test (vLLM, whose API server sends a short
answer in a few chunks), else the load test's medians (llama.cpp). The table (predicted / measured - 1
per configuration, its floor, the medians) is printed and written to
$LLM_EXPORTER_PLAN_TABLE (default: .plan-validation.md); docs/planner.md carries a full one measured here.
What fails: the fit on its own steps missing twice the issue's bar (15% on TPOT and tokens/s, 30% on
TTFT), the held-out medians of the error, beyond the floor or plain, passing the regression gate
(MEDIAN_GATE says why it is not the bar itself), a configuration measured fewer than MIN_RUNS times
(but the two-thread one, Config.may_stall), a prediction missing, or the planner failing on a live
source. Whether the medians meet the bar itself is printed with the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import pytest

import bench.__main__ as bench_main
from exporter.planner.observe import ObserveError, Point, from_loadtest
from exporter.probe.loadtest import words_prompt
from tests.live import engines
from tests.live.plan_noise import Repeats, Table, interleave, median_index
from tests.live.test_live_tier import TARGET, exporter

pytestmark = [pytest.mark.live, pytest.mark.timeout(60 * 60)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT_WORDS = 64
MAX_TOKENS = 48


@dataclasses.dataclass(frozen=True)
class Config:
    """One llama.cpp server: its weights, threads, and the concurrencies swept on it each round."""

    name: str
    wtype: str
    threads: int
    levels: tuple[int, ...]
    # May leave a level unmeasured instead of failing (reported as such in the table): two threads on
    # the 2 shared vCPUs, where a busy neighbour stalls llama.cpp's thread barriers and a request at
    # concurrency 1 outlasted warm-up and window (13 s) in a whole round while one thread ran.
    may_stall: bool = False


# llama.cpp's F16 sweep: the calibration's steps, and the concurrencies between them it predicts.
CALIBRATION_LEVELS = (1, 2, 4, 8)
# The example calibration (1 and 4), predicting 2 and 8: past the batches it observed, where
# llama.cpp's CPU kernels change; reported, not gated (docs/planner.md).
EXTRAPOLATION = ((1, 4), (2, 8))
OTHER_LEVELS = (1, 4)  # each other dtype and thread count
THREADS = engines.ENGINE_THREADS
F16 = Config("f16", "f16", THREADS, (1, 2, 3, 4, 6, 8))
Q8 = Config("q8_0", "q8_0", THREADS, OTHER_LEVELS)
Q4 = Config("q4_0", "q4_0", THREADS, OTHER_LEVELS)
TWO_THREADS = Config("threads", "f16", 2 * THREADS, OTHER_LEVELS, may_stall=True)


@dataclasses.dataclass(frozen=True)
class Profile:
    rounds: int
    warmup: str
    duration: str
    llamacpp: tuple[Config, ...]  # the calibration's server first: each round runs A B C ... in this order
    what: str


# A step is never shorter than 3 s of warm-up and 10 s measured: with the machine loaded, llama.cpp's F16
# requests at concurrency 4 outlasted 2 + 6 s, and a closed loop whose first requests outlast the warm-up
# and the window records none (seen here, so CI keeps fewer configurations rather than shorter steps).
PROFILES = {
    # CI's regression run: 36 steps (3 rounds of 7 on llama.cpp and 5 on vLLM) against the 34 of the
    # best-of-two run it replaced. Q4_0 (beyond the model) and two threads (the noisiest here) are left
    # to the full run; F16 at 3, Q8_0 at 1 and 4 and both vLLM predictions stay.
    "short": Profile(rounds=3, warmup="3s", duration="10s",
                     llamacpp=(dataclasses.replace(F16, levels=(1, 2, 3, 4, 8)), Q8),
                     what="CI's short run (make test-live)"),
    # docs/planner.md's table: every configuration, 51 steps.
    "full": Profile(rounds=3, warmup="3s", duration="10s", llamacpp=(F16, Q8, Q4, TWO_THREADS),
                    what="the full validation (make planner-validation)"),
}
PROFILE_NAME = os.environ.get("LLM_EXPORTER_PLAN_PROFILE") or "short"
PROFILE = PROFILES[PROFILE_NAME]
ROUNDS = int(os.environ.get("LLM_EXPORTER_PLAN_ROUNDS") or PROFILE.rounds)
# A floor needs two runs at least; a step that recorded no request is left out of its configuration.
MIN_RUNS = 2

# The bar: on the steps fitted, and as the median over the held-out configurations.
LIMITS = {"tpot": 0.15, "output_tokens_per_s": 0.15, "ttft": 0.30}
# What fails the test is a regression, not the bar itself. On this shared machine llama.cpp's F16 TPOT at
# concurrency 4 measured 29.7, 49.1, 42.1 and 43.3 ms (best of two) in four runs within 90 minutes, and
# the held-out TPOT median ranged 17-29% with the same code (docs/planner.md). The floor takes the truth's
# own spread out of each error, but not the calibration's, which moves every prediction made from it. The
# fit on its own steps is gated at twice the bar, the held-out medians (beyond the floor, and plain) at
# three times it on TPOT and tokens/s and twice on TTFT; a planner that has lost the physics misses by far
# more.
FIT_GATE = {key: 2.0 * limit for key, limit in LIMITS.items()}
MEDIAN_GATE = {"tpot": 0.45, "output_tokens_per_s": 0.45, "ttft": 0.60}
VLLM_SWEEP = (1, 2, 3, 4)
VLLM_CALIBRATION = (1, 2, 4)
SLOTS = 8


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


# Each load test gets prompts no other has sent: the engines keep a prefix cache (llama.cpp per slot, vLLM
# --enable-prefix-caching), and a round repeating the last round's prompts on the same server measured a
# TTFT of 37-57 ms where the first round's was 510 (seen here). words_prompt numbers each request, so a
# number no other load test used is a prompt no cache has; 8 digits keep every prompt one length.
DATASET_REQUESTS = 6000  # far over the ~1200 requests of the busiest sweep (vLLM, concurrency 1-4)
_BATCHES = itertools.count(1)


def dataset(out: pathlib.Path) -> pathlib.Path:
    """A JSONL of DATASET_REQUESTS prompts of PROMPT_WORDS words (the load test's own words_prompt), numbered
    from a block no other load test of this run uses."""
    first = 10_000_000 + next(_BATCHES) * 10_000
    out.write_text("".join(json.dumps({"prompt": words_prompt(PROMPT_WORDS, first + i), "max_tokens": MAX_TOKENS})
                           + "\n" for i in range(DATASET_REQUESTS)))
    return out


def loadtest(url: str, levels: Sequence[int], out: pathlib.Path, exporter_url: str | None = None, *,
             may_stall: bool = False) -> dict:
    """One pass over `levels` (one round of one configuration), on prompts of its own. With `may_stall`, a
    sweep in which no request failed but none finished in its window (exit 1) is a round that measured
    nothing, not an error."""
    args = ["loadtest", url, "--concurrency", ",".join(map(str, levels)),
            "--dataset", str(dataset(out.with_suffix(".jsonl"))), "--warmup", PROFILE.warmup,
            "--duration", PROFILE.duration, "--json", str(out)]
    if exporter_url:
        args += ["--exporter", exporter_url, "--target", TARGET]
    result = run_cli(*args)
    stalled = (may_stall and result.returncode == 1 and out.exists()
               and not any(step["requests"]["failed"] for step in json.loads(out.read_text())["steps"]))
    assert result.returncode == 0 or stalled, result.stderr[-3000:]
    doc = json.loads(out.read_text())
    sent = sum(int(step["requests"]["ok"]) + int(step["requests"]["failed"]) for step in doc["steps"])
    assert sent < DATASET_REQUESTS // 2, f"{sent} requests recorded: raise DATASET_REQUESTS, or prompts repeat"
    return doc


def measured_point(point: Point) -> dict[str, float]:
    """A run's answer, read as the planner reads a calibration step: the statistic it calibrates on and
    compares (Stat.centre: the engine's means where the exporter watched, else the load test's medians)."""
    assert point.tpot.kind == point.ttft.kind, point
    return {"tpot": point.tpot.centre, "ttft": point.ttft.centre, "output_tokens_per_s": point.output_tps}


@dataclasses.dataclass
class Measured:
    """One configuration's runs over the rounds, per level: each run's metrics and its load-test step."""

    doc: dict  # the first round's report, for its config (the client's CPUs, the model)
    levels: dict[int, list[tuple[dict[str, float], dict]]]
    stat: str  # the latencies' statistic: p50 or mean (plan_noise.STATS)
    unmeasured: dict[int, int]  # level -> runs recorded, where under MIN_RUNS (may_stall only)

    @classmethod
    def of(cls, docs: Sequence[dict], name: str, wanted: Sequence[int], may_stall: bool = False) -> Measured:
        levels: dict[int, list[tuple[dict[str, float], dict]]] = {}
        stats = set()
        for doc in docs:
            for step in doc["steps"]:
                try:
                    (point,) = from_loadtest({**doc, "steps": [step]}, "step").points
                except ObserveError:
                    continue  # no request recorded in this round's step: left out, counted below
                levels.setdefault(int(step["level"]), []).append((measured_point(point), step))
                stats.add(point.tpot.kind)
        unmeasured = {level: len(levels.get(level, ())) for level in wanted if len(levels.get(level, ())) < MIN_RUNS}
        assert may_stall or not unmeasured, f"{name}: runs recorded per concurrency {unmeasured} of {len(docs)}"
        assert len(stats) <= 1, f"{name}: its rounds measured {sorted(stats)}: the exporter missed a step"
        return cls(docs[0], levels, stats.pop() if stats else "p50", unmeasured)

    def repeats(self, level: int) -> Repeats:
        return Repeats(tuple(m for m, _ in self.levels[level]))

    def calibration(self, levels: Sequence[int], out: pathlib.Path) -> pathlib.Path:
        """The load test's report with the calibration's steps only, the median-TPOT round of each level:
        all the planner will ever see."""
        steps = []
        for level in levels:
            runs = self.levels[level]
            steps.append(runs[median_index([m["tpot"] for m, _ in runs])][1])
        out.write_text(json.dumps({**self.doc, "steps": steps}))
        return out

    def fed(self, level: int, calibration: pathlib.Path) -> dict[str, float]:
        doc = json.loads(calibration.read_text())
        point = next(p for p in from_loadtest(doc, "calibration").points if int(p.level) == level)
        return measured_point(point)


def port_of(engine: engines.Engine) -> int:
    return int(engine.base_url.rsplit(":", 1)[1])


def background_load(url: str, seconds: int) -> subprocess.Popen:
    """A closed loop of 4 clients for `seconds`, while the planner watches the exporter."""
    return subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "loadtest", url, "--concurrency", "4", "--prompt-tokens",
         str(PROMPT_WORDS), "--max-tokens", str(MAX_TOKENS), "--warmup", "0s", "--duration", f"{seconds}s"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})


def plan(source: pathlib.Path | str, base_args: Sequence[str], candidates: Sequence[str]) -> dict:
    args = ["plan", "--from", str(source), *base_args, "--no-rate-search", "--json", "-"]
    for cand in candidates:
        args += ["--candidate", cand]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def check_live_plan(base: str, base_args: Sequence[str], url: str, seconds: int, window: str, name: str) -> None:
    """The planner on the running exporter: a window of its /metrics while a load runs. The statistic the
    window has is compared (llama.cpp: no TPOT histogram, so the mean; vLLM: its histograms)."""
    load = background_load(url, seconds)
    try:
        live = plan(base, [*base_args, "--window", window], [])
    finally:
        load.wait(timeout=120)
    (point,) = live["current"]
    tpot = f"tpot_{point['compared']['tpot']}_s"
    assert point["observed"][tpot] > 0 and point["predicted"][tpot] > 0, point
    print(f"plan --from the {name} exporter: {json.dumps(point)}")


@pytest.fixture(scope="module")
def table() -> Iterator[Table]:
    t = Table(LIMITS)
    started = time.monotonic()
    yield t
    where = pathlib.Path(os.environ.get("LLM_EXPORTER_PLAN_TABLE") or (ROOT / ".plan-validation.md"))
    header = (f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} {os.cpu_count()} CPUs "
              f"({bench_main._cpu_model()}); llama.cpp {engines.LLAMACPP.version}, vLLM {engines.VLLM.version} (CPU); "
              f"engine threads {THREADS}. {PROFILE.what[0].upper()}{PROFILE.what[1:]}: {ROUNDS} interleaved rounds, "
              f"steps of {PROFILE.warmup} warm-up and {PROFILE.duration} measured; "
              f"{(time.monotonic() - started) / 60:.1f} min.\n\n")
    text = header + t.markdown()
    print("\n" + text)
    where.write_text(text)


def assert_fit(doc: dict, engine: str, table: Table, runs: Measured, calibration: pathlib.Path) -> None:
    """The fit reproduces the steps it was calibrated on (the step it was given, beside the level's floor)."""
    for row in doc["current"]:
        level = int(row["level"])
        rep = runs.repeats(level)
        added = table.add(engine, "calibration", f"{row['point']} (fitted)", runs.stat, row["predicted"],
                          runs.fed(level, calibration), rep.floor(), len(rep.runs))
        for key, limit in FIT_GATE.items():
            assert abs(added.err[key]) <= limit, (engine, row["point"], key, added.err)


def test_planner_on_llamacpp(tmp_path: pathlib.Path, table: Table) -> None:
    model = engines.plan_hf_config()
    base_args = ["--model", str(model), "--cpu-threads", str(THREADS), "--dtype", "f16", "--kv-dtype", "f16",
                 "--max-num-seqs", str(SLOTS), "--max-batched-tokens", "2048"]
    configs = PROFILE.llamacpp  # the calibration's first in every round: A B C D A B C D ...
    with contextlib.ExitStack() as stack:
        # Every server up for the whole validation (an idle llama-server waits without spinning), so
        # rounds switch configuration without a restart.
        servers = {c.name: stack.enter_context(engines.start_llamacpp(
            engines.free_port(), model=engines.plan_gguf_path(c.wtype), slots=SLOTS, threads=c.threads,
            log_dir=tmp_path)) for c in configs}
        docs = interleave(configs, ROUNDS, lambda c, r: loadtest(servers[c.name].base_url, c.levels,
                                                                  tmp_path / f"{c.name}-r{r}.json",
                                                                  may_stall=c.may_stall))
        f16 = servers["f16"]
        with exporter(f16.base_url + "/metrics", port_of(f16)) as base:
            check_live_plan(base, [*base_args, "--output-tokens", str(MAX_TOKENS)], f16.base_url, 30, "20s",
                            "llama.cpp")
    runs = {c.name: Measured.of(d, c.name, c.levels, c.may_stall) for c, d in zip(configs, docs, strict=True)}

    calibration = runs["f16"].calibration(CALIBRATION_LEVELS, tmp_path / "calibration.json")
    held_out = [("f16", "f16", THREADS, level) for level in configs[0].levels if level not in CALIBRATION_LEVELS]
    held_out += [(c.name, c.wtype, c.threads, level) for c in configs[1:] for level in c.levels]
    candidates = [f"name={w}-t{t}-c{c},dtype={w},threads={t},concurrency={c}" for _, w, t, c in held_out]
    doc = plan(calibration, base_args, candidates)
    assert_fit(doc, "llama.cpp", table, runs["f16"], calibration)
    assert len(doc["candidates"]) == len(held_out)
    for (name, wtype, threads, level), row in zip(held_out, doc["candidates"], strict=True):
        if level in runs[name].unmeasured:
            table.unmeasured("llama.cpp", f"{wtype}, {threads} thread(s), concurrency {level}",
                             f"{runs[name].unmeasured[level]} of {ROUNDS} rounds recorded a request")
            continue
        rep = runs[name].repeats(level)
        table.add("llama.cpp", "held-out", f"{wtype}, {threads} thread(s), concurrency {level}", runs[name].stat,
                  row["predicted"], rep.median(), rep.floor(), len(rep.runs))

    seen, unseen = EXTRAPOLATION
    doc = plan(runs["f16"].calibration(seen, tmp_path / "calibration-1-4.json"), base_args,
               [f"name=c{c},concurrency={c}" for c in unseen])
    for level, row in zip(unseen, doc["candidates"], strict=True):
        rep = runs["f16"].repeats(level)
        table.add("llama.cpp", "extrapolation", f"f16 from c={'+'.join(map(str, seen))}: concurrency {level}",
                  runs["f16"].stat, row["predicted"], rep.median(), rep.floor(), len(rep.runs))


def test_planner_on_vllm(tmp_path: pathlib.Path, table: Table) -> None:
    base_args = ["--model", str(engines.hf_model_dir() / "config.json"), "--cpu-threads", str(THREADS),
                 "--dtype", "f32", "--kv-dtype", "f32", "--max-num-seqs", "4"]
    with contextlib.ExitStack() as stack:
        # Both servers up for the whole validation (an idle vLLM engine core blocks on its queue).
        small = stack.enter_context(engines.start_vllm(engines.free_port(), extra_args=("--max-num-seqs", "4"),
                                                       log_dir=tmp_path))
        small_base = stack.enter_context(exporter(small.base_url + "/metrics", port_of(small)))
        large = stack.enter_context(engines.start_vllm(engines.free_port(), extra_args=("--max-num-seqs", "8"),
                                                       log_dir=tmp_path))
        large_base = stack.enter_context(exporter(large.base_url + "/metrics", port_of(large)))
        configs = [("seqs4", small.base_url, small_base, VLLM_SWEEP), ("seqs8", large.base_url, large_base, (8,))]
        docs = interleave(configs, ROUNDS, lambda c, r: loadtest(c[1], c[3], tmp_path / f"vllm-{c[0]}-r{r}.json",
                                                                  exporter_url=c[2]))
        # The planner on vLLM's running exporter (histograms: TTFT, TPOT, request counts).
        check_live_plan(small_base, base_args, small.base_url, 25, "15s", "vLLM")
    small_runs, large_runs = (Measured.of(d, c[0], c[3]) for c, d in zip(configs, docs, strict=True))
    calibration = small_runs.calibration(VLLM_CALIBRATION, tmp_path / "vllm-calibration.json")
    doc = plan(calibration, base_args, ["name=c3,concurrency=3", "name=seqs8-c8,max_num_seqs=8,concurrency=8"])
    assert_fit(doc, "vLLM", table, small_runs, calibration)
    c3, c8 = doc["candidates"]
    for config, row, runs, level in (("max-num-seqs 4, concurrency 3", c3, small_runs, 3),
                                     ("max-num-seqs 8, concurrency 8", c8, large_runs, 8)):
        rep = runs.repeats(level)
        table.add("vLLM", "held-out", config, runs.stat, row["predicted"], rep.median(), rep.floor(), len(rep.runs))


def test_held_out_medians_meet_the_gate(table: Table) -> None:
    """The regression gate over every held-out configuration of both engines, on the error beyond each
    configuration's floor (defined last: pytest runs it after them)."""
    expected = sum(len(c.levels) for c in PROFILE.llamacpp) - len(CALIBRATION_LEVELS) + 2  # + vLLM's two
    assert len(table.of("held-out")) + len(table.missing) == expected, "an engine's validation did not run"
    # Beyond the floor, and plain as before the floors: a floor of 177% (Q4_0's TPOT on the loaded
    # machine) hides a planner that lost the physics, the plain median does not.
    for medians in (table.excess_medians(), table.medians()):
        for key, limit in MEDIAN_GATE.items():
            assert medians[key] <= limit, (key, medians, table.markdown())
