"""`llm-exporter doctor`: where is the bottleneck, as a terminal report.

    llm-exporter doctor --url http://HOST:9480           ask a running exporter (/api/v1/diagnosis)
        [--ca-file CA.pem] [--username U --password-file F]  one served with --web.config.file
    llm-exporter doctor --engine http://HOST:8000/metrics --duration 10s [--model llama-3.1-8b]
                                                          sample an engine directly for a short window
    add --json for machines.

Exit status: 4 unhealthy (a GPU has a fault that takes it out of service: an uncorrected ECC
error, an XID that needs a reset, a pending or failed row remap, a recovery action, a lost GPU;
the bottleneck still shows below it), 0 healthy (every target at its own roof, idle or with
headroom, each SLO met or with
no recent traffic to judge it on), 1 degraded (a constraint such as KV capacity, host CPU,
interconnect or throttling limits a target, an SLO is missed, or a target stopped answering), 3
cannot tell (no answer: the --url exporter, or every --engine target, cannot be reached or never
answered, "cannot tell: cannot reach URL: connection refused" whichever flag named it; no targets;
not enough data yet). 2 stays the usual status for bad arguments. docs/cli.md has every command's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import ssl
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from exporter import __version__, jsonsafe
from exporter.config import ConfigError, load_config, parse_duration
from exporter.derive.bottleneck import UNKNOWN_VERDICT_WORDS, VERDICT_WORDS
from exporter.httpclient import HttpClient
from exporter.jsonsafe import JsonTooDeep
from exporter.reach import exporter_base_url, failure_words, http_status_words, why_unreachable
from exporter.redact import CredentialError, read_secret_file, redact_url
from exporter.settings import BY_NAME, add_flags
from exporter.shapes import DIAGNOSIS, ShapeError
from exporter.shapes import check as check_shape
from exporter.sources.base import SourceError
from exporter.sources.engines.auth import client_context
from exporter.targets import refuse_userinfo
from exporter.termsafe import terminal_safe, terminal_safe_tree

EXIT_HEALTHY = 0
EXIT_DEGRADED = 1
EXIT_CONFIG = 2
EXIT_UNKNOWN = 3
EXIT_UNHEALTHY = 4
STATUS_EXIT = {"healthy": EXIT_HEALTHY, "degraded": EXIT_DEGRADED, "unhealthy": EXIT_UNHEALTHY}

# The exporter's settings that `doctor --engine` takes too (exporter/settings.py), in --help order.
ENGINE_SETTINGS = ("engines", "interval_s", "model", "tensor_parallel", "gpu_backend", "host_enabled",
                   "slo_ttft_s", "slo_tbt_s")
_ENGINE_HELPS = {
    "engines": "engine /metrics URL to sample directly; repeat for several",
    "interval_s": "sampling interval with --engine (default 1s)",
    "model": "model shape: a built-in name or a config.json path",
    "gpu_backend": "GPU source with --engine (default auto: NVML when present)",
    "host_enabled": "do not read the host's CPU and PCIe state with --engine",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "doctor", help="say where the bottleneck is: ask an exporter or sample an engine",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running llm-exporter (reads /api/v1/diagnosis)")
    add_flags(where, ENGINE_SETTINGS[:1], helps=_ENGINE_HELPS, metavars={"engines": "URL[,kind=K][,name=N]"})
    parser.add_argument("--duration", default="10s", help="sampling window with --engine (default 10s)")
    add_flags(parser, ENGINE_SETTINGS[1:], helps=_ENGINE_HELPS,
              defaults={"interval_s": "1s", "gpu_backend": "auto"})
    parser.add_argument("--timeout", default="5s", help="HTTP timeout with --url (default 5s)")
    parser.add_argument("--ca-file", dest="ca_file", metavar="PATH",
                        help="CA bundle to verify an https --url exporter (default: the system's)")
    parser.add_argument("--cert-file", dest="cert_file", metavar="PATH",
                        help="client certificate for an exporter that requires mutual TLS (with --key-file)")
    parser.add_argument("--key-file", dest="key_file", metavar="PATH", help="the client certificate's key")
    parser.add_argument("--username", help="basic auth user for --url (an exporter with basic_auth_users)")
    parser.add_argument("--password-file", dest="password_file", metavar="PATH",
                        help="file holding that user's password (never taken on the command line)")
    parser.add_argument("--password-env", dest="password_env", metavar="VAR",
                        help="environment variable holding that user's password")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    return parser


# --- getting a diagnosis ----------------------------------------------------------------------

MAX_DIAGNOSIS_BYTES = 8 << 20  # a diagnosis is a few KB per target; anything this big is not one


@dataclass(frozen=True)
class ExporterAccess:
    """How to reach an exporter served with --web.config.file: whom to trust, who we are."""

    verify: ssl.SSLContext | None = None  # None: the certifi bundle, as for https:// engine targets
    auth: tuple[str, str] | None = None


def exporter_access(args: argparse.Namespace, env: Mapping[str, str]) -> ExporterAccess:
    """--ca-file and basic auth for --url. Raises ConfigError naming the option, never the secret."""
    given = [(flag, value) for flag, value in (
        ("--ca-file", args.ca_file), ("--cert-file", args.cert_file), ("--key-file", args.key_file),
        ("--username", args.username), ("--password-file", args.password_file),
        ("--password-env", args.password_env)) if value]
    if given and not args.url:
        raise ConfigError(*given[0], "applies to --url only; an --engine target takes ca_file=, username= "
                          "and password_file= in its spec")
    verify: ssl.SSLContext | None = None
    if args.ca_file or args.cert_file or args.key_file:
        try:
            verify = client_context(args.ca_file)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError("--ca-file", args.ca_file, f"not a readable CA bundle ({error})") from None
    if bool(args.cert_file) != bool(args.key_file):
        named = ("--cert-file", args.cert_file) if args.cert_file else ("--key-file", args.key_file)
        raise ConfigError(*named, "a client certificate needs both --cert-file and --key-file")
    if args.cert_file:
        try:
            verify.load_cert_chain(args.cert_file, args.key_file)  # type: ignore[union-attr]
        except (OSError, ssl.SSLError) as error:
            raise ConfigError("--cert-file", args.cert_file,
                              f"cannot load it with --key-file ({error})") from None
    if not (args.username or args.password_file or args.password_env):
        return ExporterAccess(verify)
    if args.username is None or bool(args.password_file) == bool(args.password_env):
        raise ConfigError("--username", args.username or "", "basic auth needs --username and one of "
                          "--password-file or --password-env")
    if args.password_env:
        password = env.get(args.password_env, "")
        if not password:
            raise ConfigError("--password-env", args.password_env, "is not set or empty")
    else:
        try:
            password = read_secret_file(args.password_file)
        except CredentialError as error:
            raise ConfigError("--password-file", args.password_file, str(error)) from None
    return ExporterAccess(verify, (args.username, password))


def fetch_diagnosis(url: str, timeout_s: float, access: ExporterAccess | None = None) -> dict[str, Any]:
    """GET <exporter>/api/v1/diagnosis with the engine targets' client (bounded in bytes and
    time); `url` is the exporter's base URL, a trailing /metrics taken off (exporter/reach.py).
    Raises RuntimeError with a readable reason: an HTTP status as its code and phrase, never the
    body that came with it; a server that accepts no connection as `cannot reach URL: why`."""
    access = access or ExporterAccess()
    base = exporter_base_url(url)
    endpoint = base + "/api/v1/diagnosis"
    headers = {"Accept": "application/json", "User-Agent": f"llm-exporter-doctor/{__version__}"}
    if access.auth:
        raw = ":".join(access.auth).encode("utf-8")
        headers["Authorization"] = "Basic " + base64.b64encode(raw).decode("ascii")
    try:
        client = HttpClient(endpoint, timeout_s=timeout_s, ssl_context=access.verify or client_context(),
                            headers=headers)
    except ValueError as error:
        raise RuntimeError(str(error)) from None

    async def get() -> bytes:
        try:
            return await client.get(max_body=MAX_DIAGNOSIS_BYTES)
        finally:
            await client.aclose()
    shown = redact_url(endpoint)
    try:
        body = asyncio.run(get())
    except SourceError as error:
        if error.status == 401:
            hint = ("wrong --username or password" if access.auth
                    else "it wants basic auth: --username and --password-file")
            raise RuntimeError(f"{shown} answered HTTP 401 ({hint})") from None
        if error.status is not None:
            hint = " (is it an llm-exporter?)" if error.status == 404 else ""
            raise RuntimeError(f"{shown} answered {http_status_words(error.status)}{hint}") from None
        if error.reason == "too_large":
            raise RuntimeError(f"{shown} answered more than {MAX_DIAGNOSIS_BYTES >> 20} MiB") from None
        if error.reason == "tls":
            raise RuntimeError(f"cannot reach {shown}: its TLS certificate is not trusted "
                               "(CERTIFICATE_VERIFY_FAILED; give --ca-file for a private CA)") from None
        why = why_unreachable(base) if error.reason in ("connection", "dns", "timeout") else None
        if why is not None:
            raise RuntimeError(f"cannot reach {redact_url(base)}: {why}") from None
        raise RuntimeError(f"cannot reach {shown}: {failure_words(error.reason, error.message)}") from None
    try:
        doc = jsonsafe.loads(body)
    except JsonTooDeep as error:
        raise RuntimeError(f"{shown} answered {error}") from None
    except ValueError:
        raise RuntimeError(f"{shown} did not answer JSON (is it an llm-exporter?)") from None
    if not isinstance(doc, dict):
        raise RuntimeError(f"{shown} answered an unexpected document")
    try:  # render_report reads it as exporter/shapes.py DIAGNOSIS says: another shape is "cannot tell"
        check_shape(doc, DIAGNOSIS)
    except ShapeError as error:
        raise RuntimeError(f"{shown} answered a diagnosis of another shape: {error}") from None
    return doc


async def sample_engines(config: Any, duration_s: float) -> dict[str, Any]:
    """Run the exporter's own sources, collector and deriver in-process for `duration_s`.

    When no engine target answered a single scrape in the window there is nothing to diagnose:
    RuntimeError says why (doctor's "cannot tell", exit 3, as for an exporter --url that cannot be
    reached; docs/cli.md), and once every target refused the connection the window is not waited
    out. A target that answered once and failed later is a finding: the diagnosis lists it."""
    from exporter.app import build_sources, make_collector
    from exporter.sources.engines.scrape import EngineSource

    sources = build_sources(config)
    engines = [s for s in sources if isinstance(s, EngineSource)]  # the one source of kind ENGINE
    collector = make_collector(config, sources)
    answered: set[str] = set()
    results: Mapping[str, Any] = {}
    log = logging.getLogger("llm_exporter.collect")
    level = log.level
    log.setLevel(logging.ERROR)  # a source failing is the report's to say, not a log line beside it
    try:
        deadline = time.monotonic() + duration_s
        while True:
            started = time.monotonic()
            results = (await collector.collect_once()).snapshot.results
            answered.update(s.name for s in engines if results[s.name].ok)
            if engines and not answered and all(results[s.name].error_reason in ("connection", "dns")
                                                for s in engines):
                whys = [await asyncio.to_thread(why_unreachable, s.target.url) for s in engines]
                if all(whys):
                    raise RuntimeError("; ".join(f"cannot reach {redact_url(s.target.url)}: {why}"
                                                 for s, why in zip(engines, whys, strict=True)))
            if started + config.interval_s > deadline:
                break
            await asyncio.sleep(max(0.0, config.interval_s - (time.monotonic() - started)))
    finally:
        log.setLevel(level)
        await collector.close()
    if engines and not answered:
        raise RuntimeError("; ".join([await _never_answered(s.target.url, results[s.name], duration_s)
                                      for s in engines]))
    return collector.derive.diagnosis()  # type: ignore[attr-defined]


async def _never_answered(url: str, result: Any, duration_s: float) -> str:
    """Why an engine target gave no scrape in the window, for the "cannot tell" line."""
    why = None
    if result.error_reason in ("connection", "dns", "timeout"):
        why = await asyncio.to_thread(why_unreachable, url)
    if why is not None:
        return f"cannot reach {redact_url(url)}: {why}"
    return (f"no scrape of {redact_url(url)} succeeded in {duration_s:g}s: "
            f"{failure_words(result.error_reason, result.error_message)}")


# --- the report -------------------------------------------------------------------------------

def exit_code(diagnosis: Mapping[str, Any]) -> int:
    if not diagnosis.get("ready", False):
        return EXIT_UNKNOWN
    return STATUS_EXIT.get(str(diagnosis.get("status")), EXIT_UNKNOWN)


def _scores_line(scores: Mapping[str, float]) -> str:
    ranked = sorted(((n, v) for n, v in scores.items() if v is not None), key=lambda kv: -kv[1])  # null: not finite
    return ", ".join(f"{name} {value:.2f}" for name, value in ranked)


def render_report(diagnosis: Mapping[str, Any], source: str, out: TextIO) -> None:
    """The report for a terminal. Every string of the diagnosis may come from an engine (a model
    name, a finish reason) or a remote exporter: all go through termsafe first."""
    diagnosis, source = terminal_safe_tree(diagnosis), terminal_safe(source)
    status = str(diagnosis.get("status", "unknown"))
    out.write(f"llm-exporter doctor: {source}\nstatus: {status.upper()}\n")
    targets = diagnosis.get("targets", {}) or {}
    for name in sorted(targets):
        t = targets[name]
        verdict = t.get("verdict")
        what = " ".join(x for x in (t.get("engine"), t.get("model")) if x)
        out.write(f"\ntarget {name}" + (f" ({what})" if what else "") + "\n")
        faults = t.get("unhealthy_because", []) or []
        for fault in faults:
            out.write(f"  UNHEALTHY: {fault}\n")
        out.write(f"  bottleneck: {VERDICT_WORDS.get(verdict or '', (UNKNOWN_VERDICT_WORDS,) * 2)[1]}")
        for also in t.get("also_limiting", []) or []:
            out.write(f", and as much {VERDICT_WORDS.get(also, (also, also))[1]}")
        out.write(f"   [{t.get('status', 'unknown')}]\n")
        for reason in t.get("degraded_because", []) or []:
            out.write(f"  degraded: {reason}\n")
        slo_words = [state.get("words", "") for state in (t.get("slo") or {}).values()]
        for words in slo_words:
            out.write(f"  {words}\n")
        if t.get("probe"):
            out.write(f"  {t['probe']['words']}\n")
        for note in t.get("notes", []) or []:
            if note not in slo_words:
                out.write(f"  note: {note}\n")
        if t.get("evidence"):
            out.write("  why:\n")
            for line in t["evidence"]:
                if line not in faults:
                    out.write(f"    - {line}\n")
        if t.get("remedies"):
            out.write("  first things to try:\n")
            for i, line in enumerate(t["remedies"], 1):
                out.write(f"    {i}. {line}\n")
        if t.get("scores"):
            out.write(f"  scores: {_scores_line(t['scores'])}\n")
        for line in t.get("omitted", []) or []:
            out.write(f"  not shown: {line}\n")
        if t.get("unaccounted_families"):
            out.write("  engine families not understood (a newer engine release? see docs/engines.md): "
                      + ", ".join(t["unaccounted_families"]) + "\n")
    for fault in diagnosis.get("gpu_faults_unassigned", []) or []:
        out.write(f"\nGPU not assigned to a target: UNHEALTHY: {fault.get('words', '')}\n")
    for down in diagnosis.get("unreachable", []) or []:
        said = f": {down['message']}" if down.get("message") else ""
        out.write(f"\ntarget {down.get('target')}: UNREACHABLE ({down.get('reason')}){said}\n")
    for note in diagnosis.get("notes", []) or []:
        out.write(f"\nnote: {note}\n")
    if not targets and not diagnosis.get("unreachable"):
        out.write("\nno targets to diagnose\n")


def _engine_config(args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    flags = {BY_NAME[name].dest: getattr(args, BY_NAME[name].dest) for name in ENGINE_SETTINGS}
    return load_config({**flags, "log_level": "error"}, env)


def command_doctor(args: argparse.Namespace, env: Mapping[str, str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if args.url:
            refuse_userinfo(args.url, "url", "give --username with --password-file instead")
            source = f"{redact_url(args.url)} (exporter)"
            access = exporter_access(args, env)
            diagnosis = fetch_diagnosis(args.url, parse_duration(args.timeout, "timeout"), access)
        else:
            exporter_access(args, env)  # refuses the --url-only options
            config = _engine_config(args, env)
            duration = parse_duration(args.duration, "duration")
            source = ", ".join(redact_url(t.url) for t in config.engines) + f" (sampled for {duration:g}s)"
            diagnosis = asyncio.run(sample_engines(config, duration))
    except ConfigError as error:
        print(f"llm-exporter doctor: {terminal_safe(str(error))}", file=sys.stderr)
        return EXIT_CONFIG
    except RuntimeError as error:
        if args.json:
            json.dump({"status": "unknown", "exit_code": EXIT_UNKNOWN, "error": str(error)}, out, indent=2)
            out.write("\n")
        else:
            out.write(f"llm-exporter doctor: cannot tell: {terminal_safe(str(error))}\n")
        return EXIT_UNKNOWN
    code = exit_code(diagnosis)
    try:
        if args.json:
            json.dump({"status": diagnosis.get("status", "unknown"), "exit_code": code, "source": source,
                       "diagnosis": diagnosis}, out, indent=2, default=str)
            out.write("\n")
        else:
            render_report(diagnosis, source, out)
        out.flush()
    except BrokenPipeError:
        pass  # `doctor | head`: the reader left; the exit status still says what was found
    return code
