"""`llm-exporter mixin --config FILE` reads a file a user (or a pipeline) hands it: an alias bomb, a file
over the size bound and a FIFO are refused in one line with exit 2, within seconds and a small peak RSS,
as `run --config` refuses them (the same bounded loader, exporter/yamlsafe.py). Driven as a process, so
the RSS is the command's own."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import psutil
import pytest

RSS_BOUND = 128 << 20  # a whole render peaks at 36 MiB here; a 525-byte bomb expanded is GBs
WALL_BOUND_S = 30.0  # a refusal takes 0.5 s here; a FIFO opened blocking never ends


def _laughs(levels: int) -> str:
    lines = ['x0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\ndisabled_alerts: *a{levels - 1}\n"


def _mixin(config: pathlib.Path, out: pathlib.Path) -> tuple[int, str, float, int]:
    """(exit status, stderr, seconds, peak RSS) of `llm-exporter mixin --config config --out out`."""
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "mixin", "--out", str(out),
                                "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    watched, peak = psutil.Process(process.pid), 0
    while process.poll() is None and time.monotonic() - started < WALL_BOUND_S:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.01)
    if process.poll() is None:
        process.kill()
    _, stderr = process.communicate()
    return process.returncode, stderr, time.monotonic() - started, peak


@pytest.mark.parametrize(("make", "needle"), [
    (lambda p: p.write_text(_laughs(9)), "nodes once aliases are expanded"),  # 9**9 strings from 525 bytes
    (lambda p: p.write_text("x: " + "a" * (1 << 20) + "\n"), "larger than 1048576 bytes"),
    (lambda p: os.mkfifo(p), "not a regular file (a FIFO)"),
], ids=["billion-laughs", "over-1-MiB", "fifo"])
def test_a_hostile_mixin_config_is_refused_in_one_line_within_bounds(tmp_path, make, needle):
    config = tmp_path / "mixin.yaml"
    make(config)
    code, stderr, took, rss = _mixin(config, tmp_path / "out")
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], (code, stderr[:500])
    assert took < WALL_BOUND_S and rss < RSS_BOUND, (took, rss >> 20)
    assert not (tmp_path / "out").exists()
