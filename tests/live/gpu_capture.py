"""Capture what the exporter reads from a real NVIDIA GPU: `python -m tests.live.gpu_capture OUT_DIR`.

Run on a machine with a GPU and its driver (the project's device check, see tests/fixtures/gpu/README.md).
It starts the real llama.cpp engine from the engine cache (tests/live/engines.py) and the real exporter
(`python -m exporter.cli run --gpu-backend nvml`) beside it, then loads the GPU with PyTorch in three phases
and, at the end of each, saves what a user would read:

- `idle`: nothing on the GPU;
- `compute`: bf16 matrix products back to back (SM- and tensor-bound);
- `membw`: device-to-device copies of a 4 GiB buffer (HBM-bound).

For each phase OUT_DIR gets `<phase>.prom` (the exporter's /metrics), `<phase>.diagnosis.json` and
`<phase>.doctor.txt`; beside them `card.json` (nvidia-smi's identity of the card and driver, pynvml's
version, GPM support as NVML answers it) and `run.log`. The engine runs on the host's processors (the cache
holds a CPU build); llama.cpp traffic runs during every phase so the engine's side is live too.

Nothing here changes a GPU setting: it only reads NVML and runs ordinary CUDA work.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

from tests.live import engines
from tests.live.traffic import complete

PHASES = ("idle", "compute", "membw")
PHASE_SECONDS = float(os.environ.get("GPU_CAPTURE_PHASE_S", "20"))
SETTLE_SECONDS = 4.0

# Runs in its own process so a CUDA failure cannot take the exporter or the capture down with it.
_LOAD = r"""
import sys, time, torch
kind, seconds = sys.argv[1], float(sys.argv[2])
dev = torch.device("cuda")
if kind == "compute":
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    step = lambda: a @ b
else:
    src = torch.empty(1 << 30, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    step = lambda: dst.copy_(src)
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    n += 10
print(f"{kind}: {n} steps in {seconds:.0f}s", flush=True)
"""

_SMI_FIELDS = ("name", "driver_version", "vbios_version", "memory.total", "power.limit", "power.max_limit",
               "clocks.max.sm", "clocks.max.memory", "pcie.link.gen.max", "pcie.link.width.max",
               "compute_cap", "mig.mode.current")


def card(out: pathlib.Path) -> dict:
    info: dict = {"captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
        info["nvidia_smi"] = [dict(zip(_SMI_FIELDS, (v.strip() for v in line.split(",")), strict=False))
                              for line in smi.stdout.splitlines() if line.strip()]
    except OSError as e:
        info["nvidia_smi"] = str(e)
    with open("/proc/version") as f:
        info["kernel"] = f.read().strip()
    try:
        _nvml(info)
    except Exception as e:  # no GPU here: the capture goes on and the exporter says why on its own page
        info["nvml_error"] = f"{type(e).__name__}: {e}"
    (out / "card.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _nvml(info: dict) -> None:
    import pynvml  # the product imports it lazily too

    info["pynvml"] = getattr(pynvml, "__version__", "?")
    pynvml.nvmlInit()
    try:
        info["nvml_version"] = pynvml.nvmlSystemGetNVMLVersion()
        info["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        gpm = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                gpm.append(bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice))
            except Exception as e:  # an old driver or a sandbox that refuses it: record what it said
                gpm.append(f"{type(e).__name__}: {e}")
        info["gpm_supported"] = gpm
    finally:
        pynvml.nvmlShutdown()


def _traffic(base_url: str, stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError):
            complete(base_url, f"Tell me about GPU metric {i}.", max_tokens=24, stream=i % 2 == 0)
        i += 1


def _get(url: str) -> bytes:
    status, body = engines.http_get(url, timeout=30)
    if status != 200:
        raise RuntimeError(f"{url} answered {status}")
    return body


def capture(out: pathlib.Path, log) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log(json.dumps(card(out)))
    engine_port, port = engines.free_port(), engines.free_port()
    url = f"http://127.0.0.1:{port}"
    with engines.start_llamacpp(engine_port, log_dir=out / "logs") as engine, \
            open(out / "exporter.log", "w") as exporter_log:
        log(f"llama-server ready in {engine.ready_seconds}s")
        exporter = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "run", "--engine",
             f"{engine.base_url}/metrics,kind=llamacpp,name=tiny-llama", "--gpu-backend", "nvml",
             "--listen", f"127.0.0.1:{port}", "--interval", "1s", "--engine-process-name", "llama-server",
             "--profile", "full"],  # the capture keeps every family the card gives
            stdout=exporter_log, stderr=subprocess.STDOUT,
            # The engine cache's variable is the tests', not a setting: the exporter would warn about it.
            env={k: v for k, v in os.environ.items() if not k.startswith("LLM_EXPORTER_")})
        stop = threading.Event()
        traffic = threading.Thread(target=_traffic, args=(engine.base_url, stop), daemon=True)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError, RuntimeError):
                    _get(url + "/readyz")
                    break
                time.sleep(0.5)
            traffic.start()
            for phase in PHASES:
                load = None
                if phase != "idle":
                    load = subprocess.Popen([sys.executable, "-c", _LOAD, phase, str(PHASE_SECONDS + 10)],
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                time.sleep(PHASE_SECONDS)
                (out / f"{phase}.prom").write_bytes(_get(url + "/metrics"))
                (out / f"{phase}.diagnosis.json").write_bytes(_get(url + "/api/v1/diagnosis"))
                doctor = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", url],
                                        capture_output=True, text=True, timeout=60)
                (out / f"{phase}.doctor.txt").write_text(doctor.stdout + doctor.stderr)
                if load is not None:
                    log(load.communicate(timeout=120)[0].strip())
                log(f"{phase}: captured")
                time.sleep(SETTLE_SECONDS)
        finally:
            stop.set()
            exporter.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                exporter.wait(15)
            traffic.join(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.live.gpu_capture", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "run.log", "a") as f:
        def log(line: str) -> None:
            stamp = time.strftime("%H:%M:%S")
            print(f"{stamp} {line}", flush=True)
            f.write(f"{stamp} {line}\n")
            f.flush()

        capture(args.out, log)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
