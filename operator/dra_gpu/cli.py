"""The ``dra-gpu`` command. Subcommands are added by the components as they land
(``controller``, ``agent``, ``explain``); each reads flags and env once and passes a typed
settings object down."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import dra_gpu


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-gpu", description="A Kubernetes DRA driver for GPUs."
    )
    parser.add_argument("--version", action="version", version=f"dra-gpu {dra_gpu.__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
    return 0
