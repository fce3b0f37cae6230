"""GPU sources: `nvml.py` reads real GPUs through NVML (nvidia-ml-py), `sim.py` simulates them.

Nothing here imports pynvml: NVML is loaded lazily inside NvmlSource, so importing the package
works on machines without a driver.
"""
