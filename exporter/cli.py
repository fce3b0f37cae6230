"""Command line: `llm-exporter run | demo | doctor | loadtest | plan | mixin`. main() calls run(argv, env), as tests
do."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from exporter import __version__
from exporter.cliargs import Parser
from exporter.config import Config, ConfigError, env_warnings, load_config
from exporter.redact import RedactUrlCredentials
from exporter.safefile import STARTUP_TIMEOUT_S, Detached, FileReadError
from exporter.settings import add_flags
from exporter.yamlsafe import shorten

EXIT_CONFIG = 2
DEMO_GPU_PRICE_PER_HOUR = "4.00"
"""`demo`'s GPU-hour price, so its cost panels have data: an example, a round figure of the order of
public-cloud on-demand prices for one H100. `run` has no default (no cost series until it is set)."""
DEMO_PROBE_EVERY_S = 5.0
"""`demo`'s client-side probe period: shorter than `run`'s 15 s default, so the Client probe panels
fill within a minute of starting the demo."""


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    add_flags(parser)


DESCRIPTION = ("A Prometheus sidecar for LLM inference servers: scrapes the engine's /metrics, the GPUs and the "
               "host, normalizes them, serves /metrics, and says where the bottleneck is. `llm-exporter COMMAND "
               "--help` for each command; docs/ in the repository for the rest.")
"""What `llm-exporter --help` says first (the module docstring is for developers)."""


def _add_demo_flags(parser: argparse.ArgumentParser) -> None:
    from exporter.simulator.scenarios import SCENARIOS

    parser.add_argument("--scenario", default="decode-heavy", choices=sorted(SCENARIOS),
                        help="load pattern (switchable at run time on each twin)")
    parser.add_argument("--engines", type=int, default=1,
                        help="number of engine twins (prefill/decode pairs in a PD scenario: pd-transfer)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per engine (tensor parallel)")
    parser.add_argument("--engine-format", dest="engine_format", default="vllm",
                        choices=("vllm", "sglang", "tgi", "llamacpp"), help="exposition the twins serve")
    parser.add_argument("--gpu", dest="gpu_name", default="NVIDIA H100 80GB HBM3", help="simulated GPU")
    parser.add_argument("--model", default="llama-3.1-8b", help="simulated model (built-in shape name)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed", type=float, default=1.0,
                        help="simulated seconds per real second (e.g. 8 fills a KV cache 8x sooner); token "
                             "rates and the bandwidth modelled from them then read SPEED times too high")
    parser.add_argument("--numa-mismatch", dest="numa_mismatch", action="store_true",
                        help="pin each twin's engine to CPUs of a NUMA node that holds none of its GPUs")
    parser.add_argument("--no-probe", dest="probe", action="store_false",
                        help=f"no client-side probe (default: one every {DEMO_PROBE_EVERY_S:g}s to each twin's "
                             "OpenAI API; the verdict leaves the probe's own work out, so idle stays idle)")
    add_flags(parser, ("gpu_price_per_hour", "listen", "interval_s", "log_level", "host_backend",
                       "gpu_retry_interval_s", "profile", "families_file", "histogram_buckets",
                       "histogram_buckets_max"),
              helps={"gpu_price_per_hour": "price of one GPU-hour, for the cost-per-token panels (default "
                                           f"{DEMO_GPU_PRICE_PER_HOUR}, an example figure of the order of "
                                           "public-cloud on-demand H100 prices)",
                     "host_backend": "sim: the twins' simulated host (default); procfs: this machine's",
                     "listen": "exporter HOST:PORT (default 127.0.0.1:9480)",
                     "interval_s": "collection interval (default 1s)",
                     "log_level": "debug, info, warning or error (default warning)",
                     "profile": "which families /metrics writes: minimal, default or full (default full: the demo "
                                "fills every panel; `run` defaults to default)"},
              defaults={"listen": "127.0.0.1:9480", "interval_s": "1s", "log_level": "warning", "profile": "full",
                        "host_backend": "sim", "gpu_price_per_hour": DEMO_GPU_PRICE_PER_HOUR,
                        "gpu_retry_interval_s": "10s"})


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="llm-exporter", description=DESCRIPTION)  # every subcommand's parser is a Parser too
    parser.add_argument("--version", action="version", version=f"llm-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="scrape engines, GPUs and the host; serve /metrics")
    _add_run_flags(run_parser)
    demo_parser = commands.add_parser(
        "demo", help="run the digital twin and the exporter scraping it (no GPU needed)")
    _add_demo_flags(demo_parser)
    from exporter import doctor

    doctor.add_parser(commands)
    from exporter.probe import loadtest_cmd

    loadtest_cmd.add_parser(commands)
    from exporter.planner import cmd as plan_cmd

    plan_cmd.add_parser(commands)
    from exporter.mixin import cmd as mixin_cmd

    mixin_cmd.add_parser(commands)
    return parser


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)r",
        stream=sys.stderr,
        force=True,
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactUrlCredentials())


def command_run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from exporter.app import bind_listener, build_sources, load_web_config, serve, tune_gc, written_families

    flags = {k: v for k, v in vars(args).items() if k != "command"}
    try:
        config = _load_config_detached(flags, env)
        setup_logging(config.log_level)
        for warning in env_warnings(env):
            logging.getLogger("exporter.config").warning("%s", warning)
        web = load_web_config(config)
        families = written_families(config)  # a families file that cannot be used fails the start (exit 2)
        sources = build_sources(config)
        sock = bind_listener(config)
    except ConfigError as error:
        print(f"llm-exporter: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except (ValueError, TypeError, OSError) as error:
        # A value the checks let through that the start still cannot take: it came from the
        # flags, variables or files, so it is theirs to fix, said in one line (exit 2), never a traceback.
        print(f"llm-exporter: cannot start with this configuration: {shorten(f'{type(error).__name__}: {error}')}",
              file=sys.stderr)
        return EXIT_CONFIG
    tune_gc()
    asyncio.run(serve(config, sources, sock, web=web, own_process=True, families=families))
    return 0


def _load_config_detached(flags: Mapping[str, object], env: Mapping[str, str]) -> Config:
    """load_config with a deadline: it reads the config file and the secret and CA files it names,
    regular files only (exporter/safefile.py), and one on a hung mount must end in an error
    (exit 2), not a process that hangs without ever listening."""
    try:
        return Detached[Config]("configuration files", STARTUP_TIMEOUT_S).call(lambda: load_config(flags, env))
    except FileReadError as error:
        path = flags.get("config") or env.get("LLM_EXPORTER_CONFIG") or ""
        raise ConfigError("config", path, str(error)) from None


def command_demo(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from exporter.app import run_demo

    if not 1 <= args.engines <= 16 or not 1 <= args.gpus <= 8:
        print("llm-exporter: invalid engines/gpus: engines 1..16, gpus 1..8", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if not 0.1 <= args.speed <= 100:
            raise ConfigError("speed", args.speed, "must be between 0.1 and 100")
        config = load_config({"listen": args.listen, "interval": args.interval, "log_level": args.log_level,
                              "gpu_backend": "none", "gpu_price_per_hour": args.gpu_price_per_hour,
                              "host_backend": args.host_backend, "gpu_retry_interval": args.gpu_retry_interval,
                              "profile": args.profile, "families_file": args.families_file,
                              "histogram_buckets": args.histogram_buckets,
                              "histogram_buckets_max": args.histogram_buckets_max}, {})
        setup_logging(config.log_level)
        from exporter.app import written_families

        families = written_families(config)  # a families file that cannot be used fails the start (exit 2)
        asyncio.run(run_demo(config, scenario=args.scenario, engines=args.engines, gpus=args.gpus,
                             engine_format=args.engine_format, gpu_name=args.gpu_name, model=args.model,
                             seed=args.seed, speed=args.speed, numa_mismatch=args.numa_mismatch,
                             probe_every_s=DEMO_PROBE_EVERY_S if args.probe else None, families=families))
    except ConfigError as error:
        print(f"llm-exporter: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as error:  # the twin refused its GPU, model or scenario, before anything started
        print(f"llm-exporter demo: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        pass
    return 0


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.command == "run":
        return command_run(args, env)
    if args.command == "demo":
        return command_demo(args, env)
    if args.command == "doctor":
        from exporter.doctor import command_doctor

        return command_doctor(args, env)
    if args.command == "loadtest":
        from exporter.probe.loadtest_cmd import command_loadtest

        return command_loadtest(args, env)
    if args.command == "plan":
        from exporter.planner.cmd import command_plan

        return command_plan(args, env)
    if args.command == "mixin":
        from exporter.mixin.cmd import command_mixin

        return command_mixin(args, env)
    raise AssertionError(f"unhandled command {args.command}")


def main() -> None:
    sys.exit(run(sys.argv[1:], os.environ))


if __name__ == "__main__":
    main()
