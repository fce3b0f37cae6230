#!/usr/bin/env python3
"""Write docs/configuration.md from the settings table (exporter/settings.py) and the CLI parser.

    python deploy/configuration_docs.py           write docs/configuration.md
    python deploy/configuration_docs.py --check   exit 1 when docs/configuration.md is stale

Nothing is restated by hand: each setting's flag, variable, YAML key, default and meaning come
from exporter.settings.SETTINGS (which also builds the flags and the Config); engine-target options
from exporter.targets.TARGET_OPTIONS; the demo's and doctor's other flags from
exporter.cli.build_parser(). So a new setting shows up here as soon as this is re-run, and
tests/test_deploy.py fails until it is.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter import targets  # noqa: E402
from exporter.cli import build_parser  # noqa: E402
from exporter.settings import (  # noqa: E402
    BY_NAME,
    COLLECTORS,
    COLLECTORS_KEY,
    ENV_PREFIX,
    EXTENSION_PREFIX,
    MAX_TEXT_CHARS,
    SETTINGS,
    Setting,
)

OUT = ROOT / "docs" / "configuration.md"
SKIP_FIELDS: set[str] = set()  # Config fields that are no setting (none today)
_FIELD_SETTING = {"listen_host": "listen", "listen_port": "listen"}  # fields one setting fills together


def _key(field_name: str) -> str:
    """The YAML key (and env suffix) of a Config field: interval_s -> interval."""
    return BY_NAME[_FIELD_SETTING.get(field_name, field_name)].yaml_key


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag(action: argparse.Action) -> str:
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return f"`{flag}`"
    choices = f"{{{','.join(map(str, action.choices))}}}" if action.choices else None
    metavar = action.metavar or choices or action.dest.upper()
    return f"`{flag} {metavar}`"


def _setting_flag(setting: Setting, actions: dict[str, argparse.Action]) -> str:
    if not setting.flag:
        return "—"
    if setting.flag_action == "switch":  # two flags, one dest
        return " / ".join(f"`{flag}`" for flag in setting.flags)
    return _flag(actions[setting.dest])


_SWITCHES = {c.setting_name: c.name for c in COLLECTORS}


def run_table() -> list[str]:
    actions = {a.dest: a for a in _actions(_subparsers(build_parser())["run"])}
    rows = ["| Flag | Environment variable | YAML key | Default | Meaning |",
            "| --- | --- | --- | --- | --- |"]
    for setting in SETTINGS:
        env = f"`{setting.env}`" + (" (space-separated)" if setting.name in ("engines", "probes") else "")
        yaml_key = {"config": "—", "host_enabled": "`host.enabled` or `host_enabled`"}.get(
            setting.name, f"`{setting.yaml_key}`")
        if setting.name in _SWITCHES:
            yaml_key = f"`{COLLECTORS_KEY}.{_SWITCHES[setting.name]}` or `{setting.yaml_key}`"
        rows.append(f"| {_setting_flag(setting, actions)} | {env} | {yaml_key} | {setting.shown_default()} "
                    f"| {_cell(setting.help)} |")
    return rows


def collectors_section() -> list[str]:
    rows = ["### Collectors", "",
            "What the exporter collects is a set of collectors (node_exporter's pattern), each with a switch:",
            "`--collector.NAME` / `--no-collector.NAME`, `collectors: {NAME: false}` in YAML (or",
            f"`collector_NAME`), `{ENV_PREFIX}COLLECTOR_NAME=false`, with the precedence of every other setting.",
            "A collector that is off builds no source and exports no series, not even its own",
            "`llm_exporter_collector_success{collector}` and",
            "`llm_exporter_collector_duration_seconds{collector}` (docs/metrics.md); one that is on with",
            "nothing to collect (`probe` without `--probe`) exports none either.",
            "An unknown collector name is refused with the closest one: `--collector.hots` is an unknown option,",
            f"`{COLLECTORS_KEY}: {{hots: false}}` an unknown key, `{ENV_PREFIX}COLLECTOR_HOTS` a bad variable",
            "(exit 2; unlike other unknown variables, which are only warned about).",
            "`--no-host` and `--gpu-backend none` are the older spellings of `--no-collector.host` and",
            "`--no-collector.gpu`; they keep working, and when they disagree with a switch, off wins:",
            "`--collector.host --no-host` runs no host source.",
            "",
            "| Collector | Default | What it collects | Its settings |", "| --- | --- | --- | --- |"]
    for c in COLLECTORS:
        settings = ", ".join(f"`{BY_NAME[name].yaml_key}`" for name in c.settings) or "—"
        rows.append(f"| `{c.name}` | {'on' if c.default else 'off'} | {_cell(c.help)} | {settings} |")
    return rows


def options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| Flag | Default | Meaning |", "| --- | --- | --- |"]
    for action in _actions(parser):
        if isinstance(action, argparse._VersionAction):
            continue
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        default = "" if unset else f"`{action.default}`"
        rows.append(f"| {_flag(action)} | {default} | {_cell(action.help or '')} |")
    return rows


def yaml_example() -> list[str]:
    lines = ["```yaml",
             "# llm-exporter run --config exporter.yaml (every key optional; values shown are the defaults)"]
    for setting in SETTINGS:
        if not setting.field or setting.name in ("engines", "probes", *_SWITCHES):
            continue
        default = setting.shown_default()
        line = f"{setting.yaml_key}: {default}"
        lines.append(f"# {line}" if default == "unset" else line)
    lines += [f"{COLLECTORS_KEY}:", *(f"  {c.name}: {'true' if c.default else 'false'}" for c in COLLECTORS)]
    lines += [
        "engines:                        # or `engines: [\"http://127.0.0.1:8000,kind=vllm\"]`",
        "  - url: http://127.0.0.1:8000  # /metrics is appended when the path is empty",
        "    kind: vllm                  # default: detected from the exposition",
        "    name: vllm                  # the `target` label; default host:port",
        "    timeout: 800ms              # default: engine_timeout",
        "probes:                         # or `probes: [\"http://127.0.0.1:8000,every=15s\"]`",
        "  - url: http://127.0.0.1:8000  # the engine's base URL: /v1/completions is appended",
        "    target: vllm                # default: the engine target with this host and port",
        "    every: 15s",
        "```",
    ]
    return lines


def render() -> str:
    parser = build_parser()
    subs = _subparsers(parser)
    options = sorted(targets.TARGET_OPTIONS)
    out = [
        "<!-- Generated by deploy/configuration_docs.py from exporter/settings.py and exporter/cli.py; "
        "do not edit by hand. -->",
        "# Configuration",
        "",
        "`llm-exporter run` takes its settings from, in this order of precedence: a command-line flag,",
        f"an environment variable `{ENV_PREFIX}<KEY>`, a YAML file (`--config PATH` or "
        f"`{ENV_PREFIX}CONFIG`),",
        "then the default. Every setting is validated once at start: a bad value prints one line naming",
        "the setting and exits with status 2. Durations take `500ms`, `2s`, `1m`, `1h` or plain seconds; "
        "the interval is at least 100ms.",
        "A key no setting knows is refused the same way, naming the closest known key",
        "(`unknown key 'intervall' (did you mean 'interval'?)`); top-level keys starting with",
        f"`{EXTENSION_PREFIX}` are ignored, a place for YAML anchors "
        f"(`{EXTENSION_PREFIX}defaults: &d {{kind: vllm}}`).",
        f"An `{ENV_PREFIX}*` variable that is no setting is ignored with a warning naming the closest one",
        "(tests and builds share the prefix). Mapping settings (`gpu_spec`, `target_gpus`) take a JSON",
        "object in a variable. Byte sizes take a plain number of bytes or `512KiB`, `8MiB`, `1GiB`.",
        f"Text settings (paths, URLs, patterns) hold at most {MAX_TEXT_CHARS} characters and no control "
        "characters; a list or a mapping where text belongs is refused.",
        "",
        "A key written twice in one mapping, at any depth of the file (inside an engine target too), is",
        "refused naming the file, the line and the key, `duplicate key 'engines' at line 9, column 1 (first",
        "at line 2)`: YAML parsers keep the last one silently, so a second `engines: []` would run with no",
        "target. The web config file (`--web.config.file`) is read the same way, as the Prometheus",
        "exporter-toolkit reads it. A merge key is no duplicate of the keys it brings: an explicit key",
        "overrides a merged one (`{<<: *d, timeout: 1s}`); `<<` itself written twice is one (write",
        "`<<: [*a, *b]`).",
        "",
        "## `llm-exporter run`",
        "",
        *run_table(),
        "",
        "In YAML, `host:` may also be a block: "
        "`host: {enabled: true, proc_root: /host/proc, sys_root: /host/sys}`.",
        "In containers, change the port with `LLM_EXPORTER_LISTEN` rather than `--listen`: the image's",
        "HEALTHCHECK reads that variable.",
        "",
        *collectors_section(),
        "",
        "### Engine targets",
        "",
        "Each `--engine` (or each entry of `engines:` / `LLM_EXPORTER_ENGINES`) is",
        "`URL[,OPTION=VALUE]...`; in YAML it may also be a mapping with `url:` and the same options.",
        "",
        "| Option | Meaning |",
        "| --- | --- |",
        *[f"| `{o}` | {_cell(targets.TARGET_OPTIONS[o])} |" for o in options],
        "",
        "Secrets are never accepted inline (`token=`, `password=` ...): name a file or a variable.",
        "A URL from YAML or `LLM_EXPORTER_ENGINES` may carry `user:password@` (refused with `--engine`):",
        "the userinfo runs to the last `@`, which must be followed by `host[:port]`, so a generated password",
        "may hold `/ ? # @ ,` unencoded; `%XX` is an escape (write a literal `%` as `%25`), and in a",
        "`URL,key=value` spec the password may not hold `,<option>=` (docs/security.md).",
        "",
        "### Client-side probes",
        "",
        "Each `--probe` (or each entry of `probes:` / `LLM_EXPORTER_PROBES`) is `URL[,OPTION=VALUE]...`,",
        "URL the engine's base URL (`http://127.0.0.1:8000`); in YAML it may also be a mapping with `url:`.",
        "Off unless configured. Every `every` the exporter sends one small streaming request",
        "(`stream: true`, `stream_options.include_usage`, `ignore_eos`, a prompt of `prompt_tokens` words) to",
        "`/v1/completions` or `/v1/chat/completions` and reports client-side TTFT, inter-token gaps and",
        "errors as `llm_probe_*` (docs/metrics.md), with the `target`, `engine` and `model` labels of the",
        "engine target it belongs to. It takes no credentials of its own: it sends that target's, and only",
        "when the probe URL has the target's scheme, host and port. Redirects are not followed.",
        "",
        "| Option | Meaning |",
        "| --- | --- |",
        *[f"| `{o}` | {_cell(targets.PROBE_OPTIONS[o])} |" for o in targets.PROBE_OPTIONS],
        "",
        "YAML example:",
        "",
        *yaml_example(),
        "",
    ]
    intros = {
        "demo": "Runs digital twins and the exporter scraping them, in one process (no GPU needed).",
        "doctor": "Prints where the bottleneck is: from a running exporter (`--url`) or by sampling engines.",
    }
    for name, intro in intros.items():
        if name in subs:
            out += [f"## `llm-exporter {name}`", "", intro, "", *options_table(subs[name]), ""]
    sim = _simulator_parser()
    if sim is not None:
        out += ["## `python -m exporter.simulator` (the digital twin as its own process)", "",
                *options_table(sim), ""]
    return "\n".join(out).rstrip() + "\n"


def _simulator_parser() -> argparse.ArgumentParser | None:
    """The twin's parser, captured by calling its parse_args with --help intercepted."""
    from exporter.simulator import __main__ as sim_main

    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        captured.append(self)
        return argparse.Namespace()

    argparse.ArgumentParser.parse_args = capture  # type: ignore[assignment]
    try:
        sim_main.parse_args([])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[assignment]
    return captured[0] if captured else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when docs/configuration.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print("docs/configuration.md is stale: run `python deploy/configuration_docs.py`",
                  file=sys.stderr)
            return 1
        print("docs/configuration.md up to date")
        return 0
    if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
