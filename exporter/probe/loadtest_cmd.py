"""`llm-exporter loadtest`: the command line around exporter/probe/loadtest.py (the sweep) and
exporter/probe/report.py (table, JSON, HTML): arguments, `--demo`'s twin and embedded exporter,
progress on stderr. docs/loadtest.md describes it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.probe.loadtest import (
    DEFAULT_MAX_IN_FLIGHT,
    MAX_DATASET_BYTES,
    MAX_DATASET_LINES,
    MAX_PROMPT_WORDS,
    MAX_STEP_DURATION_S,
    MAX_TOKENS_LIMIT,
    STOPPED_BETWEEN_STEPS,
    DatasetError,
    SweepConfig,
    Workload,
    is_loopback,
    load_dataset,
    make_sender,
    run_sweep,
    usable_cpus,
)
from exporter.probe.loadtest_knee import succeeded
from exporter.probe.loadtest_stats import StepStats
from exporter.probe.loadtest_watch import ExporterWatch
from exporter.slo import TBT, TTFT

DESCRIPTION = ("Sweep concurrency (closed loop) or request rate (open loop) against an OpenAI-compatible "
               "server; per step client-side TTFT, TPOT, ITL, throughput and goodput, and the exporter's KV "
               "watermark, preemptions, queue and verdict; then the knee and a max-concurrency recommendation.")
USAGE = """\
    llm-exporter loadtest URL [--exporter URL]      an OpenAI-compatible server (base URL)
    llm-exporter loadtest --demo                    the built-in twin and an embedded exporter
      [--concurrency 1,8,32 | --rate 1,5,10] [--warmup 5s] [--duration 30s]
      [--prompt-tokens 128 --max-tokens 128 | --dataset FILE.jsonl] [--api completions|chat] [--model M]
      [--json out.json] [--html out.html]

