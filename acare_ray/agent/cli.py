"""``acare agent-bench``: flags -> :class:`AgentBenchConfig` -> :func:`run`."""

from __future__ import annotations

import argparse
import os
import sys


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def agent_bench_command(args: argparse.Namespace) -> int:
    from acare_ray.agent.bench import (
        AgentBenchConfig,
        export_corpus,
        format_bench_table,
        format_phases,
        run,
    )
    from acare_ray.agent.tasks import read_task_ids
    from acare_ray.cli.flags import config_from_flags

    if args.model is not None:
        reranker = "model"
    elif args.endpoint is not None:
        reranker = "endpoint"
    else:
        reranker = args.reranker or "none"
    if args.out is None and args.export_corpus is None:
        print(f"acare {args.command}: error: --out is required", file=sys.stderr)
        return 2
    try:
        task_ids = read_task_ids(args.task_ids) if args.task_ids else None
        config = config_from_flags(
            AgentBenchConfig,
            args,
            out=args.out or "",
            reranker=reranker,
            modes=_csv(args.modes),
            api_key=os.environ.get("ACARE_API_KEY") or None,
            baseline=not args.no_baseline,
            n_resamples=args.resamples,
            task_ids=task_ids,
            fusion=tuple(args.fusion or ()),
        )
        if args.export_corpus is not None:
            written = export_corpus(config, args.export_corpus)
            print(f"wrote {written} documents to {args.export_corpus}")
            return 0
        report = run(config)
    except (ValueError, OSError) as err:
        print(f"acare {args.command}: error: {err}", file=sys.stderr)
        return 2
    print(format_bench_table(report))
    print(format_phases(report))
    print(f"report: {report['files']['markdown']} ({report['wall_s']:.1f} s)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "agent-bench", help="simulated MuSiQue agent with the reranker in the loop"
    )
    bench.add_argument("--tasks", type=int, default=100, help="MuSiQue questions to run")
    bench.add_argument("--seed", type=int, default=0, help="task draw and test resampling")
    bench.add_argument("--split", default="dev", choices=["dev", "train", "all"])
    bench.add_argument(
        "--task-ids",
        default=None,
        help="file of MuSiQue ids, one per line: run exactly these tasks (overrides --tasks)",
    )
    bench.add_argument(
        "--corpus",
        default="all",
        choices=["all", "tasks"],
        help="search the paragraphs of every MuSiQue question (all, the open setting) or only "
        "of the tasks run (tasks)",
    )
    which = bench.add_mutually_exclusive_group()
    which.add_argument("--model", default=None, help="in-process Scorer: HF id, path or alias")
    which.add_argument("--endpoint", default=None, help="Cohere-compatible base URL (/v2/rerank)")
    which.add_argument("--reranker", default=None, choices=["none", "oracle"])
    bench.add_argument("--modes", default="auto", help="modes for --model/--endpoint: M0,M2,M3")
    bench.add_argument("--endpoint-model", default="acare", help="`model` field sent")
    bench.add_argument(
        "--fusion",
        action="append",
        default=None,
        help="also run each mode fused with the BM25 first stage: rrf[:k=60,weight=0.5], "
        "linear[:alpha=0.5] or auto (the checkpoint's fitted setting; at --endpoint, the "
        "server's); repeatable. --endpoint sends first_stage_scores and fusion",
    )
    bench.add_argument(
        "--fused-only",
        action="store_true",
        help="with --fusion (--model or --endpoint): run only the fused systems, not each mode alone",
    )
    bench.add_argument(
        "--no-baseline", action="store_true", help="do not add the BM25 system beside the reranker"
    )
    bench.add_argument("--agents", type=int, default=1, help="sessions in flight at once")
    bench.add_argument(
        "--ramp-s",
        type=float,
        default=0.0,
        help="start the first --agents sessions evenly over this many seconds (a growing load; "
        "default 0: all at once)",
    )
    bench.add_argument("--budget", type=int, default=3, help="searches per step before failing")
    bench.add_argument("--depth", type=int, default=10, help="unseen documents per search")
    bench.add_argument("--first-stage-k", type=int, default=100, help="BM25 candidates")
    bench.add_argument("--device", default=None, help="--model device (default: cuda if any)")
    bench.add_argument("--max-batch-tokens", type=int, default=None, help="scorer token budget")
    bench.add_argument("--resamples", type=int, default=10_000, help="randomization resamples")
    bench.add_argument("--progress-every", type=int, default=10, help="progress line every N tasks")
    bench.add_argument(
        "--search-endpoint",
        default=None,
        help="also run each mode through POST URL/v1/search (server-side first stage, rerank "
        "and session memory; the app's --index must be this run's --export-corpus)",
    )
    bench.add_argument(
        "--mcp",
        default=None,
        help="also run the search tool of an acare mcp server: its streamable HTTP URL "
        "(http://127.0.0.1:8765/mcp) or a command that starts it over stdio",
    )
    bench.add_argument(
        "--export-corpus",
        default=None,
        metavar="JSONL",
        help="write the corpus these task flags select as `acare index` input, and exit",
    )
    bench.add_argument("--out", default=None, help="report folder (required for a run)")
    bench.set_defaults(func=agent_bench_command)
