"""The digital twin: a continuous-batching engine on simulated GPUs, serving engine-format /metrics."""

from exporter.simulator.scenarios import SCENARIOS, Scenario, get_scenario
from exporter.simulator.twin import Twin, TwinConfig, pd_pair

__all__ = ["SCENARIOS", "Scenario", "Twin", "TwinConfig", "get_scenario", "pd_pair"]
