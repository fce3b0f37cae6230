"""Configuration precedence and validation: a bad value exits 2 with one line naming it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from exporter.config import Config, ConfigError, build_config, env_warnings, load_config, parse_duration
from exporter.redact import redact_url


def test_defaults():
    config = load_config({}, {})
    assert (config.listen_host, config.listen_port, config.interval_s) == ("0.0.0.0", 9480, 1.0)
    assert config.gpu_backend == "auto" and config.engines == ()


def test_precedence_flag_over_env_over_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("listen: 127.0.0.1:9001\ninterval: 5s\ngpu_backend: none\n"
                    "engines:\n  - url: http://10.0.0.1:8000\n    kind: vllm\n    name: a\n")
    config = load_config({"config": str(path), "listen": "127.0.0.1:9003"},
                         {"LLM_EXPORTER_LISTEN": "127.0.0.1:9002", "LLM_EXPORTER_INTERVAL": "2s"})
    assert config.listen_port == 9003  # flag
    assert config.interval_s == 2.0  # env over file
    assert config.gpu_backend == "none"  # file
    assert config.engines[0].url == "http://10.0.0.1:8000/metrics"
    assert (config.engines[0].kind, config.engines[0].name) == ("vllm", "a")


def test_engine_flag_syntax_and_env_list():
    config = load_config({"engines": ["http://h:8000/metrics,kind=sglang,name=s1,timeout=300ms"]}, {})
    target = config.engines[0]
    assert (target.kind, target.name, target.timeout_s) == ("sglang", "s1", 0.3)
    env_config = load_config({}, {"LLM_EXPORTER_ENGINES": "http://a:1 http://b:2/prom,kind=tgi"})
    assert [t.name for t in env_config.engines] == ["a:1", "b:2"]
    assert env_config.engines[1].url == "http://b:2/prom"


@pytest.mark.parametrize("flags, field", [
    ({"engines": ["ftp://x/metrics"]}, "engine"),
    ({"engines": ["http://x:8000,kind=ollama"]}, "engine.kind"),
    ({"engines": ["http://x:8000,colour=red"]}, "engine"),
    ({"engines": ["http://a:1,name=x", "http://b:1,name=x"]}, "engine.name"),
    ({"interval": "fast"}, "interval"),
    ({"interval": "0s"}, "interval"),
    ({"listen": "nowhere"}, "listen"),
    ({"listen": "0.0.0.0:99999"}, "listen"),
    ({"gpu_backend": "cuda"}, "gpu_backend"),
    ({"max_payload_bytes": "12"}, "max_payload_bytes"),
    ({"log_level": "loud"}, "log_level"),
    ({"interval": "10ms"}, "interval"),  # below MIN_INTERVAL_S: the collector would spin
    ({"engines": ["http://[::1/metrics"]}, "engine"),  # urllib's own ValueError, as a config error
    ({"engines": ["http://u:pw@host:abc/metrics"]}, "engine"),
    ({"host": "maybe"}, "host"),
    ({"histogram_buckets": "fine"}, "histogram_buckets"),
    ({"histogram_buckets_max": "1"}, "histogram_buckets_max"),
    ({"histogram_buckets_max": "65"}, "histogram_buckets_max"),
])
def test_bad_values_name_the_field(flags, field):
    with pytest.raises(ConfigError) as caught:
        load_config(flags, {})
    assert caught.value.field == field


def test_probe_flag_syntax_env_list_yaml_and_default_target(tmp_path):
    config = load_config({"engines": ["http://127.0.0.1:8000/metrics,name=vllm"],
                          "probes": ["http://127.0.0.1:8000/v1/,every=2s,max_tokens=4,prompt_tokens=8,api=chat,"
                                     "timeout=3s,model=m"]}, {})
    probe = config.probes[0]
    assert (probe.url, probe.target, probe.every_s, probe.max_tokens, probe.prompt_tokens, probe.api,
            probe.timeout_s, probe.model) == ("http://127.0.0.1:8000", "vllm", 2.0, 4, 8, "chat", 3.0, "m")
    assert probe.engine is config.engines[0] and probe.same_origin
    env_config = load_config({}, {"LLM_EXPORTER_PROBES": "http://a:1 http://b:2,target=bee"})
    assert [(p.target, p.engine, p.every_s) for p in env_config.probes] == [("a:1", None, 15.0), ("bee", None, 15.0)]
    path = tmp_path / "c.yaml"
    path.write_text("engines: [http://e:9/metrics]\nprobes:\n  - {url: 'http://gw:80', target: 'e:9'}\n")
    yaml_probe = load_config({"config": str(path)}, {}).probes[0]
    assert (yaml_probe.target, yaml_probe.engine.name, yaml_probe.same_origin) == ("e:9", "e:9", False)


@pytest.mark.parametrize("probes, field", [
    (["ftp://x:1"], "probe"),
    (["http://x:1,every=fast"], "probe.every"),
    (["http://x:1,every=200ms"], "probe.every"),  # under a second: a probe is a real request
    (["http://x:1,max_tokens=0"], "probe.max_tokens"),
    (["http://x:1,prompt_tokens=many"], "probe.prompt_tokens"),
    (["http://x:1,api=embeddings"], "probe.api"),
    (["http://x:1,timeout=2h"], "probe.timeout"),
    (["http://x:1,target=no such"], "probe.target"),
    (["http://x:1,target=nope"], "probe.target"),  # names no engine target when there are some
    (["http://x:1,colour=red"], "probe"),
    (["http://x:1,bearer_token_file=/t"], "probe"),  # the engine target's credentials, never its own
    (["http://u:pw@x:1"], "probe"),
    (["http://x:1/?a=b"], "probe"),
    (["http://x:1", "http://x:1,every=5s"], "probe.target"),  # one probe per target
])
def test_bad_probe_values_name_the_key(probes, field):
    with pytest.raises(ConfigError) as caught:
        load_config({"engines": ["http://e:1/metrics,name=e"], "probes": probes}, {})
    assert caught.value.field == field
    assert "pw" not in str(caught.value)


def test_bad_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("listen: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        load_config({"config": str(path)}, {})
    assert caught.value.field == "config"


def test_parse_duration_units():
    assert parse_duration("500ms", "x") == 0.5
    assert parse_duration("1m", "x") == 60.0
    assert parse_duration("1h", "x") == 3600.0  # the documented upper bound is itself accepted
    assert parse_duration(2, "x") == 2.0


def test_redact_url_drops_credentials():
    assert redact_url("http://user:secret@h:8000/metrics") == "http://h:8000/metrics"
    assert redact_url("http://h/metrics") == "http://h/metrics"
    assert redact_url("http://user:secret@[::1]:8000/metrics") == "http://[::1]:8000/metrics"
    assert redact_url("http://user:pa'ss@h/metrics") == "http://h/metrics"
    # URLs urllib cannot split still lose their userinfo, and redact_url never raises
    assert redact_url("http://u:hunter2@host:abc/metrics") == "http://host:abc/metrics"
    assert redact_url("http://u:hunter2@[::1/metrics") == "http://[::1/metrics"


def test_no_repr_or_str_of_a_config_shows_a_url_password():
    config = load_config({}, {"LLM_EXPORTER_ENGINES": "http://scraper:hunter2@vllm:8000/metrics"})
    for text in (repr(config), str(config), repr(config.engines[0])):
        assert "hunter2" not in text and "url='http://vllm:8000/metrics'" in text, text
    assert config.engines[0].url == "http://scraper:hunter2@vllm:8000/metrics"  # still used to scrape


def test_host_false_in_yaml_disables_the_host_source(tmp_path):
    path = tmp_path / "c.yaml"
    cases = (("host: false\n", False), ("host: off\n", False), ("host: {enabled: true}\n", True))
    for text, enabled in cases:
        path.write_text(text)
        assert load_config({"config": str(path)}, {}).host_enabled is enabled, text


def test_ipv6_listen_keeps_its_brackets():
    config = load_config({"listen": "[::]:9480"}, {})
    assert config.listen == "[::]:9480" and config.listen_host == "::"


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, needle", [
    (["run", "--engine", "http://x:8000,kind=nope"], "engine.kind='nope'"),
    (["run", "--interval", "-1"], "interval='-1'"),
    (["run", "--engine", "not a url"], "invalid engine="),
    (["run", "--engine", "http://[::1/metrics"], "invalid engine="),
    (["run", "--engine", "http://SEKRIT-TOKEN@host:8000/metrics"], "user[:password]@ in the URL"),
])
def test_cli_exits_2_with_one_line(args, needle):
    result = _run_cli(*args, "--gpu-backend", "none", "--no-host")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "SEKRIT" not in result.stderr


def test_cli_port_in_use_exits_2():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        result = _run_cli("run", "--listen", f"127.0.0.1:{port}", "--gpu-backend", "none", "--no-host")
    assert result.returncode == 2
    assert f"invalid listen='127.0.0.1:{port}'" in result.stderr


def _laughs(levels: int) -> str:
    lines = ['x0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\ninterval: *a{levels - 1}\n"


# Each is refused by the bounded YAML loader (exporter/yamlsafe.py); the bombs are sized so that
# the code before it could expand them without taking the test process down.
@pytest.mark.parametrize("text, needle", [
    (_laughs(6), "nodes once aliases are expanded"),  # 9**6 strings from 500 bytes
    ("x0: &a0 " + "x" * 16000 + "\n" + "".join(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
                                             for i in range(1, 4)) + "interval: *a3\n",
     "characters of values once aliases are expanded"),  # 729 copies of a 16 KB value
    ("a: &a [1]\n" + "".join(f"k{i}: *a\n" for i in range(101)), "more than 100 aliases"),
    ("a: &a [*a]\ninterval: *a\n", "refers to a node that contains it"),
    ("interval: " + "[" * 2000 + "]" * 2000 + "\n", "nest"),
    ("interval: " + "9" * 5000 + "\n", "digits"),
    ("interval: " + ":".join(["59"] * 10000) + "\n", "longer than 16384 characters"),  # base-60: quadratic
    ("interval: *" + "z" * 100_000 + "\n", "undefined alias"),
    ("x: " + "a" * (1 << 20) + "\n", "larger than 1048576 bytes"),
    (b"interval: \xff\xfe\n", "not UTF-8"),
], ids=["billion-laughs", "repeated-long-value", "many-aliases", "recursive-alias", "deep-nesting",
        "huge-int", "base-60-int", "long-alias-name", "over-1-MiB", "not-utf8"])
def test_hostile_yaml_config_is_refused_in_one_short_line(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config({"config": str(path)}, {})
    message = str(caught.value)
    assert caught.value.field == "config" and needle in message, message[:500]
    assert "\n" not in message and len(message) < 600, message[:500]


def _from_yaml(tmp_path, text: str, env: dict[str, str] | None = None) -> Config:
    """load_config from a YAML file holding `text` (and `env`), no flags."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config({"config": str(path)}, env or {})


