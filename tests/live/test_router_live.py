"""A real router in front of a live engine and a twin (make test-live): vllm-router 0.1.17, round robin,
in front of llama.cpp (tests/live/engines.py) and the twin's OpenAI API, read by `llm-exporter run` with
both engines as targets. Checks what tests/test_routers_live.py checks on twins alone, with a real engine
behind the router: the live page fully accounted for, the per-backend counters equal to the router's
own, the llama.cpp backend joined to its engine target (the share and the diagnosis name it), and the
twin killed: taken out by the router, reported by the exporter, LLMRouterBackendOut firing in a promtool
test built from the recorded series."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from exporter.sources.engines.accounting import unaccounted
from exporter.sources.routers.registry import SPECS
from tests import routers
from tests.live import engines
from tests.support import exporter_run, free_port, stop_process, wait_until
from tests.test_routers_live import (
    _router_backend_counts,
    _router_says_out,
    promtool_backend_out,
    twin,
    values,
    verdicts,
)

pytestmark = pytest.mark.skipif(os.environ.get("LLM_EXPORTER_LIVE") != "1",
                                reason="the live tier: make test-live (LLM_EXPORTER_LIVE=1)")


def _send(url: str, n: int) -> int:
    body = json.dumps({"model": "tiny-llama", "prompt": "Say hello to the router.", "max_tokens": 8}).encode()
    ok = 0
    for _ in range(n):
        request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                r.read()
                ok += r.status == 200
        except OSError:
            pass
    return ok


def test_vllm_router_in_front_of_llamacpp_and_a_twin(tmp_path):
    routers.install(log=lambda *_: None)
    with engines.start_llamacpp(free_port(), log_dir=tmp_path) as llama, twin(3) as (twin_url, twin_process):
        router = routers.start("vllm-router", [llama.base_url, twin_url], port=free_port(), metrics_port=free_port(),
                               policy="round_robin", log_dir=tmp_path)
        with router, exporter_run("--engine", f"{llama.base_url}/metrics,name=llama,model=tiny-llama",
                                  "--engine", f"{twin_url}/metrics,name=twin",
                                  "--router", f"{router.metrics_url},name=gw") as (base, _, _):
            assert _send(router.url, 12) == 12
            page = router.page()
            assert unaccounted(SPECS["vllm-router"].accounting, page) == []

            def counted() -> bool:
                got = {dict(k)["backend"]: v for k, v in
                       values(base, "llm_router_backend_requests_total", target="gw").items()}
                return got == _router_backend_counts("vllm-router", page) and sum(got.values()) >= 12

            assert wait_until(counted, timeout=10, interval=0.3), (values(base, "llm_router_backend_requests_total"),
                                                                  page)
            llama_backend = llama.base_url.removeprefix("http://")
            assert wait_until(lambda: bool(values(base, "llm_router_backend_share_ratio", backend=llama_backend)),
                              timeout=30, interval=0.5)
            diagnosis = json.loads(urllib.request.urlopen(f"{base}/api/v1/diagnosis", timeout=10).read())
            routing = diagnosis["targets"]["llama"]["numbers"]["routing"]["gw"]
            assert routing["backend"] == llama_backend and routing["in_rotation"], routing
            assert "routing" not in verdicts(base).values()

            # The twin killed: the router takes it out, the exporter says so, the alert's test fires.
            series: dict = {"up": [], "open": []}
            backend = twin_url.removeprefix("http://")
            stop_process(twin_process)
            for _ in range(30):
                _send(router.url, 1)
                up = values(base, "llm_router_backend_up", target="gw", backend=backend)
                opened = values(base, "llm_router_backend_breaker_state", target="gw", backend=backend, state="open")
                series["up"].append(next(iter(up.values()), 1.0))
                series["open"].append(next(iter(opened.values()), 0.0))
                if len(series["up"]) >= 5 and (series["up"][-1] == 0 or series["open"][-1] == 1):
                    break
            assert _router_says_out("vllm-router", router.page(), backend), router.log_tail()
            assert series["up"][-1] == 0 or series["open"][-1] == 1, series
            instance = base.removeprefix("http://")
            series["labels"] = (f'job="llm-exporter",instance="{instance}",target="gw",router="vllm-router",'
                                f'backend="{backend}"')
            promtool_backend_out(series, 0, tmp_path)
            # The live engine keeps serving through the router.
            assert _send(router.url, 3) == 3