Exit status: 0 the sweep ran, 1 the server answered but no request succeeded, 2 bad arguments or
a server (URL or --exporter) that takes no connection: after 5 tries in a row, spaced out, the sweep
stops and says why ("cannot reach URL: connection refused"), or a sweep that stopped on an error;
130 Ctrl-C. A sweep that stops keeps the steps it finished (table, --json, --html) and says where
it stopped. docs/cli.md has every command's.
"""
EXIT_OK, EXIT_NOTHING, EXIT_CONFIG = 0, 1, 2
EXIT_UNREACHABLE = 2  # as a bad argument: the URL given names nothing that answers
EXIT_STOPPED = 2  # the sweep stopped early (a dead server, an error): the steps finished are written
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT; the steps finished are written too
DEMO_MODEL = "llama-3.1-8b"
DEMO_GPU = "NVIDIA H100 80GB HBM3"  # as `llm-exporter demo`


def add_parser(subparsers: Any) -> Any:
    import argparse

    from exporter.settings import add_flags

    parser = subparsers.add_parser(
        "loadtest", help="sweep concurrency or request rate against an OpenAI-compatible server, with the verdict",
        description=DESCRIPTION + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("url", nargs="?", help="base URL of the server (http://HOST:8000)")
    where.add_argument("--demo", action="store_true",
                       help="start the built-in twin and an embedded exporter on free loopback ports and test them")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions",
                        help="/v1/completions (default) or /v1/chat/completions")
    parser.add_argument("--model", help=f"model name to send (default: none; with --demo {DEMO_MODEL})")
    parser.add_argument("--prompt-tokens", dest="prompt_tokens", type=int, default=128,
                        help="prompt of N words, about N tokens (default 128)")
    parser.add_argument("--max-tokens", dest="max_tokens", type=int, default=128,
                        help="tokens to generate per request, exactly (ignore_eos) (default 128)")
    parser.add_argument("--dataset", metavar="FILE",
                        help="JSONL of {\"prompt\": ..., \"max_tokens\": N} instead of fixed lengths "
                             f"(at most {MAX_DATASET_BYTES >> 20} MiB, {MAX_DATASET_LINES} lines)")
    sweep = parser.add_mutually_exclusive_group()
    sweep.add_argument("--concurrency", metavar="N,N,...", help="closed loop: requests in flight per step "
                                                                "(default 1,8,32)")
    sweep.add_argument("--rate", metavar="R,R,...", help="open loop: Poisson arrivals, requests/s per step")
    parser.add_argument("--warmup", default="5s", help="per step, sent but not recorded (default 5s)")
    parser.add_argument("--duration", default="30s",
                        help=f"measured time per step (default 30s, at most {MAX_STEP_DURATION_S:g}s)")
    parser.add_argument("--request-timeout", dest="request_timeout", default="120s",
                        help="per request (default 120s)")
    parser.add_argument("--max-in-flight", dest="max_in_flight", type=int, default=DEFAULT_MAX_IN_FLIGHT,
                        help=f"with --rate: arrivals past this many in flight are dropped and counted "
                             f"(default {DEFAULT_MAX_IN_FLIGHT})")
    parser.add_argument("--exporter", metavar="URL", help="llm-exporter base URL to read the verdict and KV, "
                                                          "queue and preemption numbers from (with --demo: the "
                                                          "embedded one)")
    parser.add_argument("--target", help="the exporter's target name (default: the busiest)")
    parser.add_argument("--api-key-env", dest="api_key_env", metavar="VAR",
                        help="environment variable holding a bearer token for the server")
    parser.add_argument("--scenario", default="idle",
                        help="with --demo: the twin's own background load (default idle: only the test's)")
    parser.add_argument("--gpu", dest="gpu_name", default=DEMO_GPU,
                        help=f"with --demo: the simulated GPU (default {DEMO_GPU}; a smaller one such as "
                             "\"NVIDIA L4\" reaches its limits at lower concurrency)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_out", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--html", dest="html_out", metavar="FILE", help="write the report as one HTML page")
    add_flags(parser, ("slo_ttft_s", "slo_tbt_s"),
              helps={"slo_ttft_s": f"TTFT SLO for goodput and the knee (default {TTFT.threshold_seconds:g}s)",
                     "slo_tbt_s": f"time-between-tokens SLO (default {TBT.threshold_seconds:g}s)"},
              defaults={"slo_ttft_s": f"{TTFT.threshold_seconds:g}s", "slo_tbt_s": f"{TBT.threshold_seconds:g}s"})
    return parser


def _levels(text: str, name: str, integer: bool) -> tuple[float, ...]:
    from exporter.config import ConfigError

    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(name, text, "expected comma-separated numbers") from None
    # inf and nan are floats too: int(inf) raised OverflowError, int(nan) ValueError
    if not values or not all(math.isfinite(v) for v in values) or (integer and any(v != int(v) for v in values)):
        raise ConfigError(name, text, "expected comma-separated " + ("integers" if integer else "numbers"))
    return values


def check_output(path: str | None, flag: str) -> None:
    """An output file the sweep will write (--json, --html), checked before any load is sent: a
    sweep of hours must not end in a traceback because its folder does not exist. ConfigError
    names the flag and why."""
    from exporter.config import ConfigError

    if path is None:
        return
    if path == "" or "\0" in path:
        raise ConfigError(flag, path, "not a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(flag, path, "is a directory")
    if not os.path.isdir(folder):
        raise ConfigError(flag, path, f"no such directory: {folder}")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ConfigError(flag, path, "not writable")


def sweep_config(args: Any) -> tuple[SweepConfig, Workload, dict[str, Any]]:
    """The sweep, the workload and the report's config block from the arguments (ConfigError if bad)."""
    from exporter.config import ConfigError
    from exporter.settings import parse_duration

    if args.rate:
        mode, levels = "rate", _levels(args.rate, "rate", integer=False)
    else:
        mode, levels = "concurrency", _levels(args.concurrency or "1,8,32", "concurrency", integer=True)
    config = SweepConfig(mode=mode, levels=levels, warmup_s=0.0 if str(args.warmup).strip() in ("0", "0s") else
                         parse_duration(args.warmup, "warmup"), duration_s=parse_duration(args.duration, "duration"),
                         request_timeout_s=parse_duration(args.request_timeout, "request-timeout"),
                         max_in_flight=args.max_in_flight, ttft_slo_s=parse_duration(args.slo_ttft, "slo-ttft"),
                         tbt_slo_s=parse_duration(args.slo_tbt, "slo-tbt"), seed=args.seed)
    try:
        config.check()
    except ValueError as error:
        raise ConfigError(mode if "concurrency" in str(error) or "rate" in str(error) else "sweep",
                          ",".join(f"{v:g}" for v in levels), str(error)) from None
    if args.dataset:
        try:
            workload = Workload(dataset=load_dataset(args.dataset), seed=args.seed)
        except DatasetError as error:
            raise ConfigError("dataset", args.dataset, str(error)) from None
        described = f"dataset {args.dataset} ({len(workload.dataset or ())} requests)"
    else:
        if not 1 <= args.prompt_tokens <= MAX_PROMPT_WORDS:
            raise ConfigError("prompt-tokens", args.prompt_tokens, f"1..{MAX_PROMPT_WORDS}")
        if not 1 <= args.max_tokens <= MAX_TOKENS_LIMIT:
            raise ConfigError("max-tokens", args.max_tokens, f"1..{MAX_TOKENS_LIMIT}")
        workload = Workload(prompt_words=args.prompt_tokens, max_tokens=args.max_tokens, seed=args.seed)
        described = f"{args.prompt_tokens} prompt words, {args.max_tokens} tokens out"
    return config, workload, {"workload": described, "prompt_tokens": None if args.dataset else args.prompt_tokens,
                              "max_tokens": None if args.dataset else args.max_tokens, "dataset": args.dataset}


