"""The twin's real-time clock: wall-clock time to twin time, shared by the twin's HTTP server
(exporter/simulator/server.py) and its OpenAI API (openai_api.py), which times tokens by it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from exporter.simulator.twin import Twin


@dataclass(slots=True)
class RealtimeClock:
    """Maps wall-clock time to twin time. `speed` > 1 runs the twin faster than real time."""

    twin: Twin
    speed: float = 1.0
    started: float = field(default_factory=time.monotonic)
    offset: float = 0.0

    def sync(self) -> None:
        self.twin.advance_to(self.offset + (time.monotonic() - self.started) * self.speed)

    def wall_at(self, twin_t: float) -> float:
        """The time.monotonic() at which the twin's clock reaches `twin_t` (never, when stopped)."""
        return self.started + (twin_t - self.offset) / self.speed if self.speed > 0 else math.inf
