"""The planner's bounds on what it replays: each input (a load test's levels, an exporter's observed
counts, a candidate's multipliers, the command's flags) is checked against these before any replay
starts, and a value outside is refused in one line that names the input and the range (exit 2,
docs/cli.md). Each bound sits far above any real server, so a real deployment never meets one; what
they stop is a typo or a hostile file that would make the twin simulate a billion requests
(docs/security.md, "Planner")."""

from __future__ import annotations

# Requests in flight in one replay (a closed loop's level, `concurrency=`, an exporter's running
# gauge or Little's law estimate). One replica holds a few thousand sequences at most (vLLM's
# --max-num-seqs defaults to 256-1024, SGLang's running requests reach a few thousand) and
# `loadtest` sends at most 2,048; each replayed request costs about half a KiB.
MAX_CONCURRENCY = 16_384
# Request rate of one replay (a load test's rate level, an exporter's finished requests per second,
# the observed rate times `rate=`). The fastest servers finish a few thousand short requests per
# second and `loadtest` sends at most 10,000/s.
MAX_RATE_RPS = 100_000.0
# `rate=`, `prompt=` and `output=` multipliers: three orders of magnitude is a what-if; more is a typo.
MAX_SCALE = 1_000.0
# Mean prompt or output tokens per request (observed, or times a multiplier): the longest context
# windows are about 10M tokens; the twin clips each request to the model's context anyway.
MAX_TOKENS_PER_REQUEST = float(1 << 24)
# A TTFT, TPOT or inter-token latency: an hour is longer than any request a load test waits for
# (its default timeout is 120 s).
MAX_LATENCY_S = 3600.0
# Output tokens per second of one server: the fastest do about 10^5.
MAX_TOKENS_PER_S = 1e8
# Requests or tokens counted in one step or window: exact in a double (2^53 is about 9e15), far above
# 10^5 requests/s of 10^4 tokens for a day.
MAX_COUNT = 1e15
# One load-test step's length: loadtest's longest step is 600 s plus its drain.
MAX_DURATION_S = 86_400.0
# CPUs of one machine (a load generator's, or free for a CPU engine).
MAX_CPUS = 65_536.0
# A CPU engine's threads (`--cpu-threads`, `threads=`): the largest sockets have a few hundred cores.
MAX_CPU_THREADS = 1024
# GPUs per replica (`--tp`, `tp=`, the GPUs an exporter sees): 8 per node, a few nodes at most.
MAX_TP = 1024
# `--max-num-seqs`, `max_num_seqs=`: real settings are 1-4,096.
MAX_NUM_SEQS = 65_536
# `--max-batched-tokens`: real settings are 2,048 up to the context (about 10^6).
MAX_BATCHED_TOKENS = 1 << 24
# `--gpu-price-per-hour`, `price=`: dollars per GPU-hour; real prices are 1-100.
MAX_PRICE = 10_000.0

# --- one replay's budget, whatever its inputs ------------------------------------------------------
# Arrivals the twin may create in one replay: every request it holds is one of these, so this bounds
# its memory (about 50 MiB at the cap). A closed loop at MAX_CONCURRENCY needs about 53,000
# (its warm-up of two rounds plus what it measures); an open loop outrunning the device piles its
# arrivals up until here, then stops (the prediction says so).
MAX_REPLAY_ARRIVALS = 100_000
# The rate search only asks whether a rate keeps up: a backlog of thousands says it does not.
RATE_SEARCH_MAX_ARRIVALS = 10_000
# CPU seconds of one replay: its step bound (model.MAX_REPLAY_STEPS) costs about 4 s, so this is
# only reached by steps far slower than the twin's (each step is O(1) in the running sequences).
MAX_REPLAY_CPU_S = 30.0
# CPU seconds of the whole plan (calibration, every candidate and its rate search): a plan takes
# 2-60 s; past this it stops with one line instead of running on for hours.
MAX_PLAN_CPU_S = 600.0
