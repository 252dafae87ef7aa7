"""The ``acare`` command. Each area registers its own subcommands; this file only dispatches.

A subcommand module exposes ``register(subparsers)``, which adds parsers whose ``func`` default
takes the parsed namespace and returns an exit code. Flags become a config object and the
module's ``run(config)`` does the work.
"""

from __future__ import annotations

import argparse
import importlib
import os

COMMAND_MODULES = (
    "acare_ray.cli.demo",
    "acare_ray.data.cli",
    "acare_ray.offline.cli",
    "acare_ray.online.cli",
    "acare_ray.training.cli",
    "acare_ray.adopt.cli",
    "acare_ray.cli.verify",
    "acare_ray.agent.cli",
    "acare_ray.search.cli",
    "acare_ray.clients.mcp_server",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acare", description="Agent-context-aware reranking on Ray."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is None or not name.startswith(err.name):
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
