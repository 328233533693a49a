"""The ``dra-gpu`` command: ``agent`` (one per node) and, as they land, ``controller`` and
``explain``. Flags and environment are read here, once, into a typed settings object that is
passed down; nothing below reads the environment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import dra_gpu
from dra_gpu import config, failpoints


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-gpu", description="A Kubernetes DRA driver for GPUs."
    )
    parser.add_argument("--version", action="version", version=f"dra-gpu {dra_gpu.__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
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
    explain.add_argument("--kubeconfig", default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _give_a_home()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "agent":
        try:
            settings = config.settings_from(config.AgentSettings, args)
            failpoints.configure()
        except (ValueError, TypeError) as exc:
            parser.error(f"agent: {exc}")
        from dra_gpu.agent.runner import run_agent

        return _run_until_signal(lambda stopping: run_agent(settings, stopping))
    if args.command == "controller":
        try:
            controller_settings = config.settings_from(config.ControllerSettings, args)
        except (ValueError, TypeError) as exc:
            parser.error(f"controller: {exc}")
        if controller_settings.kubeconfig:
            # Kopf logs in from $KUBECONFIG; the flag must reach it the same way.
            os.environ["KUBECONFIG"] = str(controller_settings.kubeconfig)
        from dra_gpu.controller.main import run_controller

        return _run_until_signal(lambda stopping: run_controller(controller_settings, stopping))
    if args.command == "explain":
        from dra_gpu.controller.command import ExplainError, explain_target

        kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None
        try:
            print(asyncio.run(explain_target(kubeconfig, args.target, args.namespace)), end="")
        except ExplainError as exc:
            print(f"dra-gpu explain: {exc}", file=sys.stderr)
            return 1
    return 0


def _give_a_home() -> None:
    """An image's uid (65532) has no passwd entry; run without ``HOME`` as well, a process has
    no home at all, and the Kubernetes client resolves ``~/.kube/config`` when imported (it
    raises there). Such a process gets ``/``, as container runtimes give it."""
    if os.path.expanduser("~") == "~":
        os.environ["HOME"] = "/"


def _run_until_signal(start) -> int:  # type: ignore[no-untyped-def]
    async def runner() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await start(stopping)

    try:
        asyncio.run(runner())
    except Exception:
        logging.getLogger("dra_gpu").exception("exiting after an unrecoverable error")
        return 1
    return 0