class DemoStack:
    """`--demo`: the twin and an embedded exporter, as `llm-exporter demo` runs them (app.run_demo),
    on free loopback ports, on an event loop in a thread of their own so the load generator's loop
    times its requests without waiting behind the twin's steps and the exporter's cycles."""

    def __init__(self, scenario: str, model: str, gpu_name: str = DEMO_GPU) -> None:
        self.scenario, self.model, self.gpu_name = scenario, model, gpu_name
        self.exporter_url = self.engine_url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="loadtest-demo", daemon=True)

    def start(self, timeout_s: float = 60.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the demo twin and exporter did not start within {timeout_s:g}s")
        if self._error is not None:
            raise RuntimeError(f"the demo did not start: {self._error}")

    def _main(self) -> None:
        from exporter.app import run_demo
        from exporter.config import load_config

        def ready(exporter: str, twins: Sequence[str]) -> None:
            self.exporter_url, self.engine_url = exporter, twins[0]
            self._ready.set()

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            config = load_config({"listen": "127.0.0.1:0", "interval": "1s", "log_level": "warning",
                                  "gpu_backend": "none", "host_backend": "sim"}, {})
            await run_demo(config, scenario=self.scenario, engines=1, gpus=1, engine_format="vllm",
                           gpu_name=self.gpu_name, model=self.model, stop=self._stop,
                           announce=lambda _text: None, on_ready=ready)
        try:
            asyncio.run(main())
        except BaseException as error:  # noqa: BLE001 - reported by start() or ignored after stop()
            self._error = error
        finally:
            self._ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=15)


class Unreachable(RuntimeError):
    """The server or the exporter takes no connection: the message says which and why."""


class ProgressLine:
    """Progress on stderr: a bar redrawn in place on a terminal, else one line per finished step."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last_step = -1
        self._open = False  # a bar drawn on a terminal line not yet ended

    def end_line(self) -> None:
        """End a bar left half drawn (a sweep that stopped), so what is printed next starts a line."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def __call__(self, index: int, steps: int, level: float, stats: StepStats | None, done: float) -> None:
        ok = stats.ok if stats else 0
        failed = sum(stats.failed.values()) if stats else 0
        what = f"step {index + 1}/{steps} ({level:g}): {ok} ok, {failed} failed"
        if self.tty:
            filled = int(done * 24)
            self.stream.write(f"\r[{'#' * filled}{'.' * (24 - filled)}] {what}   ")
            self._open = done < 1.0
            if done >= 1.0:
                self.stream.write("\n")
        elif done >= 1.0 and index != self._last_step:
            self._last_step = index
            self.stream.write(f"loadtest: {what}\n")
        self.stream.flush()


def command_loadtest(args: Any, env: Mapping[str, str], out: Any = None, err: Any = None) -> int:
    """`llm-exporter loadtest`: run the sweep, print the table, write --json / --html."""
    import sys

    from exporter.config import ConfigError
    from exporter.probe.report import render_table
    from exporter.redact import redact_url
    from exporter.targets import refuse_userinfo
    from exporter.termsafe import terminal_safe, terminal_safe_tree

    out, err = out or sys.stdout, err or sys.stderr
    try:
        config, workload, described = sweep_config(args)
        headers = {}
        if args.api_key_env:
            token = env.get(args.api_key_env, "")
            if not token:
                raise ConfigError("api-key-env", args.api_key_env, "is not set or empty")
            headers["Authorization"] = f"Bearer {token}"
        if args.exporter and args.demo:
            raise ConfigError("exporter", redact_url(args.exporter), "--demo reads its embedded exporter")
        for what, given in (("url", args.url), ("exporter", args.exporter)):
            if given:
                refuse_userinfo(given, what, "the server's key goes in --api-key-env")
        check_output(args.json_out, "json")
        check_output(args.html_out, "html")
    except ConfigError as error:
        print(f"llm-exporter loadtest: {terminal_safe(str(error))}", file=err)
        return EXIT_CONFIG
    demo = DemoStack(args.scenario, args.model or DEMO_MODEL, args.gpu_name) if args.demo else None
    try:
        if demo is not None:
            demo.start()
            url, exporter_url, model = demo.engine_url, demo.exporter_url, args.model or DEMO_MODEL
        else:
            url, exporter_url, model = args.url, args.exporter, args.model
        meta = {"url": redact_url(url), "api": args.api, "model": model, **described,
                "exporter": redact_url(exporter_url) if exporter_url else None, "demo": bool(args.demo),
                "gpu": args.gpu_name if args.demo else None, "seed": args.seed,
                "client": {"cpus": usable_cpus(), "loopback_target": is_loopback(url)}}
        progress = ProgressLine(err)
        try:
            report = asyncio.run(_sweep(url, exporter_url, model, args, headers, config, workload, meta, progress,
                                        check_exporter=not args.demo))
            # asyncio.run delivers a first Ctrl-C as a cancellation, which the sweep turns into a
            # report of its finished steps (stopped: interrupted); a second one is KeyboardInterrupt.
        finally:
            progress.end_line()
    except Unreachable as error:
        print(f"llm-exporter loadtest: {terminal_safe(str(error))}", file=err)
        return EXIT_UNREACHABLE
    except RuntimeError as error:
        print(f"llm-exporter loadtest: {terminal_safe(str(error))}", file=err)
        return EXIT_NOTHING
    except KeyboardInterrupt:
        return 130
    finally:
        if demo is not None:
            demo.stop()
    ok = succeeded(report)
    stopped = report.get("stopped")
    if ok or not stopped or (stopped["reason"] in STOPPED_BETWEEN_STEPS and report["steps"]):
        # A server never reached: the one line below says all there is.
        out.write(render_table(terminal_safe_tree(report)))  # verdicts, notes: an exporter's or engine's text
        out.flush()
    unwritten = _write_outputs(report, args.json_out, args.html_out)
    if unwritten is not None:
        print(f"llm-exporter loadtest: {terminal_safe(unwritten)}", file=err)
        return EXIT_CONFIG
    if stopped:
        print(f"llm-exporter loadtest: {terminal_safe(stopped['text'])}", file=err)
        return EXIT_INTERRUPTED if stopped["reason"] == "interrupted" else EXIT_STOPPED
    if not ok:
        print(f"llm-exporter loadtest: no request succeeded: {_no_success(report)}", file=err)
        return EXIT_NOTHING
    return EXIT_OK


