"""Packing small searches: one ``score_many`` call of many small searches, per search vs packed.

The online batcher hands the scorer one ``score_many`` call per batch of requests; agent
requests often carry few candidates (5-20). Per search, the causal backend runs one prefix
pass and one or two candidate forwards for each search; packed (``pack_searches=True``),
consecutive searches share them: one prefix pass over the right-padded
prefixes, candidates of several searches in one forward (each attends to its own search's
prefix). Same model object, same inputs, rounds interleaved, fastest of ``--rounds`` per
method; scores must agree within 1e-4 (float32) / 0.05 x spread (bfloat16).

    .venv/bin/python -m benchmarks.bench_packing                       # CPU, ~5 min
    .venv/bin/python -m benchmarks.bench_packing --device cuda --dtype bfloat16 --layers 0

writes ``<out>/packing-<device>-<config>-<dtype>.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from acare_ray.scoring import Mode, Scorer
from benchmarks.bench_scorer import BenchConfig, build_model
from benchmarks.measure import measure
from benchmarks.report import environment, write_report
from benchmarks.workloads import fixed_workload

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="Qwen3-Reranker-0.6B")
    p.add_argument("--shrink", action="store_true", help="the test model's width")
    p.add_argument("--layers", type=int, default=4, help="0: all of the config's layers")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--candidates", type=int, nargs="+", default=[4, 16], help="per search")
    p.add_argument("--searches", type=int, default=8, help="searches per score_many call")
    p.add_argument("--modes", nargs="+", default=["M0", "M3"], choices=[m.value for m in Mode])
    p.add_argument("--prefix-tokens", type=int, default=600, help="M3 prefix")
    p.add_argument("--doc-tokens", type=int, default=100)
    p.add_argument("--max-batch-tokens", type=int, default=16384)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default=None)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = BenchConfig(
        config=args.config,
        layers=args.layers or None,
        device=args.device,
        dtype=args.dtype,
        shrink=args.shrink,
    )
    with tempfile.TemporaryDirectory(prefix="acare-pack-") as folder:
        path = build_model(cfg, Path(folder) / "model")
        options = {"device": device, "dtype": args.dtype, "max_batch_tokens": args.max_batch_tokens}
        scorers = {
            "per_search": Scorer.from_pretrained(str(path), pack_searches=False, **options),
            "packed": Scorer.from_pretrained(str(path), pack_searches=True, **options),
        }
    # Both scorers load the same weights; share one module so the comparison is on one object.
    scorers["packed"].backend.module = scorers["per_search"].backend.module
    encoder = scorers["packed"].backend.encoder
    rows = []
    for candidates in args.candidates:
        searches = fixed_workload(
            encoder, args.searches, candidates, args.prefix_tokens, args.doc_tokens, seed=0
        )
        items = [(s.context, s.documents) for s in searches]
        for mode in (Mode(m) for m in args.modes):
            for scorer in scorers.values():  # warm-up: allocator growth, kernel choice
                scorer.score_many(items[:2], mode)
            best, scores, padding = {}, {}, {}
            for _ in range(args.rounds):
                for name, scorer in scorers.items():
                    before = (scorer.stats.real_tokens, scorer.stats.computed_tokens)
                    out, m = measure(partial(scorer.score_many, items, mode), device)
                    real = scorer.stats.real_tokens - before[0]
                    computed = scorer.stats.computed_tokens - before[1]
                    if name not in best or m.cpu_seconds < best[name].cpu_seconds:
                        best[name] = m
                    scores[name] = np.concatenate(out)
                    padding[name] = real / computed
            pairs = args.searches * candidates
            spread = float(np.ptp(scores["per_search"]))
            row = {
                "candidates": candidates,
                "mode": mode.value,
                "pairs": pairs,
                "max_abs_diff": float(np.abs(scores["packed"] - scores["per_search"]).max()),
                "score_spread": spread,
            }
            for name, m in best.items():
                row[name] = {
                    "pairs_per_s": pairs / m.seconds,
                    "pairs_per_cpu_s": pairs / m.cpu_seconds,
                    "seconds": m.seconds,
                    "cpu_seconds": m.cpu_seconds,
                    "padding_efficiency": padding[name],
                    "peak_mb": m.peak_mb,
                }
            basis = "cpu_seconds" if device.type == "cpu" else "seconds"
            row["speedup"] = best["per_search"].__dict__[basis] / best["packed"].__dict__[basis]
            row["speedup_basis"] = basis
            rows.append(row)
            print(
                f"{candidates:>3} candidates {mode.value}: packed/per-search {row['speedup']:.2f}x "
                f"({basis}), max abs diff {row['max_abs_diff']:.1e}",
                flush=True,
            )
    return {
        "benchmark": "packing",
        "args": vars(args),
        "environment": environment(),
        "rows": rows,
    }


def markdown(report: dict) -> str:
    a = report["args"]
    lines = [
        f"# Packing small searches: {a['config']}{' (test width)' if a['shrink'] else ''}, "
        f"{a['layers'] or 'all'} layers, {a['dtype']} on {a['device']}",
        "",
        f"{a['searches']} searches per `score_many` call; M3 prefix {a['prefix_tokens']} tokens, "
        f"documents {a['doc_tokens']} tokens; fastest of {a['rounds']} rounds.",
        "",
        "| candidates | mode | per-search pairs/s | packed pairs/s | packed / per-search | basis "
        "| padding eff. per-search / packed | max abs diff |",
        "|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in report["rows"]:
        key = "pairs_per_cpu_s" if r["speedup_basis"] == "cpu_seconds" else "pairs_per_s"
        lines.append(
            f"| {r['candidates']} | {r['mode']} | {r['per_search'][key]:.2f} | "
            f"{r['packed'][key]:.2f} | {r['speedup']:.2f}x | {r['speedup_basis']} | "
            f"{r['per_search']['padding_efficiency']:.3f} / {r['packed']['padding_efficiency']:.3f}"
            f" | {r['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    report = run(args)
    tolerance = 1e-4 if args.dtype == "float32" else None
    for r in report["rows"]:
        limit = tolerance if tolerance is not None else 0.05 * r["score_spread"]
        if r["max_abs_diff"] > limit:
            raise SystemExit(f"packed scores differ by {r['max_abs_diff']:.2e} (> {limit:.2e})")
    out = Path(args.out)
    name = args.name or f"packing-{args.device}-{args.config}-{args.dtype}"
    write_report(report, out, name, markdown(report))
    print(f"wrote {out / name}.{{json,md}} ({time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