def test_yaml_anchors_and_merge_keys_still_work(tmp_path):
    # x-... keys are no setting (refused otherwise, as unknown keys): a place for anchors.
    config = _from_yaml(tmp_path, "x-defaults: &d {kind: vllm, timeout: 300ms}\n"
                        "engines:\n  - {<<: *d, url: 'http://10.0.0.1:8000', name: a}\n"
                        "  - {<<: *d, url: 'http://10.0.0.2:8000', name: b}\n")
    assert [(t.name, t.kind, t.timeout_s) for t in config.engines] == [("a", "vllm", 0.3), ("b", "vllm", 0.3)]


def test_a_huge_bad_value_is_quoted_only_in_part(tmp_path):
    with pytest.raises(ConfigError) as caught:
        _from_yaml(tmp_path, "interval: [" + ", ".join(["'fast'"] * 20_000) + "]\n")
    message = str(caught.value)
    assert caught.value.field == "interval" and len(message) < 1200, message[:300]
    assert "more characters" in message, message[:300]


# ------------------------------------------------------------------------------------------------
# Unknown keys, typed derive settings, the settings table
# ------------------------------------------------------------------------------------------------
def test_unknown_yaml_key_exits_2_naming_the_closest_known_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("intervall: 5s\n")
    result = _run_cli("run", "--config", str(path), "--gpu-backend", "none", "--no-host",
                      "--listen", "127.0.0.1:0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["llm-exporter: unknown key 'intervall' (did you mean 'interval'?)"], result.stderr


@pytest.mark.parametrize("settings, field, needle", [
    ({"intervall": "5s"}, "intervall", "did you mean 'interval'?"),
    ({"slo_ttfb": "1s"}, "slo_ttfb", "did you mean 'slo_ttft'?"),
    ({"host": {"proc_rot": "/p"}}, "host.proc_rot", "in host (did you mean 'proc_root'?)"),
    ({"extra": {"kv_cache_dtype": "fp8"}}, "extra", "top-level keys"),
    ({"engines": [{"url": "http://h:1", "timout": "1s"}]}, "engine", "did you mean 'timeout'?"),
    ({"engines": [{"urll": "http://h:1"}]}, "engine", "did you mean 'url'?"),
    ({"engines": ["http://h:1,nmae=a"]}, "engine", "did you mean 'name'?"),
    ({"engines": [{"url": "http://h:1", "tls_config": {"ca_fille": "x"}}]}, "engine.tls_config",
     "did you mean 'ca_file'?"),
    ({"gpu_spec": {"tdp_wats": 700}}, "gpu_spec.tdp_wats", "did you mean 'tdp_watts'?"),
])
def test_unknown_keys_are_refused_with_the_closest_known_one(settings, field, needle):
    with pytest.raises(ConfigError) as caught:
        build_config(settings, {})
    assert caught.value.field == field and needle in str(caught.value), str(caught.value)


def test_derive_settings_are_typed_validated_fields(tmp_path):
    config = _from_yaml(tmp_path, "kv_cache_dtype: fp8\nverdict_hold_cycles: 5\nrate_window_s: 30\n"
                        "gpu_spec: {mem_bandwidth_bytes_per_s: 3.35e12, pcie_gen: 5}\n"
                        "target_gpus: {a: [0, 1], b: [2, 3]}\n")
    assert (config.kv_cache_dtype, config.verdict_hold_cycles, config.rate_window_s) == ("fp8", 5, 30.0)
    assert dict(config.gpu_spec) == {"mem_bandwidth_bytes_per_s": 3.35e12, "pcie_gen": 5}
    assert dict(config.target_gpus) == {"a": (0, 1), "b": (2, 3)}
    assert not hasattr(Config(), "extra")  # no untyped side channel: every key is a field
    env = load_config({}, {"LLM_EXPORTER_TARGET_GPUS": '{"a": [3]}', "LLM_EXPORTER_RATE_WINDOW": "1m"})
    assert dict(env.target_gpus) == {"a": (3,)} and env.rate_window_s == 60.0


@pytest.mark.parametrize("settings, field", [
    ({"kv_cache_dtype": "fp7"}, "kv_cache_dtype"),
    ({"verdict_hold_cycles": 0}, "verdict_hold_cycles"),
    ({"verdict_hold_cycles": True}, "verdict_hold_cycles"),
    ({"rate_window_s": "forever"}, "rate_window"),
    ({"gpu_spec": "fast"}, "gpu_spec"),
    ({"gpu_spec": {"tdp_watts": "hot"}}, "gpu_spec.tdp_watts"),
    ({"target_gpus": ["a"]}, "target_gpus"),
    ({"target_gpus": {"a": [-1]}}, "target_gpus.a"),
    ({"target_gpus": {"a b": [0]}}, "target_gpus.target"),
    ({"target_gpus": {"a": list(range(5000))}}, "target_gpus.a"),
    ({"max_payload_bytes": "8 parsecs"}, "max_payload_bytes"),
    ({"engine_network_devices": {"eth0": 1}}, "engine_network_devices"),
    ({"engine_network_devices": ["eth0", ""]}, "engine_network_devices"),
    ({"engine_network_devices": ["eth 0"]}, "engine_network_devices"),
    ({"engine_network_devices": ["x" * 65]}, "engine_network_devices"),
    ({"network_exclude": [f"eth{i}" for i in range(65)]}, "network_exclude"),
    ({"network_exclude": [1]}, "network_exclude"),
    ({"gpus": ","}, "gpus"),
    ({"gpus": "GPU-1,../etc"}, "gpus"),
    ({"gpus": [True]}, "gpus"),
    ({"gpus": "GPU-" + "a" * 81}, "gpus"),
    ({"gpus": [str(i) for i in range(1025)]}, "gpus"),
    ({"gpus": "0,1", "target_gpus": {"a": [1, 2]}}, "target_gpus.a"),
    ({"kubernetes_gpu_mapping": "maybe"}, "kubernetes_gpu_mapping"),
    ({"engine_containers": ["a b"]}, "engine_containers"),
])
def test_bad_derive_and_size_settings_name_the_field(settings, field):
    with pytest.raises(ConfigError) as caught:
        build_config(settings, {})
    assert caught.value.field == field, str(caught.value)


def test_network_devices_take_lists_or_comma_separated_globs():
    from exporter.sources.host_common import DEFAULT_NETWORK_EXCLUDE

    config = load_config({}, {"LLM_EXPORTER_ENGINE_NETWORK_DEVICES": "eth0, mlx5_*"})
    assert config.engine_network_devices == ("eth0", "mlx5_*")
    assert config.network_exclude is None  # the host source's DEFAULT_NETWORK_EXCLUDE
    assert DEFAULT_NETWORK_EXCLUDE[0] == "lo"
    assert build_config({"network_exclude": []}, {}).network_exclude == ()  # read everything but loopback


def test_byte_sizes_take_units():
    assert load_config({"max_payload_bytes": "16MiB"}, {}).max_payload_bytes == 16 << 20
    assert load_config({"max_payload_bytes": 4096}, {}).max_payload_bytes == 4096


def test_an_alias_in_the_file_does_not_beat_the_key_in_the_environment(tmp_path):
    assert _from_yaml(tmp_path, "interval_s: 5\n", {"LLM_EXPORTER_INTERVAL": "2s"}).interval_s == 2.0


def test_an_unknown_variable_is_named_with_the_closest_one_but_not_fatal():
    env = {"LLM_EXPORTER_INTERVALL": "5s", "LLM_EXPORTER_LISTEN": "127.0.0.1:1"}
    assert load_config({}, env).interval_s == 1.0
    assert env_warnings(env) == ["ignoring LLM_EXPORTER_INTERVALL: no such setting "
                                 "(did you mean 'LLM_EXPORTER_INTERVAL'?)"]


def test_the_settings_table_drives_the_config_and_the_run_flags():
    import dataclasses

    from exporter.cli import build_parser
    from exporter.settings import SETTINGS

    names = {f.name for f in dataclasses.fields(Config)}
    for setting in SETTINGS:
        assert not setting.field or setting.name in names or setting.name == "listen", setting.name
    run_parser = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]
    flags = {max(a.option_strings, key=len): a.dest for a in run_parser._actions if a.option_strings}
    for setting in SETTINGS:
        if setting.flag:
            assert flags.get(setting.flag) == setting.dest, setting.flag
    defaults = load_config({}, {})
    for setting in SETTINGS:
        if setting.field and setting.name not in ("listen", "engine_timeout_s"):
            assert getattr(defaults, setting.name) == setting.default, setting.name


