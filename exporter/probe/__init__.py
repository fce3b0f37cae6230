"""Client-side probing of an engine's OpenAI-compatible API (`llm-exporter run --probe`).

`client.py`: one bounded streaming completion (`stream_completion`), reusable by anything that
needs client-side TTFT/ITL (a load generator); `source.py`: the ProbeSource that runs it every
few seconds in the background and reports the accumulated histograms and counters."""
