"""``acare rerank``, ``acare relabel``, ``acare eval``: flags -> config -> ``run(config)``."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable

from acare_ray.metrics import DEFAULT_MEASURES
from acare_ray.offline.job import ActorPool, ScorerSettings
from acare_ray.offline.lock import OutputLocked
from acare_ray.offline.resume import StorageError


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
    pool.add_argument("--actors", default="1,2", help="actor pool size N or MIN,MAX")
    pool.add_argument("--gpus-per-actor", type=float, default=0.0)
    pool.add_argument("--cpus-per-actor", type=float, default=1.0)
    pool.add_argument("--batch-size", type=int, default=32, help="searches per actor call")
    pool.add_argument("--rows-per-file", type=int, default=2_000, help="least rows per part file")
    pool.add_argument(
        "--object-store-mb",
        type=int,
        default=None,
        help="cap on the object store the job's blocks hold (default: Ray Data's limit)",
    )
    pool.add_argument("--max-batch-tokens", type=int, default=None, help="scorer token budget")
    pool.add_argument("--ray-address", default=None, help="default: RAY_ADDRESS or a local Ray")


def _pool(args: argparse.Namespace) -> ActorPool:
    low, high = ActorPool.parse_sizes(args.actors)
    return ActorPool(
        min_size=low,
        max_size=high,
        gpus_per_actor=args.gpus_per_actor,
        cpus_per_actor=args.cpus_per_actor,
        batch_size=args.batch_size,
        rows_per_file=args.rows_per_file,
        object_store_mb=args.object_store_mb,
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
    from acare_ray.offline.rerank import RerankConfig, run

    config = RerankConfig(
        input=args.input,
        output=args.output,
        model=args.model,
        mode=args.mode,
        top_k=args.top_k,
        pool=_pool(args),
        scorer=ScorerSettings(max_batch_tokens=args.max_batch_tokens, revision=args.revision),
        ray_address=args.ray_address,
        fusion=args.fusion,
        retry_errors=args.retry_errors,
    )
    print(run(config).describe())
    return 0


@_reported
def relabel_command(args: argparse.Namespace) -> int:
    from acare_ray.offline.relabel import RelabelConfig, run
    from acare_ray.offline.score import LABELER_INSTRUCTION

    config = RelabelConfig(
        input=args.input,
        output=args.output,
        model=args.model,
        negatives=args.negatives,
        gold_aware=args.gold_aware,
        negatives_from=args.negatives_from,
        keep_failed=args.keep_failed,
        pool=_pool(args),
        scorer=ScorerSettings(
            max_batch_tokens=args.max_batch_tokens,
            instruction=args.instruction or LABELER_INSTRUCTION,
            revision=args.revision,
        ),
        ray_address=args.ray_address,
        retry_errors=args.retry_errors,
    )
    counts = run(config)
    print(counts.describe())
    print("status counts:", json.dumps({k: v["rows"] for k, v in counts.per_key.items()}))
    return 0


@_reported
def eval_command(args: argparse.Namespace) -> int:
    from acare_ray.offline.evaluate import EvalConfig, format_table, run

    config = EvalConfig(
        input=args.input,
        model=args.model,
        report_dir=args.report_dir,
        modes=_csv(args.modes),
        measures=_csv(args.measures),
        test=args.test,
        n_resamples=args.resamples,
        seed=args.seed,
        pool=_pool(args),
        scorer=ScorerSettings(max_batch_tokens=args.max_batch_tokens, revision=args.revision),
        ray_address=args.ray_address,
        sessions=args.sessions,
        session_depth=args.session_depth,
        group_by=args.group_by,
        fusion=tuple(args.fusion or ("auto",)),
        first_stage=args.first_stage,
    )
    report = run(config)
    print(format_table(report))
    print(f"report: {report['files']['markdown']} ({report['wall_s']:.1f} s)")
    return 0


@_reported
def fit_fusion_command(args: argparse.Namespace) -> int:
    from acare_ray.offline.fit_fusion import FitFusionConfig, run

    config = FitFusionConfig(
        input=args.input,
        model=args.model,
        work_dir=args.work_dir,
        mode=args.mode,
        methods=_csv(args.methods),
        k=args.k,
        measure=args.measure,
        write=args.write,
        pool=_pool(args),
        scorer=ScorerSettings(max_batch_tokens=args.max_batch_tokens),
        ray_address=args.ray_address,
    )
    result = run(config)
    best = next(r for r in result["grid"] if r["fusion"] == result["label"])
    print(f"fitted fusion: {result['label']} ({config.measure} {best[config.measure]:.4f})")
    for row in result["grid"]:
        print(f"  {row['fusion']:<24} {row[config.measure]:.4f}")
    if "stored_in" in result:
        print(f"stored in {result['stored_in']}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    rerank = subparsers.add_parser("rerank", help="rerank searches in Parquet on Ray Data")
    _add_common(rerank)
    rerank.add_argument("--mode", default="auto", choices=["M0", "M1", "M2", "M3", "auto"])
    rerank.add_argument("--top-k", type=int, default=None, help="keep the best k per search")
    rerank.add_argument(
        "--fusion",
        default="auto",
        help="auto (the checkpoint's fitted setting, else none), none, rrf[:k=60,weight=0.5] "
        "or linear[:alpha=0.5]",
    )
    rerank.set_defaults(func=rerank_command)

    relabel = subparsers.add_parser("relabel", help="label searches into training groups")
    _add_common(relabel)
    relabel.add_argument("--negatives", type=int, default=7, help="negatives per group")
    relabel.add_argument("--instruction", default=None, help="labeler instruction")
    relabel.add_argument(
        "--gold-aware",
        action="store_true",
        help="positive = the labeler's best gold candidate (relevance > 0); negatives non-gold",
    )
    relabel.add_argument(
        "--negatives-from",
        default="bottom",
        choices=["bottom", "hard"],
        help="the labeler's lowest-ranked (paper) or highest-ranked non-positive candidates",
    )
    relabel.add_argument(
        "--keep-failed", action="store_true", help="also label failed trajectories' searches"
    )
    relabel.set_defaults(func=relabel_command)

    evaluate = subparsers.add_parser("eval", help="compare modes on labelled searches")
    _add_common(evaluate, output=False)
    evaluate.add_argument("--modes", default="M0,M2,M3")
    evaluate.add_argument("--report-dir", required=True)
    evaluate.add_argument("--measures", default=",".join(DEFAULT_MEASURES))
    evaluate.add_argument("--test", default="randomization", choices=["randomization", "bootstrap"])
    evaluate.add_argument("--resamples", type=int, default=10_000)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument(
        "--sessions",
        action="store_true",
        help="also replay each session (top unseen documents per search) and test by session",
    )
    evaluate.add_argument("--session-depth", type=int, default=10, help="documents per search")
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
    fitting.add_argument("--mode", default="M3", choices=["M0", "M1", "M2", "M3"])
    fitting.add_argument("--methods", default="rrf,linear", help="rrf and/or linear")
    fitting.add_argument("--k", type=float, default=60.0, help="rrf k")
    fitting.add_argument("--measure", default="nDCG@10", help="the objective")
    fitting.add_argument(
        "--no-write",
        dest="write",
        action="store_false",
        help="fit and report only; leave the checkpoint's acare.json as it is",
    )
    fitting.set_defaults(func=fit_fusion_command)
