"""Run the exporter in-process on a background thread with a real socket (for server tests)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Iterator, Sequence

from exporter.app import bind_listener, serve
from exporter.config import Config
from exporter.sources.base import Source
from tests.support import free_port, wait_until


@contextlib.contextmanager
def running_exporter(config: Config, sources: Sequence[Source], *,
                     tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Start serve() on its own event loop thread; yield the base URL; stop it on exit.
    `tls`: the client context for an exporter serving HTTPS (--web.config.file); the base URL is
    then https:// and readiness is probed through it."""
    if config.listen_port == 0:
        config = Config(**{**{f: getattr(config, f) for f in config.__dataclass_fields__},
                           "listen_host": "127.0.0.1", "listen_port": free_port()})
    sock = bind_listener(config)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    errors: list[BaseException] = []

    def runner() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve(config, sources, sock, stop))
        except BaseException as error:  # noqa: BLE001 - reported to the test below
            errors.append(error)

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    base = f"{'https' if tls else 'http'}://127.0.0.1:{config.listen_port}"
    import httpx

    wait_until(lambda: _ready(httpx, base, tls), timeout=15)
    try:
        yield base
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=15)
        if errors:
            raise errors[0]


def _ready(httpx_module, base: str, tls: ssl.SSLContext | None = None) -> bool:
    try:
        return httpx_module.get(base + "/readyz", timeout=1, verify=tls or True).status_code == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False
