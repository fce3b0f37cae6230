"""Smoke test of the live tier's engines: each one installs (a no-op when the cache has it), starts on
loopback, answers one real completion, and serves a /metrics page in its own family namespace.

Slow and heavy (installs are minutes cold, a vLLM start about a minute), so marked `live`; tests/conftest.py
leaves tests/live out of a plain `pytest` unless LLM_EXPORTER_LIVE=1 (`make test-live`) or the path is named."""

from __future__ import annotations

import pytest

from tests.live import engines
from tests.live.capture import families
from tests.live.traffic import complete, get_json

pytestmark = [pytest.mark.live, pytest.mark.timeout(90 * 60)]


@pytest.fixture(scope="module")
def installed() -> None:
    # Cached installs return at once; a fresh machine pays the install here (see engines.py for times).
    engines.install_all()


@pytest.mark.parametrize(
    ("start", "prefix"),
    [(engines.start_llamacpp, "llamacpp:"), (engines.start_vllm, "vllm:")],
    ids=["llamacpp", "vllm"],
)
def test_engine_serves_metrics(installed: None, start, prefix: str) -> None:
    with start(engines.free_port()) as engine:
        status, models = get_json(engine.base_url, "/v1/models")
        assert status == 200 and engines.SERVED_MODEL_NAME in str(models), models
        done = complete(engine.base_url, "Is the cache full?", max_tokens=8)
        assert done.status == 200 and done.completion_tokens == 8, done
        status, body = engines.http_get(engine.base_url + "/metrics")
        assert status == 200, engine.log_tail()
        names = families(body.decode())
        assert names, "no # TYPE lines on /metrics"
        ours = [n for n in names if n.startswith(prefix)]
        assert ours, f"no {prefix} family on /metrics: {sorted(names)[:20]}"
        assert engine.process.poll() is None, engine.log_tail()
    assert engine.process.poll() is not None, "stop() left the engine running"
