"""The host source's network links on a real kernel: a veth pair in a fresh network namespace,
real frames across it, and the real `llm-exporter run` in that namespace reporting the pair's own
bytes and a non-zero utilization (tests/netns_veth.py does the inside part).

Needs unshare(1) with user and network namespaces (root in CI; `unshare -rnm` works unprivileged
where user namespaces are allowed). Where it cannot make the namespace the test fails, loudly:
it never skips."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def test_veth_pair_traffic_shows_in_the_exporter_inside_its_namespace() -> None:
    unshare = shutil.which("unshare")
    assert unshare, "unshare(1) (util-linux) is needed to make a network namespace"
    assert shutil.which("ip"), "ip(8) (iproute2) is needed to make a veth pair"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run([unshare, "-rnm", "--fork", sys.executable, str(HERE / "netns_veth.py")],
                          capture_output=True, text=True, timeout=180, cwd=HERE.parent, env=env)
    assert done.returncode == 0, f"could not run in a new network namespace: {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    assert result["cycles_after_mark"] <= 2, result  # within two of the exporter's cycles
    assert result["eth0_transmit_bytes"] >= result["sent_before"] > 0
    assert result["eth1_receive_bytes"] >= result["sent_before"]
    assert 0 < result["eth0_transmit_utilization"] <= 1
    # This namespace's own sysfs: the NIC counters came from one /proc/self/net/dev read.
    assert result["in_process"] == {"own_namespace": True, "proc_net_dev_held": True, "counters_agree": True}
    # Both ends are read (a pod's eth0 is a veth), with their kind and no NUMA node.
    assert any(s.startswith("llm_host_network_info{") and "'device': 'eth0'" in s and "'kind': 'ethernet'" in s
               and "'numa_node': ''" in s for s in result["series"]), result["series"]
