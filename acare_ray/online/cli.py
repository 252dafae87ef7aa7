"""``acare serve``: run the online reranker from a Serve config file.

The flags override the config (``--model`` the application's ``args.model``, ``--port`` and
``--host`` the HTTP options); the resolved config is checked against Serve's own schema and
handed to ``serve run``, so ``acare serve`` and ``serve run <config>`` behave the same.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The repository's config, found from the package (an editable install from a clone, as the
# README sets up), so `acare serve` works from any directory.
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "serve_configs" / "local.yaml"


@dataclass(frozen=True)
class ServeConfig:
    """What ``acare serve`` was asked for; ``print_only`` prints the resolved config and exits."""

    config: Path
    model: str | None = None
    port: int | None = None
    host: str | None = None
    address: str | None = None
    index: Path | None = None
    replicas: int | None = None
    print_only: bool = False


def serve_config(options: ServeConfig) -> dict[str, Any]:
    """The Serve config with the overrides applied, validated by ``ServeDeploySchema``."""
    from ray.serve.schema import ServeDeploySchema

    if not options.config.is_file():
        raise FileNotFoundError(f"--config: no file at {options.config}")
    config = copy.deepcopy(yaml.safe_load(options.config.read_text()))
    if options.model is not None:
        model = options.model
        # Replicas do not share this shell's working directory: make local paths absolute.
        if Path(model).exists():
            model = str(Path(model).resolve())
        for app in config.get("applications", []):
            app.setdefault("args", {})["model"] = model
    if options.index is not None:
        # Replicas do not share this shell's working directory either.
        for app in config.get("applications", []):
            search = app.setdefault("args", {}).get("search") or {}
            search.pop("upstream_url", None)
            app["args"]["search"] = search | {"index": str(options.index.resolve())}
    if options.replicas is not None:
        for app in config.get("applications", []):
            for deployment in app.get("deployments", []):
                if deployment.get("name") == "Reranker":
                    deployment["num_replicas"] = options.replicas
    http = config.setdefault("http_options", {})
    if options.port is not None:
        http["port"] = options.port
    if options.host is not None:
        http["host"] = options.host
    ServeDeploySchema.model_validate(config)
    return config


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """Ctrl-C (SIGINT) and SIGTERM both shut the app down the way ``serve run`` does on Ctrl-C.

    A shell that starts a command in the background without job control (a script's ``&``,
    ``nohup``, many CI runners) hands it SIGINT ignored, and Python keeps it ignored, so
    ``kill -INT`` did nothing; SIGTERM (what a service manager or Kubernetes sends) killed the
    driver without shutting Serve down.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)


def start_ray(address: str | None) -> None:
    """Connect to (or start) Ray as ``serve run`` would, before it does: its ``ray.init`` sets
    a SIGTERM handler that exits at once, with no Serve shutdown, and ``serve run`` only starts
    Ray when it is not running yet. So Ray starts here and :func:`stop_on_signals` comes
    after it."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS")
    ray.init(address=address, namespace="serve")


def run(options: ServeConfig) -> int:
    from pydantic import ValidationError

    try:
        config = serve_config(options)
    except (FileNotFoundError, ValidationError, yaml.YAMLError) as err:
        print(f"acare serve: {err}", file=sys.stderr)
        return 2
    text = yaml.safe_dump(config, sort_keys=False)
    if options.print_only:
        sys.stdout.write(text)
        return 0
    from ray.serve.scripts import cli as serve_cli

    with tempfile.TemporaryDirectory(prefix="acare-serve-") as folder:
        path = Path(folder) / "serve_config.yaml"
        path.write_text(text)
        http = config.get("http_options", {})
        print(f"acare serve: http://{http.get('host', '127.0.0.1')}:{http.get('port', 8000)}")
        start_ray(options.address)
        stop_on_signals()
        serve_cli.main(args=["run", str(path)], prog_name="serve", standalone_mode=False)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve the reranker over HTTP (Ray Serve; Cohere and TEI APIs)"
    )
    parser.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="Serve config YAML (default: local.yaml)"
    )
    parser.add_argument("--model", help="model id or checkpoint directory (overrides the config)")
    parser.add_argument("--port", type=int, help="HTTP port (overrides the config)")
    parser.add_argument("--host", help="HTTP host (overrides the config)")
    parser.add_argument(
        "--address",
        help="Ray cluster to use (default: $RAY_ADDRESS, a running local cluster, or a new one; "
        "'local' always starts a new one)",
    )
    parser.add_argument(
        "--index",
        help="index folder from `acare index`: adds POST /v1/search (overrides the config)",
    )
    parser.add_argument(
        "--replicas", type=int, help="reranker replicas per application (overrides the config)"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    parser.set_defaults(
        func=lambda args: run(
            ServeConfig(
                config=Path(args.config),
                model=args.model,
                port=args.port,
                host=args.host,
                address=args.address,
                index=Path(args.index) if args.index else None,
                replicas=args.replicas,
                print_only=args.print_config,
            )
        )
    )
