"""The ``dra-gpu`` command: ``agent`` (one per node) and, as they land, ``controller`` and
``explain``. Flags and environment are read here, once, into a typed settings object that is
passed down; nothing below reads the environment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import dra_gpu
from dra_gpu import config


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
        except (ValueError, TypeError) as exc:
            parser.error(f"agent: {exc}")
        from dra_gpu.agent.runner import run_agent

        return _run_until_signal(lambda stopping: run_agent(settings, stopping))
    return 0


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
