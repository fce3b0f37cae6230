#!/usr/bin/env python3
"""The docker-compose demo stack without Docker: twin + exporter + Alertmanager + Prometheus on loopback.

    python deploy/stack.py up       [--dir .stack] [--exporter-port N] ... [--scrape-interval 1s]
    python deploy/stack.py status   [--dir .stack]
    python deploy/stack.py down     [--dir .stack] [--purge]

`make stack` / `make stack-down` call it with the project's venv. It runs the Debian packages'
`prometheus` and `prometheus-alertmanager` (or `alertmanager`) binaries and this checkout's
exporter and twin, each as a background process whose pid, log and data live under --dir.

Nothing here restates the stack: it is read from docker-compose.yml (the `demo` profile) and the
files that mounts. Each service's command and environment are taken from the compose file with
${VAR:-default} resolved from the environment, then .env, then the compose defaults; compose
service names are replaced by 127.0.0.1 and the published host ports; container paths are mapped
back through the service's volumes (a bind mount to the checkout, a named volume to
<dir>/volumes/<name>). Prometheus's config is rendered the same way into <dir>/prometheus.yml:
the targets of deploy/prometheus/prometheus.yml become 127.0.0.1:<port> and rule_files absolute
paths to alerts/rules. Grafana and vLLM are compose-only.

Ports: the compose `ports:` entries, i.e. EXPORTER_PORT, PROMETHEUS_PORT, ALERTMANAGER_PORT and
TWIN_PORT from the environment or .env (defaults 9480, 9090, 9093, 8100), or the flags below.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `exporter` importable
    sys.path.insert(0, str(ROOT))

from exporter.yamlsafe import YamlLoadError, load_yaml_file  # noqa: E402

COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_FILE = ROOT / ".env"
DEFAULT_DIR = ROOT / ".stack"
PROFILE = "demo"
# Started in this order, stopped in reverse. Each: the compose service, how it is health-checked.
SERVICES = ("twin", "exporter", "alertmanager", "prometheus")
READY_PATH = {"twin": "/health", "exporter": "/readyz", "alertmanager": "/-/ready", "prometheus": "/-/ready"}
PORT_FLAGS = {"exporter": "exporter_port", "prometheus": "prometheus_port",
              "alertmanager": "alertmanager_port", "twin": "twin_port"}
# host:port at the start of a value or after / = , @ or a space; the host may be empty (":9090").
_ADDRESS = re.compile(r"(?:^|(?<=[/=,@\s]))([A-Za-z][\w.-]*|0\.0\.0\.0|):(\d{2,5})\b")
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class StackError(RuntimeError):
    """A problem worth one line to the user."""


# ------------------------------------------------------------------------------------------------
# Reading docker-compose.yml
# ------------------------------------------------------------------------------------------------
def read_env_file(path: pathlib.Path = ENV_FILE) -> dict[str, str]:
    """KEY=VALUE lines of a compose .env file (comments and blank lines skipped, quotes removed)."""
    values: dict[str, str] = {}
    if not path.exists():
        return values
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, $VAR and $$."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        op, arg = match.group(2), match.group(3) or ""
        value = variables.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return arg if value is None else value
        if op in (":?", "?") and (value is None or (op == ":?" and not value)):
            raise StackError(f"{name} must be set: {arg}")
        return value or ""

    return _VAR.sub(one, text)


def load_compose(variables: Mapping[str, str], path: pathlib.Path = COMPOSE_FILE) -> dict:
    """The compose file with every string interpolated (YAML anchors and merge keys resolved)."""

    def walk(node: object) -> object:
        if isinstance(node, str):
            return interpolate(node, variables)
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        return node

    return walk(_load_yaml(path))  # type: ignore[return-value]


def _load_yaml(path: pathlib.Path) -> object:
    """A YAML file of the stack with the exporter's loader: bounded, and a key written twice is an
    error naming the file, line and key (PyYAML would keep the last one silently)."""
    try:
        return load_yaml_file(path)
    except YamlLoadError as error:
        raise StackError(f"{path}: {error}") from None


def published_port(service: dict, container_port: int | None = None) -> tuple[int, int]:
    """(host port, container port) of the service's first (or the given) published port."""
    for entry in service.get("ports", []):
        parts = str(entry).split(":")
        host, target = int(parts[-2]), int(parts[-1].split("/")[0])
        if container_port in (None, target):
            return host, target
    raise StackError(f"service publishes no port {container_port or ''}".strip())


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


# ------------------------------------------------------------------------------------------------
# The plan: what to run, rewritten for loopback
# ------------------------------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    url: str
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class Plan:
    directory: pathlib.Path
    procs: list[Proc]
    prometheus_config: str


