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
    for problem in result.problems:
        print(f"problem: {problem}", file=sys.stderr)
    lost = [p for p in result.problems if p.lost_documents]
    if lost and not args.keep_going:
        print(
            f"acare import-traces: error: {len(lost)} search(es) lost their documents (listed "
            "above); nothing written. Fix the log, or pass --keep-going to import them without "
            "their documents",
            file=sys.stderr,
        )
        return 1
    path = write_parquet(result.table, args.output)
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
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="write the table even when some searches lost their documents (their passages "
        "could not be parsed); by default that is an error",
    )
    parser.set_defaults(func=import_traces_command)
