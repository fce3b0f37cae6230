"""The monitoring mixin: llm-exporter's Prometheus rules, Alertmanager config and Grafana dashboards,
built from one config (config.py's CONFIG, the kubernetes-mixin's `_config`): the cluster label's name
and the other fleet labels, the exporter's job selector, thresholds, SLOs and disabled alerts.

alerts/ holds one module per rule area and the Alertmanager builder, dashboards/ one module per board
and the builder library; render.py assembles both for `llm-exporter mixin --out DIR [--config FILE]`
(cmd.py), and the wrappers alerts/generate.py and dashboards/generate.py write the checkout's shipped
copies. A tool layer: the exporter's runtime imports nothing from here (tests/test_layering.py).
"""
