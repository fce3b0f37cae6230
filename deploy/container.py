#!/usr/bin/env python3
"""Builds the llm-exporter image with podman or docker: `make image`.

    python deploy/container.py build  [--tag llm-exporter:local] [--base IMAGE] [--engine podman|docker]
    python deploy/container.py base   [--engine podman]      # only the local Debian base
    python deploy/container.py info   [--tag llm-exporter:local]   # size and start time, for docs/deploy.md

The Dockerfile's default base is the public python:3.11-slim. Where no registry answers (an air-gapped
build host, this project's CI), `build` makes a Debian bookworm base with debootstrap from the Debian
mirror the machine already uses and imports it (BASE_TAG), once: later builds reuse it.

Two things a host may need, found out here rather than configured by hand:
  - a TLS-intercepting proxy: the CA bundle the host trusts (LLM_EXPORTER_BUILD_CA, else $SSL_CERT_FILE,
    else Debian's bundle) goes to the build as the secret `ca-certificates`. pip reads it in the build
    stage only; the shipped image carries Debian's own bundle and nothing of this host's.
  - podman as root in a sandbox that cannot raise rlimits (podman's default nofile is 1048576) or
    whose cgroups crun refuses: `engine_env` writes a containers.conf with the host's own hard limits
    and runc, and points CONTAINERS_CONF at it. Tests and `make test-deploy` use the same function.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
STATE = ROOT / ".container"
DEFAULT_TAG = "llm-exporter:local"
PUBLIC_BASE = "docker.io/library/python:3.11-slim"
BASE_TAG = "localhost/llm-exporter-base:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# podman's own default for root; a host whose hard limit is lower makes every container fail to start.
PODMAN_DEFAULT_NOFILE = 1048576
# Left out of the local base: docs, manuals and translations nobody reads in a container, and apt's
# caches (the image never runs apt).
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt",
        "var/lib/apt/lists")


class ContainerError(RuntimeError):
    """A problem worth one line to the user."""


def engine(name: str | None = None) -> str:
    """podman, else docker (LLM_EXPORTER_CONTAINER_ENGINE or `name` chooses)."""
    wanted = name or os.environ.get("LLM_EXPORTER_CONTAINER_ENGINE")
    for candidate in ([wanted] if wanted else ["podman", "docker"]):
        if shutil.which(candidate):
            return candidate
    raise ContainerError(f"no container engine: install {wanted or 'podman (apt-get install podman) or docker'}")


def _podman_conf() -> str | None:
    """containers.conf lines this host needs, or None when podman's defaults work."""
    containers, engine_lines = [], []
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if os.geteuid() == 0 and nofile != resource.RLIM_INFINITY and nofile < PODMAN_DEFAULT_NOFILE:
        limits = [f'"nofile={nofile}:{nofile}"']
        if nproc != resource.RLIM_INFINITY:
            limits.append(f'"nproc={min(nproc, 32768)}:{min(nproc, 32768)}"')
        containers.append(f"default_ulimits = [{', '.join(limits)}]")
    # crun refuses a hybrid cgroup v1/v2 layout (cgroup2 mounted at /sys/fs/cgroup/unified); runc runs.
    if pathlib.Path("/sys/fs/cgroup/unified").is_dir() and shutil.which("runc"):
        engine_lines.append('runtime = "runc"')
    if not containers and not engine_lines:
        return None
    return "[containers]\n" + "\n".join(containers) + "\n[engine]\n" + "\n".join(engine_lines) + "\n"


