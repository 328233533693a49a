"""The ``dra-gpu`` command: ``agent`` (one per node), ``controller`` and ``explain``. Flags and
environment are read here, once, into a typed settings object that is passed down; nothing
below reads the environment.

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


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dra-gpu", description="A Kubernetes DRA driver for GPUs.")
    parser.add_argument("--version", action="version", version=f"dra-gpu {dra_gpu.__version__}")
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
    )
    explain.add_argument("target", help="pod/NAME or resourceclaim/NAME")
    explain.add_argument("-n", "--namespace", default="default")
    explain.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file [default: $KUBECONFIG, ~/.kube/config]"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _give_a_home()
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level, args.log_format)
    if args.command is None:
        parser.print_help()
        return ExitCode.OK
    try:
        return _command(args)
    except UsageError as exc:
        return _fail(args.command, exc, ExitCode.USAGE)
    except BaseException as exc:  # edge failures in words, the rest re-raised
        for leaf in _leaves(exc):
            if (code := _exit_code(leaf)) is not None:
                return _fail(args.command, leaf, code, exc)
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
    from dra_gpu.controller.command import explain_target

    path = Path(args.kubeconfig) if args.kubeconfig else None
    answer = explain_target(path, args.target, args.namespace, source="--kubeconfig")
    print(asyncio.run(answer), end="")
    return ExitCode.OK


def _exit_code(exc: BaseException) -> ExitCode | None:
    """The exit code of a failure at the edges; None for anything else (a bug: traceback)."""
    from dra_gpu import kube
    from dra_gpu.controller.command import BadTarget, ExplainError

    if isinstance(exc, BadTarget):
        return ExitCode.USAGE
    if isinstance(exc, kube.ConfigError | model.ProfileError):
        return ExitCode.CONFIG
    if isinstance(exc, kube.Unreachable):
        return ExitCode.UNREACHABLE
    if isinstance(exc, kube.Refused):
        return ExitCode.REFUSED
    if isinstance(exc, ExplainError):
        return ExitCode.FAILED
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    return None


def _fail(
    command: str, exc: BaseException, code: ExitCode, raised: BaseException | None = None
) -> int:
    """One line on stderr, after the traceback at DEBUG."""
    from dra_gpu import kube

    log.debug("the failure in full:", exc_info=raised or exc)
    if code is not ExitCode.INTERRUPTED:
        message = " ".join(str(exc).split())
        if isinstance(exc, model.ProfileError):
            message += "; fix --profile (or DRA_GPU_PROFILE)"
        if isinstance(exc, kube.Unreachable):
            message += "; is the cluster up, and is this its kubeconfig and context?"
        print(f"dra-gpu {command}: {message}", file=sys.stderr, flush=True)
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
