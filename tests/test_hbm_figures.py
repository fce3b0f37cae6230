"""One HBM figure the user can trust (issue 39 item 3): the evidence names the figure the verdict
reads and, when GPM, the model and the engine's estimate differ by more than 10%, says why that one.
GPM is averaged over the same window as the modelled figure (roofline.py), so the two compare the
same seconds. The real process: tests/test_demo_roles.py::test_decode_heavy_hbm_figures_agree_or_say_which."""

from __future__ import annotations

from exporter.derive.bottleneck import HBM_AGREE, Signals, assess
from exporter.derive.roofline import compute
from exporter.derive.view import GpuView


def words(**signals) -> str:
    s = Signals(running=32, mean_batch=32, decode_tps=1000.0, prefill_tps=10.0, **signals)
    (line,) = [e for e in assess(s).evidence["memory_bandwidth"] if e.startswith("HBM")]
    return line


def test_figures_that_agree_are_named_together():
    line = words(hbm_gpm=0.70, hbm_model=0.72, hbm_engine=0.69)
    assert line == "HBM at 70% of peak by GPM; modelled 72% and the engine's estimate 69% agree within 10%"


def test_figures_that_differ_say_which_one_the_verdict_reads_and_why():
    line = words(hbm_gpm=0.57, hbm_model=0.74, hbm_engine=0.66)
    assert line.startswith("HBM at 57% of peak by GPM; modelled 74% and the engine's estimate 66% differ")
    assert "the verdict reads GPM" in line and "measured on the card" in line


def test_without_gpm_the_model_is_read_and_the_engine_estimate_is_compared():
    assert words(hbm_model=0.5) == "HBM at 50% of peak modelled (from decode steps/s and the model shape)"
    line = words(hbm_model=0.5, hbm_engine=0.8)
    assert "differs from it by more than 10%" in line and "the verdict reads the model" in line
    assert "agrees within" in words(hbm_model=0.5, hbm_engine=0.5 * (1 - HBM_AGREE / 2))


def test_gpm_is_read_over_the_window_when_one_is_given():
    gpu = GpuView("0", "GPU-0", "NVIDIA H100 80GB HBM3", {"llm_gpu_dram_bandwidth_utilization_ratio": 0.9}, {}, ())
    from exporter.specs.gpus import lookup_gpu
    spec = lookup_gpu(gpu.name)
    assert compute([gpu], [spec], None, 1, None, None).gpus[0].gpm_ratio == 0.9
    assert compute([gpu], [spec], None, 1, None, None, gpm={"GPU-0": 0.6}).gpus[0].gpm_ratio == 0.6
