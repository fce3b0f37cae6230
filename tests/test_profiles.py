"""Profiles (exporter/catalog/profiles.py, families.csv): every shipped rule and panel a profile serves
reads only what it writes; the file formats fail with a clear error; the real process writes exactly a
profile's families, or a --families file's, and the budgets hold (series per replica)."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import subprocess
import sys

import httpx
import pytest
import yaml

from exporter import catalog
from exporter.catalog import profiles
from exporter.collect import written_only
from exporter.mixin import served
from exporter.snapshot import Sample
from tests.support import exporter_run, fake_engine

ROOT = pathlib.Path(__file__).resolve().parent.parent
RULES = {p.name: yaml.safe_load(p.read_text())["groups"] for p in sorted((ROOT / "alerts" / "rules").glob("*.yaml"))}
BOARDS = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}


def test_every_rule_and_panel_a_profile_serves_reads_only_what_it_writes():
    assert served.violations(RULES, BOARDS) == []


def test_profiles_nest_and_full_writes_every_family():
    minimal, default, full = (profiles.families(p) for p in profiles.PROFILES)
    assert minimal < default < full == set(catalog.FAMILIES)
    assert all(profiles.selection("full")[name] is None for name in catalog.FAMILIES)
    # The verdict, the SLO burn inputs and the hardware faults are in the smallest profile.
    assert {"llm_bottleneck", "llm_time_to_first_token_seconds", "llm_inter_token_latency_seconds",
            "llm_gpu_xid_errors_total", "llm_gpu_up", "llm_exporter_build_info"} <= minimal


def _plant(rules: dict, file: str, expr: str) -> dict:
    planted = copy.deepcopy(rules)
    planted[file][0]["rules"].append({"alert": "Planted", "expr": expr})
    return planted


def test_a_planted_rule_reading_a_family_its_profile_leaves_out_fails():
    problems = served.violations(_plant(RULES, "slo.yaml", "llm_iteration_tokens_count > 0"), BOARDS)
    assert problems == ["minimal: rule slo.yaml:Planted reads llm_iteration_tokens, which the minimal profile "
                        "leaves out", "default: rule slo.yaml:Planted reads llm_iteration_tokens, which the "
                        "default profile leaves out"]


def test_a_planted_rule_reading_series_a_profile_leaves_out_fails():
    """ECC: minimal writes only type="uncorrected"; a minimal rule on corrected errors reads nothing."""
    problems = served.violations(_plant(RULES, "slo.yaml", 'rate(llm_gpu_ecc_errors_total{type="corrected"}[5m]) > 0'),
                                 BOARDS)
    assert any("llm_gpu_ecc_errors_total{type=corrected}" in p and p.startswith("minimal:") for p in problems)
    fine = served.violations(_plant(RULES, "slo.yaml", 'rate(llm_gpu_ecc_errors_total{type="uncorrected"}[5m]) > 0'),
                             BOARDS)
    assert fine == []


def test_a_planted_rule_reaches_a_family_through_a_recording_rule():
    planted = copy.deepcopy(RULES)
    planted["recording.yaml"][0]["rules"].append({"record": "x:planted:rate5m",
                                                  "expr": "rate(llm_engine_steps_total[5m])"})
    planted["slo.yaml"][0]["rules"].append({"alert": "Planted", "expr": "x:planted:rate5m > 1"})
    problems = served.violations(planted, BOARDS)
    assert any(p.startswith("minimal: rule slo.yaml:Planted reads llm_engine_steps_total") for p in problems)


def test_a_planted_panel_on_the_fleet_board_fails_for_minimal():
    boards = copy.deepcopy(BOARDS)
    boards["llm-serving-fleet"]["panels"].append(
        {"title": "Planted", "targets": [{"expr": "sum(rate(llm_kv_transfer_bytes_sum[5m]))"}]})
    problems = served.violations(RULES, boards)
    assert problems == ["minimal: panel llm-serving-fleet:Planted reads llm_kv_transfer_bytes, which the minimal "
                        "profile leaves out"]


def test_a_declared_rule_or_panel_that_matches_nothing_is_reported():
    stale = dict(profiles.SERVES)
    stale["minimal"] = profiles.Serves(rules=("hardware.yaml:LLMGone",), boards=("llm-serving-fleet:Gone",))
    problems = served.violations(RULES, BOARDS, serves=stale)
    assert "minimal: declares rule 'hardware.yaml:LLMGone', which matches no shipped rule" in problems
    assert "minimal: declares panel 'llm-serving-fleet:Gone', which matches no shipped panel" in problems


@pytest.mark.parametrize(("text", "error"), [
    ("llm_gpu_up,full,x\nllm_gpu_up,minimal,y\n", "one unrestricted row at most"),
    ("llm_gpu_upp,minimal,x\n", "unknown family 'llm_gpu_upp' (did you mean 'llm_gpu_up'?)"),
    ("llm_gpu_up,tiny,x\n", "expected family,profile"),
    ("llm_gpu_up{nope=a},minimal,x\n", "has no label 'nope'"),
    ("llm_gpu_up,minimal,\n", "expected family,profile"),
])
def test_the_shipped_format_refuses_what_it_cannot_use(text, error):
    with pytest.raises(profiles.FamiliesFileError, match=re.escape(error)):
        profiles.parse_shipped(text, {"llm_gpu_up": catalog.FAMILIES["llm_gpu_up"]})


def test_a_restricted_row_may_not_sit_above_the_whole_family():
    text = "llm_gpu_up,minimal,x\nllm_gpu_up{gpu=0},default,y\n"
    with pytest.raises(profiles.FamiliesFileError, match="larger profile than its restricted rows"):
        profiles.parse_shipped(text, {"llm_gpu_up": catalog.FAMILIES["llm_gpu_up"]})


def test_a_users_file_selects_families_and_series(tmp_path):
    path = tmp_path / "families.csv"
    path.write_text("# mine\nfamily,profile,why\nllm_engine_up,minimal,x\nllm_gpu_ecc_errors_total{type=uncorrected}\n"
                    "llm_gpu_ecc_errors_total{type=corrected}\n")
    chosen = profiles.read_families_file(str(path))
    assert dict(chosen) == {"llm_engine_up": None,
                            "llm_gpu_ecc_errors_total": ("type", frozenset({"uncorrected", "corrected"}))}


@pytest.mark.parametrize(("content", "error"), [
    (b"", "lists no family"),
    (b"llm_nope\n", "unknown family"),
    (b"\xff\xfe", "not UTF-8"),
    (b"llm_engine_up\n" * (profiles.MAX_FAMILIES_FILE_LINES + 1), "more than"),
    (b"llm_gpu_ecc_errors_total{type=a}\nllm_gpu_ecc_errors_total{gpu=0}\n", "restricted by two labels"),
])
def test_a_users_file_that_cannot_be_used_is_refused(tmp_path, content, error):
    path = tmp_path / "families.csv"
    path.write_bytes(content)
    with pytest.raises(profiles.FamiliesFileError, match=error):
        profiles.read_families_file(str(path))


def test_a_huge_users_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "families.csv"
    path.write_bytes(b"#" * (profiles.MAX_FAMILIES_FILE_BYTES + 1))
    with pytest.raises(OSError, match="larger than"):
        profiles.read_families_file(str(path))


def test_written_only_keeps_the_listed_series():
    samples = [Sample("llm_engine_up", (("engine", "vllm"),), 1.0),
               Sample("llm_gpu_ecc_errors_total", (("gpu", "0"), ("type", "corrected")), 3.0),
               Sample("llm_gpu_ecc_errors_total", (("gpu", "0"), ("type", "uncorrected")), 0.0),
               Sample("llm_gpu_up", (("gpu", "0"),), 1.0)]
    written = {"llm_engine_up": None, "llm_gpu_ecc_errors_total": ("type", frozenset({"uncorrected"}))}
    assert [s.value for s in written_only(samples, written)] == [1.0, 0.0]


VLLM_PAGE = ROOT / "tests" / "fixtures" / "engines" / "vllm-v0.34.0__crafted_from_source.prom"


def _families_on(text: str) -> set[str]:
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    return {f.name for n in names if (f := catalog.family_of(n)) is not None}


@pytest.fixture(scope="module")
def engine_url():
    with fake_engine(VLLM_PAGE.read_bytes()) as (url, _):
        yield url


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_the_real_process_writes_exactly_its_profiles_families(engine_url, profile):
    with exporter_run("--engine", engine_url, "--profile", profile) as (base, _, _):
        written = _families_on(httpx.get(base + "/metrics", timeout=10).text)
    assert written, "nothing written"
    assert written <= profiles.families(profile)
    if profile != "full":
        bigger = profiles.PROFILES[profiles.PROFILES.index(profile) + 1]
        # what the bigger profile adds for this engine is really left out
        with exporter_run("--engine", engine_url, "--profile", bigger) as (base, _, _):
            more = _families_on(httpx.get(base + "/metrics", timeout=10).text)
        assert more - profiles.families(profile)  # what the profile leaves out is there to leave out


def test_the_real_process_writes_exactly_a_families_file(engine_url, tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("llm_engine_up\nllm_requests_running\nllm_exporter_build_info\n")
    with exporter_run("--engine", engine_url, "--families", str(path), "--profile", "minimal") as (base, _, _):
        written = _families_on(httpx.get(base + "/metrics", timeout=10).text)
    assert written == {"llm_engine_up", "llm_requests_running", "llm_exporter_build_info"}


def test_a_families_file_that_cannot_be_used_stops_the_start_with_one_line(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("llm_engine_upp\n")
    result = subprocess.run([sys.executable, "-m", "exporter.cli", "run", "--families", str(path), "--listen",
                             "127.0.0.1:0", "--gpu-backend", "none", "--no-host"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "invalid families_file=" in result.stderr and "did you mean 'llm_engine_up'" in result.stderr
    assert "Traceback" not in result.stderr


def test_histogram_buckets_slo_writes_only_what_the_burn_rate_rules_read(engine_url):
    """For a Prometheus that also scrapes the engine: the re-exported histograms shrink to the SLO
    thresholds' buckets (the burn-rate rules' input), the rest of the engine's histograms go."""
    with exporter_run("--engine", engine_url, "--histogram-buckets", "slo") as (base, _, _):
        text = httpx.get(base + "/metrics", timeout=10).text
    buckets = [line.split(" ")[0] for line in text.splitlines() if "_bucket{" in line and not line.startswith("#")]
    ttft = sorted(b for b in buckets if b.startswith("llm_time_to_first_token_seconds_bucket"))
    assert ttft and {t.split('le="')[1].split('"')[0] for t in ttft} == {"+Inf", "2.5"}
    assert {b.split("_bucket")[0] for b in buckets} <= {"llm_time_to_first_token_seconds",
                                                         "llm_inter_token_latency_seconds"}
    written = _families_on(text)
    assert "llm_e2e_request_latency_seconds" not in written and "llm_requests_running" in written


def test_series_per_replica_stay_within_the_budgets():
    """docs/metrics.md "Profiles": a 1-GPU vLLM replica adds at most 150 series (minimal) and 450
    (default) to a real Prometheus running the shipped rules, its recorded series included; default adds
    at most 30 per GPU. Counts, not timings: the same on a loaded machine."""
    from bench.bench_profiles import BUDGETS, PER_GPU_BUDGET, Replica, count_series

    counts = count_series([Replica("vllm", p, g) for p in ("minimal", "default") for g in (1, 8)])
    for (engine_format, profile), budget in BUDGETS.items():
        one = counts[Replica(engine_format, profile, 1)]
        assert one.stored > 50 and one.recorded > 10, one  # measured, not empty
        assert one.total <= budget, (profile, one)
    eight, one = counts[Replica("vllm", "default", 8)], counts[Replica("vllm", "default", 1)]
    assert (eight.total - one.total) / 7 <= PER_GPU_BUDGET["default"], (one, eight)
    minimal = counts[Replica("vllm", "minimal", 1)]
    assert minimal.total < one.total / 2
