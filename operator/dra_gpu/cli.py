"""The ``dra-gpu`` command: ``agent`` (one per node), ``controller``, ``explain`` and ``status``;
the same code is the kubectl plugin ``kubectl-dra_gpu`` (``kubectl dra-gpu explain ...``: its
usage and errors say ``kubectl dra-gpu``). Flags and environment are read here, once, into a
typed settings object that is passed down; nothing below reads the environment. ``explain``
and ``status`` take kubectl's flags (``-n``, ``-A``, ``-l``, ``--context``, ``-o``).

This is also where failures at the edges become words: a missing or invalid flag, kubeconfig
or profile, an unreachable or refusing API server end the command with one line on stderr
(what is wrong, how to fix it) and a distinct exit code (``dra_gpu.exits``); the traceback only
with ``--log-level DEBUG``. The controller and the agent wait for an unreachable API server.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from pythonjsonlogger.json import JsonFormatter

import dra_gpu
from dra_gpu import config
from dra_gpu.agent import failpoints
from dra_gpu.devices import model
from dra_gpu.exits import ExitCode, OneLineParser

# Not imported here: the components, nor ``dra_gpu.kube``. Kopf's Kubernetes client
# (kubernetes-asyncio) fixes its default kubeconfig (``$KUBECONFIG``) when imported, and Kopf
# logs the controller in with that default, so the controller's ``--kubeconfig`` must be in the
# environment first (``_command``); and each command loads only what it uses.

log = logging.getLogger("dra_gpu")
T = TypeVar("T")
PROG = "dra-gpu"
KUBECTL_PROG = "kubectl dra-gpu"
OUTPUTS = ("wide", "json", "yaml")  # controller.output.FORMATS, without importing it here


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="A Kubernetes DRA driver for GPUs.")
    parser.add_argument("--version", action="version", version=f"{prog} {dra_gpu.__version__}")
    parser.add_log_level()
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    agent = commands.add_parser(
        "agent",
        help="node agent: publish this node's GPUs, serve the kubelet's DRA plugin calls",
        description="The node agent. Every flag has an environment twin (DRA_GPU_<FLAG>).",
    )
    config.add_arguments(agent, config.AgentSettings)
    controller = commands.add_parser(
        "controller",
        help="cluster-wide controller: explain pending claims, check classes and slices, metrics",
        description="The controller. Every flag has an environment twin (DRA_GPU_<FLAG>).",
    )
    config.add_arguments(controller, config.ControllerSettings)
    explain = commands.add_parser(
        "explain",
        help="why is a pod or claim waiting: class, devices, node and driver",
        description="Without a target: every waiting claim of the namespace (-A: of the "
        "cluster; -l: the claims of the pods it selects) and its missing piece. Exit code 0 "
        "when nothing explained misses a piece, 6 when a piece is missing.",
    )
    explain.add_argument(
        "target", nargs="?", default=None, help="pod/NAME or resourceclaim/NAME [default: all]"
    )
    explain.add_argument(
        "-n", "--namespace", default=None, help="[default: the context's namespace, else default]"
    )
    explain.add_argument(
        "-A", "--all-namespaces", action="store_true", help="waiting claims of every namespace"
    )
    explain.add_argument(
        "-l", "--selector", default=None, help="the claims of the pods with these labels (a=b,c)"
    )
    _add_client_flags(explain)
    status = commands.add_parser(
        "status",
        help="our GPUs per node: published, allocated, free, memory, partitions and shares",
        description="Counted as the controller's metrics count them (complete pools only).",
    )
    status.add_argument(
        "--driver-name",
        default=dra_gpu.DEFAULT_DRIVER_NAME,
        help=f"the DRA driver whose devices to count [default: {dra_gpu.DEFAULT_DRIVER_NAME}]",
    )
    _add_client_flags(status)
    return parser


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file [default: $KUBECONFIG, ~/.kube/config]"
    )
    parser.add_argument(
        "--context", default=None, help="the kubeconfig context [default: its current-context]"
    )
    parser.add_argument(
        "-o",
        "--output",
        default="",
        choices=OUTPUTS,
        help="wide (more columns or each request's devices), json or yaml",
    )


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-dra_gpu``: ``kubectl dra-gpu ...``, the same commands."""
    return main(argv, prog=KUBECTL_PROG)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    _give_a_home()
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.prog = prog
    _configure_logging(args.log_level, args.log_format)
    if args.command is None:
        parser.print_help()
        return ExitCode.OK
    try:
        return _command(args)
    except UsageError as exc:
        return _fail(f"{prog} {args.command}", exc, ExitCode.USAGE)
    except BaseException as exc:  # edge failures in words, the rest re-raised
        for leaf in _leaves(exc):
            if (code := _exit_code(leaf)) is not None:
                return _fail(f"{prog} {args.command}", leaf, code, exc)
        raise


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = ("levelname", "name", "message")
"""A JSON record's keys beside ``time`` (RFC 3339, UTC), renamed ``level``, ``logger``,
``message``; the fields a call passes with ``extra=`` (an object's ``namespace``, ``name``,
``uid``) are keys beside them."""


