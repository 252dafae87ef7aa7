"""``acare rerank``, ``acare relabel``, ``acare eval``: flags -> config -> ``run(config)``."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, TypeVar

from acare_ray.offline.evaluate import TESTS, EvalConfig
from acare_ray.offline.fit_fusion import RULES, FitFusionConfig
from acare_ray.offline.job import ActorPool
from acare_ray.offline.lock import OutputLocked
from acare_ray.offline.relabel import RelabelConfig
from acare_ray.offline.rerank import RerankConfig
from acare_ray.offline.resume import StorageError
from acare_ray.ranking.fusion_fit import SafetyRule
from acare_ray.scoring import ScorerSettings

C = TypeVar("C")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _add_common(parser: argparse.ArgumentParser, output: bool = True) -> None:
    parser.add_argument("--input", required=True, help="searches Parquet file or folder")
    if output:
        parser.add_argument("--output", required=True, help="output folder (resumed if it exists)")
        parser.add_argument(
            "--retry-errors",
            action="store_true",
            help="score again the searches whose output rows carry an error (replacing them)",
        )
    parser.add_argument("--model", required=True, help="Hugging Face id, local path or alias")
    parser.add_argument(
        "--revision", default=None, help="Hub commit (or tag) of --model; default: main"
    )
    pool = parser.add_argument_group("Ray")
    pool.add_argument(
        "--actors",
        default=f"{ActorPool.min_size},{ActorPool.max_size}",
        help="actor pool size N or MIN,MAX",
    )
    pool.add_argument("--gpus-per-actor", type=float, default=ActorPool.gpus_per_actor)
    pool.add_argument("--cpus-per-actor", type=float, default=ActorPool.cpus_per_actor)
    pool.add_argument(
        "--batch-size", type=int, default=ActorPool.batch_size, help="searches per actor call"
    )
    pool.add_argument(
        "--rows-per-file",
        type=int,
        default=ActorPool.rows_per_file,
        help="least rows per part file",
    )
    pool.add_argument(
        "--object-store-mb",
        type=int,
        default=None,
        help="cap on the object store the job's blocks hold (default: Ray Data's limit)",
    )
    pool.add_argument("--max-batch-tokens", type=int, default=None, help="scorer token budget")
    pool.add_argument("--ray-address", default=None, help="default: RAY_ADDRESS or a local Ray")


def _given(config: type, args: argparse.Namespace) -> dict[str, Any]:
    """The flags named like ``config``'s fields and set (None is "not given")."""
    flags = vars(args)
    return {
        f.name: tuple(flags[f.name]) if isinstance(flags[f.name], list) else flags[f.name]
        for f in fields(config)
        if flags.get(f.name) is not None
    }


def _pool(args: argparse.Namespace) -> ActorPool:
    low, high = ActorPool.parse_sizes(args.actors)
    return ActorPool(min_size=low, max_size=high, **_given(ActorPool, args))


def _config(config: type[C], args: argparse.Namespace) -> C:
    """``config`` from the flags named like its fields: a flag not given keeps the config's
    default, so defaults live in the config alone; ``pool`` and ``scorer`` are built the same
    way (the scorer settings on top of the config's own default ones)."""
    (scorer,) = [f for f in fields(config) if f.name == "scorer"]
    return config(
        **_given(config, args),
        pool=_pool(args),
        scorer=replace(scorer.default_factory(), **_given(ScorerSettings, args)),
    )


