"""``acare index``: a corpus (Parquet/JSONL: doc_id, title, text) -> a search index folder."""

from __future__ import annotations

import argparse
import sys


def index_command(args: argparse.Namespace) -> int:
    from acare_ray.search.index import build_index

    try:
        report = build_index(args.input, args.out)
    except (ValueError, OSError) as err:
        print(f"acare index: error: {err}", file=sys.stderr)
        return 2
    print(report.describe())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index", help="build the BM25 index /v1/search reads (corpus: doc_id, title, text)"
    )
    parser.add_argument(
        "--input", required=True, nargs="+", help="corpus files: .parquet or .jsonl"
    )
    parser.add_argument("--out", required=True, help="index folder to write")
    parser.set_defaults(func=index_command)
