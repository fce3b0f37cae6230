"""An unresolvable engine host through the real `llm-exporter run`, with the real resolver.

A plain lookup of a name that does not exist still sends a query to the configured nameserver,
which is off this machine. Run inside a private network namespace (only loopback, no route), the
resolver fails locally and nothing leaves the namespace; the exporter and the client that reads
it share that namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INSIDE = textwrap.dedent("""
    import json, subprocess, sys, time, urllib.request
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    port = 19480
    proc = subprocess.Popen([sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}",
                             "--interval", "200ms", "--gpu-backend", "none", "--no-host",
                             "--engine", "http://no-such-host.invalid:9/metrics,name=gone"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    entry, deadline = None, time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/snapshot", timeout=2) as r:
                    entry = json.load(r)["sources"].get("engine:gone")
            except OSError:
                continue
            if entry and entry["errors_total"].get("dns", 0) >= 3:
                break
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    print(json.dumps({"entry": entry, "stderr": stderr.decode(errors="replace")}))
""")


def _namespace() -> list[str]:
    """The command prefix for a private network namespace: `unshare -rn` (a user namespace too, so
    root is not needed where user namespaces are allowed). Missing tools fail the test with what to
    install, as docs/testing.md promises: this test never skips."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    assert unshare and ip, ("unshare (Debian package util-linux) and ip (iproute2) are needed for a private "
                            "network namespace; `make debs` installs them")
    probe = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=30)
    assert probe.returncode == 0, ("`unshare -rn true` failed: this machine allows neither user namespaces nor "
                                   f"root here ({probe.stderr.decode(errors='replace').strip()})")
    return [unshare, "-rn"]


def test_run_reports_an_unresolvable_host_as_dns_with_the_resolvers_message():
    done = subprocess.run([*_namespace(), sys.executable, "-c", INSIDE], cwd=ROOT, capture_output=True,
                          timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    entry = result["entry"]
    assert entry is not None and not entry["ok"], result
    assert entry["error_reason"] == "dns" and entry["errors_total"].get("dns", 0) >= 3, entry
    assert "no-such-host.invalid" in entry["error"] and "name resolution" in entry["error"].lower(), entry
    # One log line for the state change, not one per failed cycle.
    lines = [line for line in result["stderr"].splitlines() if "no-such-host.invalid" in line]
    assert len(lines) == 1, result["stderr"]