def _reported(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Bad settings (``ValueError``: flags, a mismatched output folder) or an output locked by
    another job -> message, exit 2; storage that keeps failing reads -> message, exit 1."""

    @functools.wraps(command)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (ValueError, OutputLocked) as err:
            print(f"acare {args.command}: error: {err}", file=sys.stderr)
            return 2
        except StorageError as err:
            print(f"acare {args.command}: error: {err}", file=sys.stderr)
            return 1

    return wrapper


@_reported
def rerank_command(args: argparse.Namespace) -> int:
    from acare_ray.offline.rerank import run

    print(run(_config(RerankConfig, args)).describe())
    return 0


@_reported
def relabel_command(args: argparse.Namespace) -> int:
    from acare_ray.offline.relabel import run

    counts = run(_config(RelabelConfig, args))
    print(counts.describe())
    print("status counts:", json.dumps({k: v["rows"] for k, v in counts.per_key.items()}))
    return 0


@_reported
def eval_command(args: argparse.Namespace) -> int:
    from acare_ray.offline.evaluate import format_table, run

    report = run(_config(EvalConfig, args))
    print(format_table(report))
    print(f"report: {report['files']['markdown']} ({report['wall_s']:.1f} s)")
    return 0


@_reported
def fit_fusion_command(args: argparse.Namespace) -> int:
    from acare_ray.offline.fit_fusion import run

    safety = SafetyRule(folds=args.folds, confidence=args.confidence, seed=args.fold_seed)
    config = replace(_config(FitFusionConfig, args), safety=safety)
    result = run(config)
    fitted = result["fitted"]
    if config.rule == "safe":
        print(f"decision: {fitted['decision']} (stored {result['label']}): {fitted['reason']}")
    else:
        print(f"fitted fusion: {result['label']} ({config.measure} {fitted['value']:.4f})")
    for row in result["grid"]:
        line = f"  {row['fusion']:<24} {row[config.measure]:.4f}"
        if "gain" in row:
            line += f"  gain {row['gain']:+.4f} [{row['gain_low']:+.4f}, {row['gain_high']:+.4f}]"
        print(line)
    if "stored_in" in result:
        print(f"stored in {result['stored_in']}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    rerank = subparsers.add_parser("rerank", help="rerank searches in Parquet on Ray Data")
    _add_common(rerank)
    rerank.add_argument(
        "--mode", default=RerankConfig.mode, choices=["M0", "M1", "M2", "M3", "auto"]
    )
    rerank.add_argument(
        "--top-k", type=int, default=RerankConfig.top_k, help="keep the best k per search"
    )
    rerank.add_argument(
        "--fusion",
        default=RerankConfig.fusion,
        help="auto (the checkpoint's fitted setting, else none), none, rrf[:k=60,weight=0.5] "
        "or linear[:alpha=0.5]",
    )
    rerank.set_defaults(func=rerank_command)

    relabel = subparsers.add_parser("relabel", help="label searches into training groups")
    _add_common(relabel)
    relabel.add_argument(
        "--negatives", type=int, default=RelabelConfig.negatives, help="negatives per group"
    )
    relabel.add_argument("--instruction", default=None, help="labeler instruction")
    relabel.add_argument(
        "--gold-aware",
        action="store_true",
        help="positive = the labeler's best gold candidate (relevance > 0); negatives non-gold",
    )
    relabel.add_argument(
        "--negatives-from",
        default=RelabelConfig.negatives_from,
        choices=["bottom", "hard"],
        help="the labeler's lowest-ranked (paper) or highest-ranked non-positive candidates",
    )
    relabel.add_argument(
        "--keep-failed", action="store_true", help="also label failed trajectories' searches"
    )
    relabel.set_defaults(func=relabel_command)

    evaluate = subparsers.add_parser("eval", help="compare modes on labelled searches")
    _add_common(evaluate, output=False)
    evaluate.add_argument("--modes", type=_csv, default=EvalConfig.modes)
    evaluate.add_argument("--report-dir", required=True)
    evaluate.add_argument("--measures", type=_csv, default=EvalConfig.measures)
    evaluate.add_argument("--test", default=EvalConfig.test, choices=TESTS)
    evaluate.add_argument(
        "--resamples",
        dest="n_resamples",
        metavar="N",
        type=int,
        default=EvalConfig.n_resamples,
    )
    evaluate.add_argument("--seed", type=int, default=EvalConfig.seed)
    evaluate.add_argument(
        "--sessions",
        action="store_true",
        help="also replay each session (top unseen documents per search) and test by session",
    )
    evaluate.add_argument(
        "--session-depth", type=int, default=EvalConfig.session_depth, help="documents per search"
    )
    evaluate.add_argument("--group-by", default=None, help="also report per value of a column")
    evaluate.add_argument(
        "--fusion",
        action="append",
        default=None,
        help="add the fused systems <mode>+<fusion> (repeatable): auto (the checkpoint's fitted "
        "setting; the default), none, rrf[:k=60,weight=0.5] or linear[:alpha=0.5]",
    )
    evaluate.add_argument(
        "--no-first-stage",
        dest="first_stage",
        action="store_false",
        help="leave out the first_stage and agent_order systems",
    )
    evaluate.set_defaults(func=eval_command)

    fitting = subparsers.add_parser(
        "fit-fusion", help="fit a checkpoint's fusion weight on a training split and store it"
    )
    _add_common(fitting, output=False)
    fitting.add_argument("--work-dir", required=True, help="scoring output and fit.json")
    fitting.add_argument("--mode", default=FitFusionConfig.mode, choices=["M0", "M1", "M2", "M3"])
    fitting.add_argument(
        "--methods", type=_csv, default=FitFusionConfig.methods, help="rrf and/or linear"
    )
    fitting.add_argument("--k", type=float, default=FitFusionConfig.k, help="rrf k")
    fitting.add_argument("--measure", default=FitFusionConfig.measure, help="the objective")
    fitting.add_argument(
        "--rule",
        default=FitFusionConfig.rule,
        choices=RULES,
        help="safe: cross-validated, stores the first-stage order unless fusion is a sure gain "
        "(default); best: the grid's best point whatever its margin (experiments only)",
    )
    fitting.add_argument(
        "--folds", type=int, default=SafetyRule.folds, help="question-grouped folds (safe rule)"
    )
    fitting.add_argument(
        "--confidence",
        type=float,
        default=SafetyRule.confidence,
        help="one-sided confidence of the gain's lower bound that must be >= 0 (safe rule)",
    )
    fitting.add_argument(
        "--fold-seed", type=int, default=SafetyRule.seed, help="folds and bootstrap seed"
    )
    fitting.add_argument(
        "--no-write",
        dest="write",
        action="store_false",
        help="fit and report only; leave the checkpoint's acare.json as it is",
    )
    fitting.set_defaults(func=fit_fusion_command)
