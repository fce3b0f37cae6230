"""`llm-exporter plan`: a what-if planner calibrated on the deployment as it runs.

observe (what the deployment did: operating points from an exporter window or a load-test JSON)
-> calibrate (the twin's roofline step cost fitted to those points) -> replay (the observed workload
through the twin's engine under each candidate) -> report (table, JSON, HTML). docs/planner.md.
"""
