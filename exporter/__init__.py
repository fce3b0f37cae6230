"""llm-exporter: a Prometheus sidecar that says where an LLM inference server's bottleneck is."""

__version__ = "0.1.0"