def engine_env(tool: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to run `tool` with: for podman, CONTAINERS_CONF when this host needs one."""
    env = dict(os.environ if base is None else base)
    if tool != "podman" or "CONTAINERS_CONF" in env:
        return env
    conf = _podman_conf()
    if conf is not None:
        STATE.mkdir(exist_ok=True)
        path = STATE / "containers.conf"
        if not path.exists() or path.read_text() != conf:
            path.write_text(conf)
        env["CONTAINERS_CONF"] = str(path)
    return env


def run(tool: str, *args: str, timeout: float = 600, check: bool = True, quiet: bool = False,
        **kwargs) -> subprocess.CompletedProcess[str]:
    """One engine command with engine_env; a failure raises ContainerError with its stderr's tail."""
    result = subprocess.run([tool, *args], env=engine_env(tool), text=True, timeout=timeout,
                            capture_output=quiet, **kwargs)
    if check and result.returncode != 0:
        tail = (result.stderr or "").strip().splitlines()[-3:] if quiet else []
        raise ContainerError(f"{tool} {args[0]} failed ({result.returncode}): " + " / ".join(tail))
    return result


def image_exists(tool: str, image: str) -> bool:
    return run(tool, "image", "inspect", image, check=False, quiet=True, timeout=60).returncode == 0


def make_local_base(tool: str, tag: str = BASE_TAG, mirror: str = DEBIAN_MIRROR) -> str:
    """debootstrap a minimal bookworm with python3 and venv, trim it, import it as `tag`."""
    if shutil.which("debootstrap") is None:
        raise ContainerError("no registry answered and debootstrap is missing: apt-get install debootstrap")
    with tempfile.TemporaryDirectory(prefix="llm-exporter-base-") as tmp:
        rootfs = pathlib.Path(tmp) / "rootfs"
        print(f"making a local base: debootstrap bookworm from {mirror} (about 40 s)", flush=True)
        result = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv",
                                 "bookworm", str(rootfs), mirror], capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise ContainerError("debootstrap failed: " + " / ".join(result.stdout.strip().splitlines()[-3:]))
        for part in TRIM:
            shutil.rmtree(rootfs / part, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            run(tool, "import", "--change", "CMD [\"python3\"]", "-", tag, stdin=tar.stdout, quiet=True)
        finally:
            tar.wait()
    return tag


def registry_answers(tool: str, image: str = PUBLIC_BASE, timeout: float = 60) -> bool:
    """Whether `image` is here or can be pulled now."""
    if image_exists(tool, image):
        return True
    try:
        return run(tool, "pull", "-q", image, check=False, quiet=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def choose_base(tool: str, base: str | None) -> str:
    """`base` when given; the public base when a registry answers; else the local base (made once)."""
    if base:
        return base
    if registry_answers(tool):
        return PUBLIC_BASE
    if not image_exists(tool, BASE_TAG):
        make_local_base(tool)
    return BASE_TAG


def ca_bundle() -> pathlib.Path | None:
    """The CA bundle this host trusts, for pip in the build stage (behind a TLS-intercepting proxy)."""
    for candidate in (os.environ.get("LLM_EXPORTER_BUILD_CA"), os.environ.get("SSL_CERT_FILE"),
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and pathlib.Path(candidate).is_file():
            return pathlib.Path(candidate)
    return None


def build(tool: str, tag: str = DEFAULT_TAG, base: str | None = None) -> str:
    base = choose_base(tool, base)
    args = ["build", "--build-arg", f"PYTHON_IMAGE={base}", "-t", tag]
    if tool == "podman":
        args += ["--format", "docker"]  # the OCI format drops HEALTHCHECK
    ca = ca_bundle()
    if ca is not None:
        args += ["--secret", f"id=ca-certificates,src={ca}"]
    print(f"building {tag} on {base} with {tool}", flush=True)
    run(tool, *args, str(ROOT), timeout=1800)
    return tag


def size_mb(tool: str, tag: str) -> float:
    out = run(tool, "image", "inspect", "--format", "{{.Size}}", tag, quiet=True).stdout.strip()
    return int(out) / 1e6


def start_time_s(tool: str, tag: str, port: int = 19480) -> float:
    """Seconds from `run` to /healthz answering, the exporter alone (no engine, no GPU)."""
    name = f"llm-exporter-start-{os.getpid()}"
    started = time.monotonic()
    run(tool, "run", "-d", "--rm", "--name", name, "--read-only", "-p", f"127.0.0.1:{port}:9480", tag,
        "run", "--gpu-backend", "none", quiet=True)
    try:
        while time.monotonic() - started < 60:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return time.monotonic() - started
            except OSError:
                time.sleep(0.05)
        raise ContainerError("the container did not answer /healthz within 60 s")
    finally:
        run(tool, "rm", "-f", "-t", "2", name, check=False, quiet=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deploy/container.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "base", "info"))
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument("--base", help="the PYTHON_IMAGE to build on (default: public, else a local base)")
    parser.add_argument("--engine", help="podman or docker (default: podman when installed)")
    args = parser.parse_args(argv)
    try:
        tool = engine(args.engine)
        if args.command == "base":
            print(make_local_base(tool))
        elif args.command == "build":
            print(build(tool, args.tag, args.base))
        else:
            print(f"{args.tag}: {size_mb(tool, args.tag):.0f} MB, /healthz after {start_time_s(tool, args.tag):.2f} s")
    except (ContainerError, subprocess.TimeoutExpired) as exc:
        print(f"deploy/container.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
