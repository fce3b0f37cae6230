"""Everything the mixin ships, from one config, as relative file name -> text: what `llm-exporter mixin
--out DIR` writes. With the default CONFIG each file is byte for byte the checkout's shipped copy:

    rules/<area>.yaml         alerts/rules/<area>.yaml
    prometheusrule.yaml       deploy/kubernetes/cluster/prometheusrule.yaml
    alertmanager.yml          deploy/alertmanager/alertmanager.yml
    dashboards/<board>.json   dashboards/<board>.json
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping

from exporter.mixin.alerts import generate as alerts
from exporter.mixin.config import CONFIG
from exporter.mixin.dashboards import generate as dashboards

# Relative paths, under the output directory; the rule files keep their area names beneath RULES.
RULES = pathlib.Path("rules")
PROMETHEUSRULE = pathlib.Path("prometheusrule.yaml")
ALERTMANAGER = pathlib.Path("alertmanager.yml")
DASHBOARDS = pathlib.Path("dashboards")


def render(cfg: Mapping = CONFIG) -> dict[pathlib.Path, str]:
    """Relative path -> text of every rule file, the PrometheusRule, alertmanager.yml and every board."""
    files = alerts.render(dict(cfg), rules_dir=RULES, prometheusrule=PROMETHEUSRULE, alertmanager_file=ALERTMANAGER)
    return files | {DASHBOARDS / name: text for name, text in dashboards.build_all(cfg).items()}


def undefined_metrics(cfg: Mapping = CONFIG) -> list[str]:
    """Panel queries that read a name neither the catalogue nor this config's recording rules define: a
    config that disables a recording rule a panel reads is caught here, before a board goes blank."""
    recorded = {r["record"] for groups in alerts.build(dict(cfg)).values() for g in groups for r in g["rules"]
                if "record" in r}
    problems: list[str] = []
    for text in dashboards.build_all(cfg).values():
        problems += dashboards.undefined_metrics(json.loads(text), recorded)
    return problems


def write(out: pathlib.Path, files: Mapping[pathlib.Path, str]) -> list[pathlib.Path]:
    """Each file under `out` (directories made as needed); the paths written."""
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
