"""The physics every layer may read: the roofline step-cost model of an inference engine on its device
(costs.py). The runtime's live cost-model check (exporter/derive/modelcheck.py), the digital twin
(exporter/simulator/) and the planner (exporter/planner/) all cost a step here; it imports nothing from
exporter/ but the specs (docs/developing.md, "Layers")."""