class Loopback:
    """Rewrites compose addresses and container paths for processes on this machine."""

    def __init__(self, compose: dict, ports: Mapping[str, int], directory: pathlib.Path) -> None:
        self.compose = compose
        self.directory = directory
        self.hosts: dict[tuple[str, int], int] = {}  # (service, container port) -> host port
        for name in SERVICES:
            _, target = published_port(compose["services"][name])
            self.hosts[(name, target)] = ports[name]

    def address(self, text: str, service: str) -> str:
        """service:port -> 127.0.0.1:hostport; localhost:port and 0.0.0.0 of `service` likewise."""

        def sub(match: re.Match[str]) -> str:
            host, port = match.group(1) or "", int(match.group(2))
            owner = service if host in ("localhost", "127.0.0.1", "0.0.0.0", "") else host
            if (owner, port) not in self.hosts:
                if host in ("localhost", "127.0.0.1"):
                    return match.group(0)
                raise StackError(f"{service}: {host}:{port} is not a service port that `make stack` runs")
            return f"127.0.0.1:{self.hosts[(owner, port)]}"

        return _ADDRESS.sub(sub, text)

    def path(self, text: str, service: str) -> str:
        """A container path -> the bind-mounted file in the checkout or <dir>/volumes/<name>."""
        for volume in self.compose["services"][service].get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if text == target or text.startswith(target.rstrip("/") + "/"):
                rest = text[len(target.rstrip("/")):]
                if source.startswith((".", "/")):
                    return str((ROOT / source).resolve()) + rest
                local = self.directory / "volumes" / source
                local.mkdir(parents=True, exist_ok=True)
                return str(local) + rest
        return text

    def arg(self, arg: str, service: str) -> str:
        flag, sep, value = arg.partition("=")
        if not sep:
            return arg
        if flag in ("--host",):
            return f"{flag}=127.0.0.1"
        if flag in ("--port",):
            return f"{flag}={self.hosts[(service, int(value))]}"
        if flag.endswith("listen-address") and value:
            return f"{flag}={self.address(value, service)}"
        if value.startswith("/"):
            return f"{flag}={self.path(value, service)}"
        return f"{flag}={self.address(value, service)}"


def render_prometheus(compose: dict, loop: Loopback, scrape_interval: str | None) -> str:
    """deploy/prometheus/prometheus.yml with loopback targets and absolute rule paths."""
    service = compose["services"]["prometheus"]
    config_arg = next(a for a in service["command"] if a.startswith("--config.file="))
    source = pathlib.Path(loop.path(config_arg.partition("=")[2], "prometheus"))
    config = _load_yaml(source)
    config["rule_files"] = [loop.path(p, "prometheus") for p in config.get("rule_files", [])]

    def targets(static_configs: list[dict], owner: str) -> None:
        for static in static_configs:
            static["targets"] = [loop.address(t, owner) for t in static.get("targets", [])]

    for am in config.get("alerting", {}).get("alertmanagers", []):
        targets(am.get("static_configs", []), "prometheus")
    for job in config.get("scrape_configs", []):
        targets(job.get("static_configs", []), "prometheus")
        if scrape_interval:
            job["scrape_interval"] = scrape_interval
            job.pop("scrape_timeout", None)
    if scrape_interval:
        config.setdefault("global", {}).update(scrape_interval=scrape_interval, evaluation_interval=scrape_interval)
        config["global"].pop("scrape_timeout", None)
    header = (f"# Rendered by deploy/stack.py from {source.relative_to(ROOT)} for loopback; do not edit.\n"
              "# Compose service names -> 127.0.0.1:<published port>, rule_files -> the checkout.\n")
    return header + yaml.safe_dump(config, sort_keys=False)


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise StackError(f"{' or '.join(names)} not found: install the Debian package (make debs)")


def plan(directory: pathlib.Path, ports: Mapping[str, int | None], scrape_interval: str | None,
         variables: Mapping[str, str]) -> Plan:
    compose = load_compose(variables)
    services = compose["services"]
    for name in SERVICES:
        profiles = services[name].get("profiles")
        if profiles and PROFILE not in profiles:
            raise StackError(f"compose service {name} is not in the {PROFILE} profile")
    resolved = {name: ports.get(name) or published_port(services[name])[0] for name in SERVICES}
    loop = Loopback(compose, resolved, directory)
    python = sys.executable
    procs: list[Proc] = []
    for name in SERVICES:
        svc = services[name]
        command = [loop.arg(str(a), name) for a in svc.get("command", [])]
        if name == "twin":
            entry = [str(a) for a in svc["entrypoint"]]
            argv = [python if entry[0] == "python" else entry[0], *entry[1:], *command]
        elif name == "exporter":
            argv = [python, "-m", "exporter.cli", *command]  # the image's ENTRYPOINT is llm-exporter
        elif name == "alertmanager":
            argv = [_binary("prometheus-alertmanager", "alertmanager"), *command]
        else:
            argv = [_binary("prometheus"), *[a if not a.startswith("--config.file=") else
                                             f"--config.file={directory / 'prometheus.yml'}" for a in command]]
        env = {k: loop.address(v, name) for k, v in environment(svc).items()}
        port = resolved[name]
        procs.append(Proc(name, argv, env, port, f"http://127.0.0.1:{port}"))
    return Plan(directory, procs, render_prometheus(compose, loop, scrape_interval))


# ------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------
def _pidfile(directory: pathlib.Path, name: str) -> pathlib.Path:
    return directory / "pids" / f"{name}.pid"


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts = parts[:-1]
    return [p.decode(errors="replace") for p in parts] or None


