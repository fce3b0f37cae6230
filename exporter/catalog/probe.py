"""Client-side probe families (`--probe`, exporter/probe/): what a small streaming request to the
engine's OpenAI-compatible API sees from the exporter's side of the network.

Labels: `target` (the engine target the probe belongs to, so probe and engine series join on it),
`engine` once that target's kind is detected, `model` (configured, or the first of /v1/models).
Latencies are measured from the request being sent on an open connection (the connect time is
not in them), to the first content-bearing chunk (TTFT), between content-bearing chunks (ITL: one
observation per gap between chunks, which is per token on engines that stream one token a chunk)
and to the end of the stream (e2e)."""

from exporter.catalog.base import family

P = ("target", "engine", "model")

# Bucket bounds: vLLM V1's own for TTFT (so the probe's and the engine's TTFT quantiles are read off
# the same bounds, and the SLO threshold is one of them), vLLM's ITL and e2e bounds with a few
# finer ones below: a probe's answer is short (16 tokens by default, e2e well under vLLM's first
# 0.3 s bound on a fast engine), and a client-side gap on a small model is a few milliseconds.
TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                  0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                                  20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# The bounded `reason` values of llm_probe_errors_total (exporter/probe/client.py says when each).
ERROR_REASONS: tuple[str, ...] = ("timeout", "dns", "connection", "tls", "http_status", "too_large", "protocol",
                                  "stream_error", "too_deep", "empty", "credentials", "exception")

FAMILIES = (
    family("llm_probe_time_to_first_token_seconds", "histogram", "seconds",
           "Client-side time to first token of the probe's streaming requests: from the request sent to the "
           "first chunk carrying text. Beside the engine's own llm_time_to_first_token_seconds, the "
           "difference is what lies in front of the engine (network, proxy, queueing).", P, "probe"),
    family("llm_probe_inter_token_latency_seconds", "histogram", "seconds",
           "Client-side gaps between consecutive text-bearing chunks of the probe's streaming requests.",
           P, "probe"),
    family("llm_probe_e2e_request_latency_seconds", "histogram", "seconds",
           "Client-side latency of the probe's successful requests, from the request sent to the end of the "
           "stream.", P, "probe"),
    family("llm_probe_requests_total", "counter", "requests",
           "Probe requests finished (successful or not).", P, "probe"),
    family("llm_probe_errors_total", "counter", "requests",
           "Probe requests that failed, by reason: timeout (connect, first byte or whole answer), dns, "
           "connection, tls, http_status (any answer but 200, redirects included: they are not followed), "
           "too_large (the answer, one SSE line or the chunk count over its cap), protocol (not HTTP/1.x or "
           "not an SSE stream of JSON chunks), stream_error (the engine sent an error object in the stream), "
           "too_deep (a JSON event nested deeper than 64 levels), "
           "empty (a stream without text), credentials (the target's secret file unreadable), exception (a "
           "bug). Every reason is exported from the start at 0.", P + ("reason",), "probe"),
    family("llm_probe_up", "gauge", "bool",
           "1 when the probe's last request succeeded, 0 when it failed; absent until the first one ends.",
           P, "probe"),
    family("llm_probe_last_success_timestamp_seconds", "gauge", "seconds",
           "Unix time of the probe's last successful request; absent until the first success.", P, "probe"),
    family("llm_probe_completion_tokens_total", "counter", "tokens",
           "Tokens the probe's successful requests generated (the usage the engine reports, else text chunks "
           "counted).", P, "probe"),
    family("llm_probe_prompt_tokens_total", "counter", "tokens",
           "Prompt tokens of the probe's successful requests (the usage the engine reports, else the configured "
           "prompt_tokens). With the completion tokens and llm_probe_in_flight, what the verdict leaves out of "
           "the engine's work: a probe alone is not traffic.", P, "probe"),
    family("llm_probe_in_flight", "gauge", "requests",
           "1 while one of the probe's requests is on its way (it sends one at a time), else 0.", P, "probe"),
)
