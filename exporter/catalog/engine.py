"""The normalized engine schema: one family per concept, whatever the engine calls it.

Histograms keep the engine's native bucket bounds, converted to seconds. Labels: `target`
(the configured target name), `engine` (detected kind), `model` where the engine gives one,
`rank` where the engine runs data-parallel ranks (bounded)."""

from exporter.catalog.base import family

T = ("target", "engine", "model", "rank")
HISTOGRAM_HELP = " Native bucket bounds of the engine, converted to seconds."

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "rejected", "other")
"""The `reason` vocabulary of llm_requests_finished_total, whatever the engine calls them: stop (a stop
token or string, or the engine's own stop rule), length (max_tokens or the context), abort (the client
left or cancelled), error (the engine or its backend failed the request), rejected (refused without
being run: a queue full or timed out, overload), other (anything else the engine names). Each engine
table maps its own values onto these (EngineSpec.reasons); nothing is merged that an engine keeps apart."""

CACHE_TIERS: tuple[str, ...] = ("device", "host", "storage", "external", "unknown")
"""The `tier` of llm_prefix_cache_hits_total: where the reused prompt tokens came from. device: the
engine's own GPU KV cache; host: CPU memory (SGLang HiCache, TRT-LLM host offload); storage: disk or a
remote store (SGLang HiCache L3, TRT-LLM disk); external: a KV connector (vLLM's LMCache/NIXL/Mooncake
transfers); unknown: the engine counts every tier together. Summed over tiers it is every hit, and
divided by llm_prefix_cache_queries_total it is the overall hit ratio."""

ROLES: tuple[str, ...] = ("prefill", "decode", "both")
"""The `role` of llm_engine_info: the part an instance plays in prefill/decode (PD) disaggregated
serving. prefill: it computes prompts and sends their KV cache to a decode instance; decode: it
receives the KV cache and generates; both: it does both (no disaggregation), or neither the page nor
the target's `role` option says. Read from the page where the engine names its role (SGLang
`engine_type`: prefill, decode, unified and dynamic -> both), else the target's `role` option;
the page wins when both say."""