def _alive(directory: pathlib.Path, name: str) -> int | None:
    """The pid of a running service this launcher started (pid and command line both match)."""
    path = _pidfile(directory, name)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    cmdline = _cmdline(int(record["pid"]))
    return int(record["pid"]) if cmdline == record["argv"] else None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _tail(path: pathlib.Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start(p: Plan, timeout_s: float = 30.0) -> None:
    directory = p.directory
    for sub in ("pids", "logs"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    (directory / "prometheus.yml").write_text(p.prometheus_config, encoding="utf-8")
    running = [proc.name for proc in p.procs if _alive(directory, proc.name)]
    if running:
        raise StackError(f"already running ({', '.join(running)}): `make stack-down` first")
    # Two services on one port: the second would exit on its bind while the first answered its
    # readiness check, and the stack would look up with a service missing.
    by_port: dict[int, list[str]] = {}
    for proc in p.procs:
        by_port.setdefault(proc.port, []).append(proc.name)
    shared = [f"{' and '.join(names)} on {port}" for port, names in by_port.items() if len(names) > 1]
    if shared:
        raise StackError("one port for two services (" + "; ".join(shared) + "): give each its own")
    busy = [f"{proc.name} {proc.port} ({PORT_FLAGS[proc.name].upper()})" for proc in p.procs
            if not _port_free(proc.port)]
    if busy:
        raise StackError("port(s) in use: " + ", ".join(busy) + "; set another in .env or the environment")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_EXPORTER_")}
    base_env["PYTHONUNBUFFERED"] = "1"
    try:
        for proc in p.procs:
            log = directory / "logs" / f"{proc.name}.log"
            with open(log, "ab") as out:
                child = subprocess.Popen(proc.argv, cwd=ROOT, env={**base_env, **proc.env}, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            _pidfile(directory, proc.name).write_text(json.dumps(
                {"pid": child.pid, "argv": proc.argv, "url": proc.url, "log": str(log)}))
            deadline = time.monotonic() + timeout_s
            while not _ready(proc.url + READY_PATH[proc.name]):
                if child.poll() is not None or time.monotonic() > deadline:
                    why = f"exited with {child.returncode}" if child.poll() is not None else "not ready in time"
                    raise StackError(f"{proc.name} {why}; {log}:\n{_tail(log)}")
                time.sleep(0.1)
    except BaseException:
        stop(directory)
        raise
    (directory / "stack.json").write_text(json.dumps(
        {proc.name: {"url": proc.url, "argv": proc.argv, "env": proc.env} for proc in p.procs}, indent=2))


def stop(directory: pathlib.Path, timeout_s: float = 10.0) -> list[str]:
    """SIGTERM each service this launcher started (reverse order), SIGKILL after timeout_s."""
    stopped = []
    for name in reversed(SERVICES):
        pid = _alive(directory, name)
        path = _pidfile(directory, name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _cmdline(pid) is not None and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # reap when the caller is our parent (tests)
                time.sleep(0.05)
            if _cmdline(pid) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stopped.append(name)
        path.unlink(missing_ok=True)
    return stopped


def status(directory: pathlib.Path) -> list[tuple[str, int | None, str]]:
    rows = []
    for name in SERVICES:
        path = _pidfile(directory, name)
        url = json.loads(path.read_text())["url"] if path.exists() else ""
        rows.append((name, _alive(directory, name), url))
    return rows


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="deploy/stack.py", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down", "status", "render"))
    parser.add_argument("--dir", type=pathlib.Path, default=DEFAULT_DIR, help="pids, logs, data (default .stack)")
    for name, dest in PORT_FLAGS.items():
        parser.add_argument(f"--{name}-port", dest=dest, type=int, help=f"host port of {name}")
    parser.add_argument("--scrape-interval", help="override every scrape and evaluation interval (e.g. 1s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds each service may take to be ready")
    parser.add_argument("--purge", action="store_true", help="down: also delete the directory (data, logs)")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    directory = args.dir.resolve()
    variables = {**read_env_file(), **env}
    ports = {name: getattr(args, dest) for name, dest in PORT_FLAGS.items()}
    try:
        if args.action == "down":
            stopped = stop(directory)
            if args.purge and directory.exists():
                shutil.rmtree(directory)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
            return 0
        if args.action == "status":
            rows = status(directory)
            for name, pid, url in rows:
                print(f"{name:13} {'up   pid ' + str(pid) if pid else 'down':16} {url}")
            return 0 if all(pid for _, pid, _ in rows) else 3
        the_plan = plan(directory, ports, args.scrape_interval, variables)
        if args.action == "render":
            sys.stdout.write(the_plan.prometheus_config)
            return 0
        start(the_plan, timeout_s=args.timeout)
    except StackError as error:
        print(f"stack: {error}", file=sys.stderr)
        return 1
    urls = {proc.name: proc.url for proc in the_plan.procs}
    print(f"stack up (logs and data in {directory}):")
    for name, url in urls.items():
        print(f"  {name:13} {url}")
    print(f"  targets       {urls['prometheus']}/targets   rules {urls['prometheus']}/rules")
    print("stop with `make stack-down`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
