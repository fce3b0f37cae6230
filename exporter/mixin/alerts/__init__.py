"""llm-exporter's Prometheus rules and Alertmanager config, one module per area (the mixins' layout).

config.py holds CONFIG, lib.py the PromQL and rule helpers, and recording.py, slo.py, latency.py,
saturation.py, hardware.py and pipeline.py each build the rule groups of one area; alertmanager.py
builds the routing and inhibitions; generate.py assembles them and writes the files.
"""