def _configure_logging(level: str, log_format: str) -> None:
    """Every record to stderr, one line each: text for people, or JSON for log pipelines
    (python-json-logger; a traceback goes into the object's ``exc_info``, not onto new lines)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(
                JSON_FIELDS,
                rename_fields={"levelname": "level", "name": "logger"},
                timestamp="time",
                json_ensure_ascii=False,
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def _give_a_home() -> None:
    """An image's uid (65532) has no passwd entry; without HOME as well, a process has no home
    at all, and the Kubernetes client (imported by Kopf too) resolves ~/.kube/config at import
    time: it raises there. Such a process gets /, as container runtimes give it; here, before
    any command imports the client."""
    if os.path.expanduser("~") == "~":
        os.environ["HOME"] = "/"


class UsageError(Exception):
    """A flag, its environment twin or an argument is missing or invalid."""


@dataclasses.dataclass(frozen=True)
class Kubeconfig:
    """The kubeconfig flag's value, where it came from, and how to pass one (for messages)."""

    path: Path | None
    source: str
    flag: str


def _settings(settings_type: type[T], args: argparse.Namespace) -> T:
    try:
        settings: T = config.settings_from(settings_type, args)
        if settings_type is config.AgentSettings:
            failpoints.configure()
    except (ValueError, TypeError) as exc:  # both name the flag and its environment twin
        raise UsageError(str(exc)) from exc
    return settings


def _command(args: argparse.Namespace) -> int:
    if args.command == "agent":
        settings = _settings(config.AgentSettings, args)
        for note in settings.xid_policy.notes():
            log.warning("%s", note)
        from dra_gpu.agent.runner import run_agent

        kubeconfig = _from_settings(args, settings.kubeconfig)
        return _run_until_signal(kubeconfig, lambda stopping: run_agent(settings, stopping))
    if args.command == "controller":
        controller_settings = _settings(config.ControllerSettings, args)
        if controller_settings.kubeconfig:
            # Kopf logs in from $KUBECONFIG; the flag must reach it the same way.
            os.environ["KUBECONFIG"] = str(controller_settings.kubeconfig)
        from dra_gpu.controller.main import run_controller

        kubeconfig = _from_settings(args, controller_settings.kubeconfig)
        return _run_until_signal(
            kubeconfig, lambda stopping: run_controller(controller_settings, stopping)
        )
    path = Path(args.kubeconfig) if args.kubeconfig else None
    if args.command == "status":
        from dra_gpu.controller import status

        counted = asyncio.run(
            status.status_command(
                path, driver=args.driver_name, source="--kubeconfig", context=args.context
            )
        )
        print(status.render(counted, args.output), end="")
        for note in counted.notes:
            print(f"{args.prog} status: {note}", file=sys.stderr)
        if not counted.nodes and args.output not in ("json", "yaml"):
            print(f"No devices of {args.driver_name} published.", file=sys.stderr)
        return ExitCode.OK
    from dra_gpu.controller.command import Query, explain_command

    query = Query(args.target, args.namespace, args.all_namespaces, args.selector, args.output)
    answer = asyncio.run(explain_command(path, query, source="--kubeconfig", context=args.context))
    print(answer.text, end="")
    if answer.note:
        print(answer.note, file=sys.stderr)
    return ExitCode.OK if answer.satisfied else ExitCode.NOT_SATISFIED


def _exit_code(exc: BaseException) -> ExitCode | None:
    """The exit code of a failure at the edges; None for anything else (a bug: traceback)."""
    from dra_gpu import kube
    from dra_gpu.controller.command import BadTarget
    from dra_gpu.controller.snapshot import CommandError

    if isinstance(exc, BadTarget):
        return ExitCode.USAGE
    if isinstance(exc, kube.ConfigError | model.ProfileError):
        return ExitCode.CONFIG
    if isinstance(exc, kube.Unreachable):
        return ExitCode.UNREACHABLE
    if isinstance(exc, kube.Refused):
        return ExitCode.REFUSED
    if isinstance(exc, CommandError):
        return ExitCode.FAILED
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    return None


def _fail(
    command: str, exc: BaseException, code: ExitCode, raised: BaseException | None = None
) -> int:
    """One line on stderr (``command``: ``dra-gpu explain``), after the traceback at DEBUG."""
    from dra_gpu import kube

    log.debug("the failure in full:", exc_info=raised or exc)
    if code is not ExitCode.INTERRUPTED:
        message = " ".join(str(exc).split())
        if isinstance(exc, model.ProfileError):
            message += "; fix --profile (or DRA_GPU_PROFILE)"
        if isinstance(exc, kube.Unreachable):
            message += "; is the cluster up, and is this its kubeconfig and context?"
        print(f"{command}: {message}", file=sys.stderr, flush=True)
    return code


def _leaves(exc: BaseException) -> list[BaseException]:
    """A TaskGroup wraps what its tasks raised: look inside."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _from_settings(args: argparse.Namespace, kubeconfig: Path | None) -> Kubeconfig:
    """The kubeconfig a long-running command uses, and where its name came from."""
    twin = config.env_name("kubeconfig")
    source = "--kubeconfig" if args.kubeconfig else twin
    return Kubeconfig(kubeconfig, source, f"--kubeconfig, {twin}")


def _run_until_signal(
    kubeconfig: Kubeconfig, start: Callable[[asyncio.Event], Awaitable[None]]
) -> int:
    from dra_gpu import kube

    async def runner() -> None:
        # The kubeconfig is checked here, where it is known whether it came from the flag or
        # its twin; the component loads it again (a cheap, local read).
        async with await kube.Kube.connect(
            kubeconfig.path, source=kubeconfig.source, flag=kubeconfig.flag
        ):
            pass
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await start(stopping)

    try:
        asyncio.run(runner())
    except Exception as exc:
        if any(_exit_code(leaf) is not None for leaf in _leaves(exc)):
            raise  # main says it in one line
        log.exception("exiting after an unrecoverable error")
        return ExitCode.FAILED
    return ExitCode.OK
