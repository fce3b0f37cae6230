"""The deploy tier (`make test-deploy`, LLM_EXPORTER_DEPLOY=1): the image `make image` built, run
under podman as the Dockerfile, the Kubernetes manifests and docker-compose.yml say."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.harness import IMAGE, Podman


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    tool = Podman()
    assert tool("image", "inspect", IMAGE, check=False).returncode == 0, \
        f"no image {IMAGE}: run `make image` (make test-deploy does)"
    tool.cleanup()
    try:
        yield tool
    finally:
        tool.cleanup()