def test_engine_role_option():
    config = load_config({"engines": ["http://e:1/metrics,name=d,role=decode", "http://e:2/metrics,name=x"]}, {})
    assert [t.role for t in config.engines] == ["decode", None]  # None: the page's, else both
    config = load_config({"engines": [{"url": "http://e:1/metrics", "role": "prefill"}]}, {})
    assert config.engines[0].role == "prefill"
    with pytest.raises(ConfigError) as caught:
        load_config({"engines": ["http://e:1/metrics,role=consumer"]}, {})
    assert caught.value.field == "engine.role"
    assert "prefill, decode, both" in str(caught.value)
    with pytest.raises(ConfigError) as caught:  # a probe has no role: an unknown option, not a credential
        load_config({"engines": ["http://e:1/metrics,name=e"], "probes": ["http://e:1,role=decode"]}, {})
    assert caught.value.field == "probe" and "unknown option" in str(caught.value)


def test_engine_model_option_bounded_and_printable():
    config = load_config({"engines": ["http://e:1/metrics,name=l,model=unsloth/Llama-3.2-1B-GGUF:Q4_K_M",
                                      {"url": "http://e:2/metrics", "model": "Qwen/Qwen2.5-7B-Instruct"},
                                      "http://e:3/metrics,name=x"]}, {})
    assert [t.model for t in config.engines] == ["unsloth/Llama-3.2-1B-GGUF:Q4_K_M", "Qwen/Qwen2.5-7B-Instruct", None]
    # It becomes a label value and is printed by doctor: no escapes, quotes, C1 controls or endless names.
    for hostile in ("a\x1b[31mHEALTHY", 'a"b', "a\\b", "a\x9bb", "m" * 257):
        with pytest.raises(ConfigError) as caught:
            load_config({"engines": [{"url": "http://e:1/metrics", "model": hostile}]}, {})
        assert caught.value.field == "engine.model"
        assert "\x1b" not in str(caught.value) and len(str(caught.value)) < 400
    # A probe's own model= (the request's model field) is not taken for the target option.
    config = load_config({"engines": ["http://e:1/metrics,name=e"], "probes": ["http://e:1,target=e,model=m"]}, {})
    assert config.probes[0].model == "m"


def test_gpu_attribution_settings_from_flags_env_and_yaml():
    config = load_config({"gpus": "GPU-8f0c,MIG-2b1e,3"}, {"LLM_EXPORTER_POD_NAME": "vllm-0",
                                                         "LLM_EXPORTER_POD_NAMESPACE": "serving",
                                                         "LLM_EXPORTER_ENGINE_CONTAINERS": "vllm,prefill-*"})
    assert config.gpus == ("GPU-8f0c", "MIG-2b1e", "3")
    assert (config.pod_name, config.pod_namespace) == ("vllm-0", "serving")
    assert config.engine_containers == ("vllm", "prefill-*") and config.exporter_container == "llm-exporter"
    assert config.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert config.kubernetes_gpu_mapping is False and config.gpu_dra_claim is None
    assert build_config({"gpus": [0, 1], "target_gpus": {"a": [1]}, "kubernetes_gpu_mapping": True}, {}).gpus == (
        "0", "1")