FAMILIES = (
    family("llm_engine_up", "gauge", "bool",
           "1 when the engine target's /metrics was scraped and parsed, 0 otherwise.",
           ("target", "engine"), "engine"),
    family("llm_engine_info", "gauge", "info",
           "Always 1; labels name the detected engine kind, the alias set that matched and the instance's "
           "role in prefill/decode disaggregated serving (ROLES: prefill, decode or both; from the page where "
           "the engine names it, else the target's `role` option, else both).",
           ("target", "engine", "flavor", "role"), "engine"),
    family("llm_time_to_first_token_seconds", "histogram", "seconds",
           "Time from request arrival to the first output token." + HISTOGRAM_HELP, T, "engine"),
    family("llm_inter_token_latency_seconds", "histogram", "seconds",
           "Time between successive outputs of one request as the engine observes them (ITL/TBT): one "
           "observation per output step of a running request; a step that emits several tokens (speculative "
           "decoding) is one gap. Engines that only weight gaps per token are left out, never relabelled."
           + HISTOGRAM_HELP, T, "engine"),
    family("llm_time_per_output_token_seconds", "histogram", "seconds",
           "Mean time per output token of each finished request (TPOT): one observation per request, its "
           "decode time over its output tokens after the first." + HISTOGRAM_HELP, T, "engine"),
    family("llm_e2e_request_latency_seconds", "histogram", "seconds",
           "End-to-end request latency." + HISTOGRAM_HELP, T, "engine"),
    family("llm_request_queue_time_seconds", "histogram", "seconds",
           "Time a request waited in the engine's queue before being scheduled." + HISTOGRAM_HELP, T, "engine"),
    family("llm_request_prefill_time_seconds", "histogram", "seconds",
           "Time a request spent in prefill (prompt processing)." + HISTOGRAM_HELP, T, "engine"),
    family("llm_request_decode_time_seconds", "histogram", "seconds",
           "Time a request spent in decode (generating tokens)." + HISTOGRAM_HELP, T, "engine"),
    family("llm_request_inference_time_seconds", "histogram", "seconds",
           "Time from scheduling to the last token (prefill + decode)." + HISTOGRAM_HELP, T, "engine"),
    family("llm_request_prompt_tokens", "histogram", "tokens",
           "Prompt length of finished requests, in tokens.", T, "engine"),
    family("llm_request_generation_tokens", "histogram", "tokens",
           "Output length of finished requests, in tokens.", T, "engine"),
    family("llm_prompt_tokens_total", "counter", "tokens",
           "Prompt tokens of every request, computed or served by the prefix cache (the cached ones are "
           "llm_prefix_cache_hits_total where the engine counts them; llama.cpp counts them apart and they "
           "are added here).", T, "engine"),
    family("llm_generation_tokens_total", "counter", "tokens",
           "Output (decode) tokens generated.", T, "engine"),
    family("llm_prefill_seconds_total", "counter", "seconds",
           "Cumulative per-request time spent processing prompts, for engines that give time counters "
           "instead of histograms (llama.cpp): summed over the requests (slots) running at once, so it "
           "grows by up to N seconds per second with N slots busy.", T, "engine"),
    family("llm_decode_seconds_total", "counter", "seconds",
           "Cumulative per-request time spent generating tokens, for engines that give time counters "
           "instead of histograms (llama.cpp): summed over the requests (slots) decoding at once. "
           "rate() of it / rate(llm_generation_tokens_total) is the mean time per output token.", T, "engine"),
    family("llm_request_duration_seconds_total", "counter", "seconds",
           "Cumulative end-to-end request time, for engines that give only a time counter (Triton, in "
           "microseconds natively).", T, "engine"),
    family("llm_request_queue_seconds_total", "counter", "seconds",
           "Cumulative queue time, for engines that give only a time counter (Triton).", T, "engine"),
    family("llm_requests_total", "counter", "requests",
           "Requests received or completed, for engines that count them without a finish reason.",
           T, "engine"),
    family("llm_requests_finished_total", "counter", "requests",
           "Finished requests by reason (" + ", ".join(FINISH_REASONS) + "; FINISH_REASONS says what each "
           "means).", T + ("reason",), "engine"),
    family("llm_preemptions_total", "counter", "preemptions",
           "Sequences preempted (vLLM) or retracted (SGLang) because the KV cache ran out.", T, "engine"),
    family("llm_prefix_cache_queries_total", "counter", "tokens",
           "Prompt tokens looked up in the prefix cache.", T, "engine"),
    family("llm_prefix_cache_hits_total", "counter", "tokens",
           "Prompt tokens reused from a prefix cache instead of computed, by the tier that held them ("
           + ", ".join(CACHE_TIERS) + "): summed over tiers, every hit.", T + ("tier",), "engine"),
    family("llm_prefix_cache_hit_ratio", "gauge", "ratio",
           "Prefix cache hit rate as the engine reports it (a gauge; engines without hit/query counters).",
           T, "engine"),
    family("llm_requests_running", "gauge", "requests",
           "Requests in the running batch.", T, "engine"),
    family("llm_requests_waiting", "gauge", "requests",
           "Requests waiting to be scheduled. Whether it counts the requests of "
           "llm_requests_waiting_kv_transfer depends on the engine (docs/engines.md, \"Waiting semantics\"): "
           "vLLM's does (a request deferred for its KV load waits here too), SGLang's does not (its PD "
           "queues are apart from its waiting queue).", T, "engine"),
    family("llm_requests_waiting_kv_transfer", "gauge", "requests",
           "Requests held by prefill/decode disaggregation, waiting for their KV cache to be bootstrapped "
           "(handshake and KV memory preallocation with the peer instance) or transferred between the prefill "
           "and the decode instance: SGLang's bootstrap and inflight (prefill) and prealloc and transfer "
           "(decode) queues, vLLM's KV-consumer requests whose async KV load has not started or not finished. "
           "A request whose KV has arrived and that waits for a slot is llm_requests_waiting only. Counted in "
           "llm_requests_waiting for vLLM, not for SGLang (docs/engines.md, \"Waiting semantics\"): an instance "
           "whose requests all wait here is not idle.", T, "engine"),
    family("llm_kv_transfer_seconds", "histogram", "seconds",
           "Duration of one KV cache transfer between a prefill and a decode instance (SGLang "
           "kv_transfer_latency_ms, per request, on the prefill side; vLLM NIXL/Mooncake xfer_time, per "
           "transfer operation, where the reading or pushing side records it)." + HISTOGRAM_HELP, T, "engine"),
    family("llm_kv_transfer_bytes", "histogram", "bytes",
           "Size of one KV cache transfer between a prefill and a decode instance, observed with "
           "llm_kv_transfer_seconds (SGLang kv_transfer_total_mb in MiB, vLLM NIXL/Mooncake bytes_transferred). "
           "Native bucket bounds of the engine, converted to bytes.", T, "engine"),
    family("llm_kv_transfer_failures_total", "counter", "failures",
           "KV cache transfers between prefill and decode instances that failed, as this instance saw them: "
           "SGLang requests whose bootstrap (handshake) or transfer failed, vLLM NIXL transfer operations that "
           "failed (handshake and notification failures included) and Mooncake failed sends and receives. A "
           "failure may be counted by both the prefill and the decode instance.", T, "engine"),
    family("llm_requests_pending", "gauge", "requests",
           "Requests the server accepted but has not yet handed to the engine's scheduler (LMDeploy's API "
           "queue, Triton's pending requests): load that llm_requests_waiting does not count.", T, "engine"),
    family("llm_request_render_time_seconds", "histogram", "seconds",
           "Time to render a request (chat template, tokenization) before the engine queues it; part of "
           "TTFT that no engine step explains (vLLM request_render_duration_seconds)." + HISTOGRAM_HELP,
           T, "engine"),
    family("llm_kv_cache_usage_ratio", "gauge", "ratio",
           "Fraction of the KV cache in use (0..1).", T, "engine"),
    family("llm_kv_cache_capacity_tokens", "gauge", "tokens",
           "KV cache capacity in tokens (blocks x block size).", T, "engine"),
    family("llm_kv_cache_block_size_tokens", "gauge", "tokens",
           "Tokens per KV cache block.", T, "engine"),
    family("llm_kv_cache_memory_bytes", "gauge", "bytes",
           "GPU memory the engine allocated to the KV cache, per worker (vLLM cache_config_info "
           "kv_cache_memory_bytes): with the capacity in tokens it gives the bytes per token of the "
           "dtype the engine really runs.", T, "engine"),
    # Added with the per-engine alias tables (exporter/sources/engines/): families some engines
    # offer that the core schema lacked.
    family("llm_requests_running_max", "gauge", "requests",
           "Configured maximum of concurrently running requests (NIM num_request_max, Triton "
           "request_type=max, trtllm-serve max_num_active_requests).", T, "engine"),
    family("llm_iteration_tokens", "histogram", "tokens",
           "Tokens (prefill + decode) processed per engine step: the batch shape (vLLM "
           "iteration_tokens_total).", T, "engine"),
    family("llm_batch_prefill_time_seconds", "histogram", "seconds",
           "Duration of one engine step that runs a prefill batch (TGI batch inference, "
           "method=prefill)." + HISTOGRAM_HELP, T, "engine"),
    family("llm_batch_decode_time_seconds", "histogram", "seconds",
           "Duration of one decode step over the running batch (TGI batch inference, "
           "method=decode)." + HISTOGRAM_HELP, T, "engine"),
    family("llm_engine_steps_total", "counter", "steps",
           "Forward passes of the engine over its batch (llama.cpp llama_decode() calls, without "
           "speculative and multimodal ones): rate() is engine steps per second.", T, "engine"),
    family("llm_engine_busy_seconds_total", "counter", "seconds",
           "Cumulative time the engine spent running forward passes (SGLang forward_execution_seconds_total "
           "over its categories, Triton compute_infer_duration_us): rate() is the share of wall time the "
           "model was computing; the rest is scheduling, host work or idle.", T, "engine"),
    family("llm_engine_iteration_seconds", "gauge", "seconds",
           "Duration of the engine's last iteration (one scheduler step over the batch; trtllm-serve "
           "iteration_latency_seconds): the floor of the time between tokens.", T, "engine"),
    family("llm_engine_estimated_flops_total", "counter", "FLOP",
           "Floating-point operations the engine estimates it ran, per GPU (vLLM "
           "estimated_flops_per_gpu_total, from its own model of each step): rate() is achieved FLOP/s.",
           T, "engine"),
    family("llm_engine_estimated_read_bytes_total", "counter", "bytes",
           "Bytes the engine estimates it read from GPU memory, per GPU (vLLM estimated_read_bytes_per_gpu_total).",
           T, "engine"),
    family("llm_engine_estimated_write_bytes_total", "counter", "bytes",
           "Bytes the engine estimates it wrote to GPU memory, per GPU (vLLM estimated_write_bytes_per_gpu_total).",
           T, "engine"),
    family("llm_spec_decode_draft_tokens_total", "counter", "tokens",
           "Speculative decoding: tokens proposed by the draft model (or n-gram/EAGLE proposer).", T, "engine"),
    family("llm_spec_decode_accepted_tokens_total", "counter", "tokens",
           "Speculative decoding: draft tokens the target model accepted.", T, "engine"),
    family("llm_spec_decode_drafts_total", "counter", "drafts",
           "Speculative decoding: verification steps (drafts checked by the target model).", T, "engine"),
    family("llm_spec_decode_acceptance_length", "gauge", "tokens",
           "Speculative decoding, for engines without counters: mean tokens a request gains per "
           "verification step (accepted draft tokens plus the target model's own), as the engine averages "
           "it (SGLang spec_accept_length over its last interval, trtllm-serve acceptance_length, LMDeploy "
           "mean_accept_length). With counters, 1 + rate(accepted) / rate(drafts) is the same quantity.",
           T, "engine"),
)
