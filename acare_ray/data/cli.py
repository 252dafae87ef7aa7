"""``acare import-traces``: agent trajectories -> a searches Parquet file (flags -> ``run``)."""

from __future__ import annotations

import argparse
import sys

from acare_ray.data.traces import FORMATS


def import_traces_command(args: argparse.Namespace) -> int:
    from acare_ray.data.io import write_parquet
    from acare_ray.data.traces import import_traces

    try:
        result = import_traces(args.input, args.format, args.gold, args.k)
    except ValueError as err:
        print(f"acare import-traces: error: {err}", file=sys.stderr)
        return 2
    path = write_parquet(result.table, args.output)
    for problem in result.problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"{result.describe()}; wrote {path}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import-traces", help="agent trajectories (JSONL) -> searches Parquet with page labels"
    )
    parser.add_argument(
        "--input", required=True, nargs="+", help="trajectory JSONL files (one agent each)"
    )
    parser.add_argument("--format", default="r1-searcher", choices=FORMATS)
    parser.add_argument("--gold", default=None, help="gold file: question -> supporting titles")
    parser.add_argument("--k", type=int, default=100, help="BM25 candidates per search")
    parser.add_argument("--output", required=True, help="searches Parquet file to write")
    parser.set_defaults(func=import_traces_command)
