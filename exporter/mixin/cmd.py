"""`llm-exporter mixin --out DIR [--config FILE]`: the rules, the Alertmanager config and the dashboards
for your own labels, selector and thresholds, as the kubernetes-mixin renders from its `_config`."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from exporter.mixin.config import CONFIG, MixinConfigError, with_overrides
from exporter.mixin.render import render, undefined_metrics, write
from exporter.yamlsafe import YamlLoadError, load_yaml_file, shorten

EXIT_CONFIG = 2  # as `run`: the config file is the user's to fix

USAGE = """\
Writes into DIR:
  rules/<area>.yaml       Prometheus recording and alerting rules, one file per area
  prometheusrule.yaml     the same groups as a PrometheusRule (prometheus-operator)
  alertmanager.yml        routing by severity and the inhibitions (replace the webhook URLs)
  dashboards/<board>.json the Grafana dashboards

--config FILE is YAML whose keys replace the defaults' (exporter/mixin/config.py; docs/alerts.md,
"Configuring the mixin"), e.g.
  cluster_label: k8s_cluster
  exporter_selector: 'job="llm"'
  disabled_alerts: [LLMEngineWithoutGPUMetrics]
  alertmanager: {pager_url: "https://pager.example/hook"}
Without it the files are the ones shipped in the repository."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "mixin", help="write the Prometheus rules, Alertmanager config and Grafana dashboards for your config",
        description="Render the monitoring mixin from one config.\n\n" + USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=pathlib.Path, metavar="DIR", help="directory to write into")
    parser.add_argument("--config", type=pathlib.Path, metavar="FILE",
                        help="YAML overriding keys of the default config")
    return parser


def load_config(path: pathlib.Path | None) -> dict:
    """CONFIG with the file's keys applied; MixinConfigError (or YamlLoadError) naming what is wrong."""
    if path is None:
        return dict(CONFIG)
    overrides = load_yaml_file(path)  # bounded, regular files only, a key written twice refused
    return with_overrides(CONFIG, {} if overrides is None else overrides)


def command_mixin(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    try:
        cfg = load_config(args.config)
    except (YamlLoadError, MixinConfigError) as error:
        print(f"llm-exporter mixin: {args.config}: {shorten(str(error))}", file=sys.stderr)
        return EXIT_CONFIG
    # A config may disable a recording rule a panel reads: refuse it rather than ship a blank panel.
    problems = undefined_metrics(cfg)
    if problems:
        print("llm-exporter mixin: the dashboards would read series nothing defines with this config:",
              *problems[:20], sep="\n  ", file=sys.stderr)
        return EXIT_CONFIG
    try:
        written = write(args.out, render(cfg))
    except OSError as error:
        print(f"llm-exporter mixin: cannot write into {args.out}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} files into {args.out}")
    return 0