def _write_outputs(report: Mapping[str, Any], json_out: str | None, html_out: str | None) -> str | None:
    """Write --json and --html; None when done, else why not in one line (the other is still
    written: a sweep's measurements are not lost to one file that could not be)."""
    from exporter.probe.report import render_html

    problems = []
    for path, render in ((json_out, lambda: json.dumps(report, indent=2, allow_nan=False) + "\n"),
                         (html_out, lambda: render_html(report))):
        if not path:
            continue
        try:
            text = render()
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        except (OSError, ValueError) as error:
            problems.append(f"cannot write {path}: {getattr(error, 'strerror', None) or error}")
    return "; ".join(problems) or None


def _no_success(report: Mapping[str, Any]) -> str:
    """The error line's reason for a sweep where no request succeeded: the failures by reason and
    what the last one met (an HTTP status as its code and phrase, never the body sent with it)."""
    from exporter.reach import http_status_words

    counts: dict[str, int] = {}
    for step in report["steps"]:
        for reason, count in (step["requests"].get("failed_by_reason") or {}).items():
            counts[reason] = counts.get(reason, 0) + count
    if not counts:
        return "no request finished in a measured window"
    text = f"{sum(counts.values())} failed: " + ", ".join(
        f"{reason} {count}" for reason, count in sorted(counts.items(), key=lambda kv: -kv[1]))
    last = report.get("last_failure") or {}
    if last.get("status"):
        text += f"; the last answered {http_status_words(last['status'])}"
    return text


async def _sweep(url: str, exporter_url: str | None, model: str | None, args: Any, headers: Mapping[str, str],
                 config: SweepConfig, workload: Workload, meta: Mapping[str, Any], progress: ProgressLine, *,
                 check_exporter: bool = True) -> dict[str, Any]:
    send, close = make_sender(url, api=args.api, model=model, timeout_s=config.request_timeout_s, headers=headers)
    watch = ExporterWatch(exporter_url, args.target) if exporter_url else None
    try:
        if watch is not None and check_exporter:
            await _check_exporter(watch)
        return await run_sweep(send, workload, config, watch=watch, progress=progress, meta=meta,
                               keep_on_interrupt=True)
    finally:
        close()
        if watch is not None:
            await watch.aclose()


async def _check_exporter(watch: ExporterWatch) -> None:
    """One reading of --exporter before the sweep: an exporter that cannot be read now would leave
    every step without the server's side; Unreachable says why, before any load is sent."""
    from exporter.reach import why_unreachable
    from exporter.redact import redact_url

    try:
        await watch.poll(0.0)
    except RuntimeError as error:
        why = await asyncio.to_thread(why_unreachable, watch.base_url)
        shown = redact_url(watch.base_url)
        raise Unreachable(f"cannot reach the exporter {shown}: {why}" if why else
                          f"the exporter {shown} cannot be read: {str(error).removeprefix('exporter: ')}"
                          + (" (is it an llm-exporter?)" if "HTTP 404" in str(error) else "")) from None
