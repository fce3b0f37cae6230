#!/usr/bin/env python3
"""Write docs/configuration.md from the CLI's argparse parser and exporter.config.Config.

    python deploy/configuration_docs.py           write docs/configuration.md
    python deploy/configuration_docs.py --check   exit 1 when docs/configuration.md is stale

Nothing is restated by hand: flags, their help and choices come from exporter.cli.build_parser();
settings, defaults and the notes on settings without a flag from the Config dataclass (its fields'
defaults and trailing comments); engine-target options from exporter.config._TARGET_OPTIONS. So a
new flag or Config field shows up here as soon as this is re-run, and tests/test_deploy.py fails
until it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter import config as config_module  # noqa: E402
from exporter.cli import build_parser  # noqa: E402
from exporter.config import ENV_PREFIX, Config  # noqa: E402

OUT = ROOT / "docs" / "configuration.md"
# Settings whose YAML key / flag differs from the field name (field -> key).
KEY_OF_FIELD = {"listen_host": "listen", "listen_port": "listen"}
SKIP_FIELDS = {"extra"}  # not a setting: where unknown keys of later stages land
# Meaning of settings that have neither a flag nor a comment in Config (checked by the test:
# every setting has a meaning).
NOTES = {
    "max_series_per_target": "normalized series kept per engine target per collection; whole series past it "
                             "are dropped and counted (a guard against label explosions)",
    "max_concurrent_scrapes": "/metrics requests served at once; more get 503 and are counted",
}
TARGET_OPTIONS = {
    "kind": "engine format (vllm, sglang, tgi, ...); default: detected from the exposition",
    "name": "the `target` label; default: host:port of the URL",
    "timeout": "scrape timeout of this target; default: engine_timeout",
    "bearer_token_file": "file holding a bearer token, re-read on every scrape",
    "bearer_token_env": "name of an environment variable holding a bearer token",
    "username": "basic-auth user name (with password_file or password_env)",
    "password_file": "file holding the basic-auth password, re-read on every scrape",
    "password_env": "name of an environment variable holding the basic-auth password",
    "ca_file": "CA bundle for an https:// engine; default: the system store",
    "insecure_skip_verify": "true: do not verify the engine's TLS certificate",
}


def _field_comments() -> dict[str, str]:
    comments = {}
    for line in inspect.getsource(Config).splitlines():
        match = re.match(r"\s+(\w+):[^=#]+=[^#]*#\s*(.+)$", line)
        if match:
            comments[match.group(1)] = match.group(2).strip()
    return comments


def _key(field_name: str) -> str:
    """The YAML key (and env suffix) of a Config field: interval_s -> interval."""
    if field_name in KEY_OF_FIELD:
        return KEY_OF_FIELD[field_name]
    return field_name[:-2] if field_name.endswith("_s") else field_name


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = field.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if value is None or value == ():
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if field.name.endswith("_s") and isinstance(value, int | float):
        return f"{value:g}s"
    return str(value)


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
    metavar = action.metavar or (f"{{{','.join(map(str, action.choices))}}}" if action.choices else action.dest.upper())
    return f"`{flag} {metavar}`"


def run_table() -> list[str]:
    run = _subparsers(build_parser())["run"]
    comments = _field_comments()
    fields = {f.name: f for f in dataclasses.fields(Config) if f.name not in SKIP_FIELDS}
    by_key: dict[str, list[dataclasses.Field]] = {}
    for f in fields.values():
        by_key.setdefault(_key(f.name), []).append(f)
    flags = {a.dest: a for a in _actions(run)}
    rows = ["| Flag | Environment variable | YAML key | Default | Meaning |", "| --- | --- | --- | --- | --- |"]
    seen_keys = set()
    for dest, action in flags.items():
        if dest == "config":
            rows.append(f"| {_flag(action)} | `{ENV_PREFIX}CONFIG` | — | unset | {_cell(action.help or '')} |")
            continue
        key = dest
        if key not in by_key:
            raise SystemExit(f"flag {max(action.option_strings, key=len)} (dest {dest}) has no Config field: "
                             "teach deploy/configuration_docs.py how it maps")
        seen_keys.add(key)
        group = by_key[key]
        default = ("0.0.0.0:9480" if key == "listen" else _default(group[0]))
        env = f"`{ENV_PREFIX}{key.upper()}`"
        if key == "engines":
            env = f"`{ENV_PREFIX}ENGINES` (space-separated)"
        yaml_key = "`host.enabled` or `host_enabled`" if key == "host_enabled" else f"`{key}`"
        rows.append(f"| {_flag(action)} | {env} | {yaml_key} | {default} | {_cell(action.help or '')} |")
    for key, group in by_key.items():
        if key in seen_keys:
            continue
        note = comments.get(group[0].name) or NOTES.get(group[0].name, "")
        rows.append(f"| — | `{ENV_PREFIX}{key.upper()}` | `{key}` | {_default(group[0])} | {_cell(note)} |")
    return rows


def options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| Flag | Default | Meaning |", "| --- | --- | --- |"]
    for action in _actions(parser):
        if isinstance(action, argparse._VersionAction):
            continue
        default = "" if action.default is None or action.default is False or action.default == argparse.SUPPRESS \
            else f"`{action.default}`"
        rows.append(f"| {_flag(action)} | {default} | {_cell(action.help or '')} |")
    return rows


def yaml_example() -> list[str]:
    lines = ["```yaml", "# llm-exporter run --config exporter.yaml (every key optional; values shown are the defaults)"]
    for f in dataclasses.fields(Config):
        if f.name in SKIP_FIELDS or f.name == "listen_port" or f.name == "engines":
            continue
        key = _key(f.name)
        default = "0.0.0.0:9480" if key == "listen" else _default(f)
        lines.append(f"# {key}: {default}" if default == "unset" else f"{key}: {default}")
    lines += [
        "engines:                        # or `engines: [\"http://127.0.0.1:8000,kind=vllm\"]`",
        "  - url: http://127.0.0.1:8000  # /metrics is appended when the path is empty",
        "    kind: vllm                  # default: detected from the exposition",
        "    name: vllm                  # the `target` label; default host:port",
        "    timeout: 800ms              # default: engine_timeout",
        "```",
    ]
    return lines


def render() -> str:
    parser = build_parser()
    subs = _subparsers(parser)
    options = sorted(getattr(config_module, "_TARGET_OPTIONS", ()) or ())
    out = [
        "<!-- Generated by deploy/configuration_docs.py from exporter/cli.py and exporter/config.py; "
        "do not edit by hand. -->",
        "# Configuration",
        "",
        "`llm-exporter run` takes its settings from, in this order of precedence: a command-line flag,",
        f"an environment variable `{ENV_PREFIX}<KEY>`, a YAML file (`--config PATH` or `{ENV_PREFIX}CONFIG`),",
        "then the default. Every setting is validated once at start: a bad value prints one line naming",
        "the setting and exits with status 2. Durations take `500ms`, `2s`, `1m`, `1h` or plain seconds; the interval is at least 100ms.",
        "Keys a YAML file has that no setting knows are kept for later stages, not rejected.",
        "",
        "## `llm-exporter run`",
        "",
        *run_table(),
        "",
        "In YAML, `host:` may also be a block: `host: {enabled: true, proc_root: /host/proc, sys_root: /host/sys}`.",
        "In containers, change the port with `LLM_EXPORTER_LISTEN` rather than `--listen`: the image's",
        "HEALTHCHECK reads that variable.",
        "",
        "### Engine targets",
        "",
        "Each `--engine` (or each entry of `engines:` / `LLM_EXPORTER_ENGINES`) is",
        "`URL[,OPTION=VALUE]...`; in YAML it may also be a mapping with `url:` and the same options.",
        "",
        "| Option | Meaning |",
        "| --- | --- |",
        *[f"| `{o}` | {_cell(TARGET_OPTIONS.get(o, 'see `llm-exporter run --help`'))} |" for o in options],
        "",
        "Secrets are never accepted inline (`token=`, `password=` ...): name a file or a variable.",
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
            print("docs/configuration.md is stale: run `python deploy/configuration_docs.py`", file=sys.stderr)
            return 1
        print("docs/configuration.md up to date")
        return 0
    if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
