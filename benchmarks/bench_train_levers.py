"""Training levers on CPU, each judged by validation nDCG@10 reached in the same training budget.

Every lever is a short run of the recipe (``acare adopt``'s training config for
``adopt_configs/r1-searcher-hotpotqa.yaml``: its groups, data mixing, batch of 8 groups in
micro-batches of 2, bf16 autocast, lr 1e-4) with one setting changed, trained for the same
``--budget-s`` seconds of training time (collating, forward, backward, optimizer step; compile
time included), the learning rate warmed up over the first 10% of the budget and decayed to 0 at
its end, so each lever gets a whole schedule in the time it has. The validation of the recipe
(nDCG@10 in M3 on its fixed validation groups) is taken at half the budget and at
its end, outside the budget. The runs go one after another in one process through the
product's own training blocks (:func:`acare_ray.training.plan.step_groups`, the
:class:`GroupCollator`, :func:`train_step`, :func:`validate`): one process with ``--threads``
torch threads stands in for the recipe's two one-thread DDP workers.

The levers: ``chunk`` (``chunk_tokens``: pairs run sorted by length in chunks, same scores, less
padding), ``freeze-emb`` / ``freeze-emb-2`` (embeddings, and the two lowest layers, frozen),
``len256`` (``max_length`` 256 instead of 320), ``group5`` (1 positive + 3 hard + 1 random
negative instead of + 4 random), ``compile`` (``torch.compile`` of the module, dynamic shapes).
A separate timing gives the validation's own cost (the recipe's M0 + M3 on 240 groups, M3 only,
M3 on 120). One seed: a short run's figure moves with the seed, so a lever's gain is read with
the spread of the baseline's checkpoints in mind, and what is kept is confirmed in the recipe.

    .venv/bin/python -m benchmarks.bench_train_levers    # ~55 min on 2 cores, run alone

writes ``benchmarks/results/train-levers-cpu-minilm.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from acare_ray.adopt.config import AdoptConfig
from acare_ray.adopt.stages import done, run_stages, train_config
from acare_ray.scoring import FieldDropout, Scorer
from acare_ray.scoring.cross_encoder import length_chunks
from acare_ray.training.collator import GroupCollator
from acare_ray.training.config import TrainConfig
from acare_ray.training.loop import (
    build_optimizer,
    freeze_lowest,
    train_step,
    trainable_module,
    use_cpu_bf16,
)
from acare_ray.training.plan import load_splits, step_groups
from acare_ray.training.validation import metric_key, validate
from benchmarks.report import commands_block, environment, write_report

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "adopt_configs" / "r1-searcher-hotpotqa.yaml"
KEY = metric_key("M3")


@dataclass(frozen=True)
class Lever:
    name: str
    what: str
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields over the recipe's
    scorer: dict[str, Any] = field(default_factory=dict)
    compile: bool = False


LEVERS = {
    lever.name: lever
    for lever in (
        Lever("baseline", "the recipe as committed"),
        Lever("chunk", "chunk_tokens 1024", {"chunk_tokens": 1024}),
        Lever("freeze-emb", "embeddings frozen", {"freeze_embeddings": True}),
        Lever(
            "freeze-emb-2",
            "embeddings + 2 lowest layers frozen",
            {"freeze_embeddings": True, "freeze_layers": 2},
        ),
        Lever("len256", "max_length 256", scorer={"max_length": 256}),
        Lever("group5", "groups of 5 (3 hard + 1 random negative)", {"group_size": 5}),
        Lever("compile", "torch.compile (dynamic)", compile=True),
        Lever(
            "chunk+freeze-emb",
            "chunk_tokens 1024 + embeddings frozen",
            {"chunk_tokens": 1024, "freeze_embeddings": True},
        ),
    )
}


DEFAULT_LEVERS = [name for name in LEVERS if "+" not in name]  # combinations on request


class _NoSchedule:
    """``train_step`` steps a scheduler; here the learning rate is set from the clock."""

    def step(self) -> None:
        pass


def lr_factor(used: float, warmup: float = 0.1) -> float:
    """Linear warm-up over the first ``warmup`` of the budget, then linear to 0 at its end."""
    if used < warmup:
        return max(used / warmup, 0.02)
    return max(0.0, (1 - used) / (1 - warmup))


def recipe_config(config_file: Path, work_dir: str | None) -> TrainConfig:
    """The recipe's TrainConfig as ``acare adopt`` builds it, its data stage run if missing;
    one in-process worker takes the batch in the recipe's micro-batches."""
    adopt = AdoptConfig.read(config_file)
    work = Path(work_dir or adopt.work_dir)
    adopt = replace(adopt, seed=0, work_dir=str(work if work.is_absolute() else REPO / work))
    if done(adopt, "data") is None:
        run_stages(adopt, ("data",))
    recipe = train_config(adopt)
    per_step = recipe.global_batch_groups
    return replace(recipe, workers=1, grad_accum=per_step // recipe.batch_groups)


def padded_tokens(lengths: torch.Tensor, chunk_tokens: int | None) -> int:
    """Tokens a micro-batch of pair ``lengths`` runs (padding included)."""
    if chunk_tokens is None:
        return int(lengths.max()) * len(lengths)
    ordered = sorted(lengths.tolist(), reverse=True)
    return sum((c.stop - c.start) * ordered[c.start] for c in length_chunks(ordered, chunk_tokens))


def run_lever(
    lever: Lever, recipe: TrainConfig, budget_s: float, threads: int, val_groups: int
) -> dict[str, Any]:
    config = replace(recipe, scorer={**vars(recipe.scorer), **lever.scorer}, **lever.train)
    config = replace(config, val_max_groups=val_groups)
    torch.manual_seed(config.seed)
    train, val, sizes = load_splits(replace(config, group_size=recipe.group_size))
    scorer = Scorer.from_settings(config.model, config.scorer, dtype=torch.float32)
    frozen = freeze_lowest(scorer.backend.hf_model, config.freeze_embeddings, config.freeze_layers)
    module = trainable_module(scorer, config.chunk_tokens)
    module.train()
    model = torch.compile(module, dynamic=True) if lever.compile else module
    optimizer = build_optimizer(module, config.lr, config.weight_decay)
    collator = GroupCollator(
        scorer.backend, config.group_size, FieldDropout(config.p_question, config.p_reasoning, 0)
    )
    device = torch.device("cpu")
    checkpoints = [budget_s / 2, budget_s]
    curve, step_s, real, padded = [], [], 0, 0
    used = cpu_used = 0.0
    step = 0
    while used < budget_s:
        torch.manual_seed(step)
        for group in optimizer.param_groups:
            group["lr"] = config.lr * lr_factor(used / budget_s, config.warmup_ratio)
        started, cpu_started = time.perf_counter(), time.process_time()
        batches = [
            collator([train[i] for i in part], 0) for part in step_groups(sizes, config, step, 0)
        ]
        train_step(
            model,
            batches,
            optimizer,
            _NoSchedule(),
            group_size=config.group_size,
            temperature=config.temperature,
            max_grad_norm=config.max_grad_norm,
            device=device,
            cpu_bf16=use_cpu_bf16(config.cpu_bf16),
        )
        seconds = time.perf_counter() - started
        used += seconds
        cpu_used += time.process_time() - cpu_started
        step_s.append(seconds)
        for batch in batches:
            real += int(batch.lengths.sum())
            padded += padded_tokens(batch.lengths, config.chunk_tokens)
        step += 1
        while checkpoints and used >= checkpoints[0]:
            checkpoints.pop(0)
            curve.append({"train_s": used, "step": step, KEY: _validate(scorer, module, val)})
            print(f"[{lever.name}] {curve[-1]}", flush=True)
    return {
        "lever": lever.name,
        "what": lever.what,
        "steps": step,
        "train_s": used,
        "cpu_s": cpu_used,
        "first_step_s": step_s[0],
        "median_step_s": statistics.median(step_s[1:] or step_s),
        "pairs": step * config.global_batch_groups * config.group_size,
        "padding_share": 1 - real / max(padded, 1),
        "frozen_parameters": frozen,
        "curve": curve,
        "final": curve[-1][KEY],
        "threads": threads,
    }


def _validate(scorer: Scorer, module: torch.nn.Module, val: list) -> float:
    module.eval()
    try:
        return validate(scorer, val, ("M3",), 0, 1, 0.5)[KEY]
    finally:
        module.train()


def validation_cost(recipe: TrainConfig) -> dict[str, Any]:
    """Seconds the recipe's validation takes (M0 + M3 on its groups) against lighter forms."""
    _, val, _ = load_splits(recipe)
    scorer = Scorer.from_settings(recipe.model, recipe.scorer, dtype=torch.float32)
    out = {}
    for name, groups, modes in (
        ("recipe (M0 + M3)", val, ("M0", "M3")),
        ("M3 only", val, ("M3",)),
        ("M3 on half the groups", val[: len(val) // 2], ("M3",)),
    ):
        started = time.perf_counter()
        metrics = validate(scorer, groups, modes, 0, 1, 0.5)
        out[name] = {
            "groups": len(groups),
            "seconds": time.perf_counter() - started,
            KEY: metrics[KEY],
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    base = runs[0]
    budget = result["settings"]["budget_s"]
    lines = [
        "# Training levers, CPU, MiniLM: validation nDCG@10 in equal budgets",
        "",
        f"Each lever: the recipe with one setting changed, {budget:.0f} s of training on "
        f"{result['settings']['threads']} threads (one process, alone), learning rate warmed up "
        "and decayed over the budget; validation nDCG@10 (M3, the recipe's "
        f"{result['validation_groups']} fixed validation groups) at half the budget and at "
        f"its end. Untrained: {result['untrained'][KEY]:.3f}. One seed.",
        "",
        "| lever | s / step (median) | x baseline | steps | padding | nDCG@10 at half, end "
        "| end vs baseline | gain per CPU-minute |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    untrained = result["untrained"][KEY]
    for run in runs:
        curve = ", ".join(f"{c[KEY]:.3f}" for c in run["curve"])
        speed = base["median_step_s"] / run["median_step_s"]
        gain = (run["final"] - untrained) / (run["cpu_s"] / 60)
        lines.append(
            f"| {run['lever']} ({run['what']}) | {run['median_step_s']:.2f} | {speed:.2f} | "
            f"{run['steps']} | {run['padding_share']:.0%} | {curve} | "
            f"{run['final'] - base['final']:+.3f} | {gain:+.4f} |"
        )
    lines += [
        "",
        "x baseline: steps per second against the baseline's (median step, the first excluded: "
        "it carries compilation). Gain per CPU-minute: (end nDCG@10 - untrained) / the run's "
        "process CPU minutes. Padding: share of the tokens run that are padding.",
    ]
    if result.get("validation_cost"):
        lines += [
            "",
            "## The validation's own cost",
            "",
            "| validation | groups | seconds | nDCG@10 M3 |",
            "|---|---:|---:|---:|",
        ]
        for name, row in result["validation_cost"].items():
            lines.append(f"| {name} | {row['groups']} | {row['seconds']:.1f} | {row[KEY]:.3f} |")
        every = result["checkpoint_every"]
        lines += [
            "",
            f"The recipe validates every {every} steps: {every} baseline steps take "
            f"{every * base['median_step_s']:.0f} s.",
        ]
    lines += commands_block([".venv/bin/python -m benchmarks.bench_train_levers"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(CONFIG), help="the adopt config of the recipe")
    parser.add_argument("--work-dir", default=None, help="overrides the config's work_dir")
    parser.add_argument("--budget-s", type=float, default=300.0, help="training seconds a lever")
    parser.add_argument(
        "--levers",
        default=",".join(DEFAULT_LEVERS),
        help=f"comma-separated, in order, of {list(LEVERS)}",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--val-groups", type=int, default=240)
    parser.add_argument("--no-validation-cost", action="store_true")
    parser.add_argument("--label", default="train-levers-cpu-minilm")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.levers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(LEVERS))
    if unknown or not names or names[0] != "baseline":
        parser.error(f"--levers: start with baseline, known {list(LEVERS)}; unknown {unknown}")
    torch.set_num_threads(args.threads)
    recipe = replace(
        recipe_config(Path(args.config), args.work_dir), val_max_groups=args.val_groups
    )

    _, val, _ = load_splits(recipe)
    scorer = Scorer.from_settings(recipe.model, recipe.scorer, dtype=torch.float32)
    untrained = {KEY: validate(scorer, val, ("M3",), 0, 1, 0.5)[KEY]}
    del scorer
    runs = []
    for name in names:
        runs.append(run_lever(LEVERS[name], recipe, args.budget_s, args.threads, args.val_groups))
        print(
            f"[{name}] done: {runs[-1]['steps']} steps, final {runs[-1]['final']:.3f}", flush=True
        )
    result = {
        "environment": environment(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work_dir")},
        "validation_groups": len(val),
        "checkpoint_every": recipe.checkpoint_every,
        "untrained": untrained,
        "runs": runs,
        "validation_cost": None if args.no_validation_cost else validation_cost(recipe),
        "spread_of_final": float(np.ptp([r["final"] for r in runs])),
    }
    write_report(result, Path(args.out), args.label, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
