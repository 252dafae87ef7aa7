"""Training speed levers on CPU, checked before a long run: float32 vs bf16 autocast.

One MiniLM cross-encoder (the CPU backbone), real LCE groups (HotpotQA, M3 prompts, context
dropout as in training), the trainer's own collator and :func:`acare_ray.training.loop.train_step`
building blocks: the same micro-batches are timed forward + backward + optimizer step in float32
and under ``torch.autocast("cpu", bfloat16)``, rounds interleaved, median of ``--rounds``; the loss
of the first batch in both precisions is recorded so the cost in accuracy shows beside the gain.
Sequence packing is not a lever for the cross-encoder: its pairs are right-padded per
micro-batch to the longest pair, not to ``max_length``, and the padding share is reported.

    .venv/bin/python benchmarks/bench_train_levers.py        # ~3 min on 2 cores, run alone

writes ``benchmarks/results/train-levers-cpu-minilm.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from report import environment, write_report

from acare_ray.data.groups import searches_to_groups
from acare_ray.data.hotpotqa import hotpotqa_searches
from acare_ray.loss import lce_loss
from acare_ray.scoring import DEFAULT_MODEL, FieldDropout, Scorer
from acare_ray.training.collator import GroupCollator
from acare_ray.training.groups import parse_groups
from acare_ray.training.loop import build_optimizer, trainable_module

RESULTS = Path(__file__).resolve().parent / "results"


def step(module, optimizer, batch, bf16: bool) -> float:
    context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with context:
        scores = module(*batch.inputs())
    loss = lce_loss(scores, group_size=8, temperature=0.5)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    table = searches_to_groups(hotpotqa_searches(), negatives=7, seed=0, hard=3)
    groups = parse_groups(table, 8)[: args.groups_per_batch * args.rounds]
    scorer = Scorer.from_pretrained(DEFAULT_MODEL, max_length=args.max_length)
    collator = GroupCollator(scorer.backend, 8, FieldDropout(0.5, 0.5, 0))
    batches = [
        collator(groups[i : i + args.groups_per_batch], 0)
        for i in range(0, len(groups), args.groups_per_batch)
    ]
    lengths = torch.cat([b.lengths for b in batches]).float()
    padded = sum(b.ids.numel() for b in batches)
    module = trainable_module(scorer)
    module.train()
    optimizer = build_optimizer(module, 1e-6, 0.0)
    first = {
        precision: step(module, optimizer, batches[0], precision == "bf16")
        for precision in ("fp32", "bf16")
    }  # also warms both paths up
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for batch in batches:
        for precision in ("fp32", "bf16"):
            started = time.perf_counter()
            step(module, optimizer, batch, precision == "bf16")
            times[precision].append(time.perf_counter() - started)
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "environment": environment(),
        "settings": vars(args),
        "pairs_per_batch": args.groups_per_batch * 8,
        "mean_pair_tokens": float(lengths.mean()),
        "padding_share": 1 - float(lengths.sum()) / padded,
        "seconds_per_step": median,
        "bf16_speedup": median["fp32"] / median["bf16"],
        "first_batch_loss": first,
    }
    md = [
        "# Training speed levers, CPU, MiniLM",
        "",
        f"{result['pairs_per_batch']} pairs a micro-batch (HotpotQA groups, M3 prompts with "
        f"dropout), max_length {args.max_length}, {args.threads} threads, median of "
        f"{len(batches)} interleaved steps.",
        "",
        "| precision | s / step | first-batch loss |",
        "|---|---|---|",
        *(f"| {k} | {median[k]:.3f} | {first[k]:.4f} |" for k in ("fp32", "bf16")),
        "",
        f"bf16 autocast speed-up: x{result['bf16_speedup']:.2f}. Mean pair length "
        f"{result['mean_pair_tokens']:.0f} tokens; padding share "
        f"{result['padding_share']:.1%} (pairs are padded to the longest of their micro-batch).",
        "",
    ]
    write_report(result, Path(args.out), "train-levers-cpu-minilm", "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
