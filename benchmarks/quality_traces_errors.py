"""Error analysis of the real-agent quality run: where a context mode loses to M0, and why.

Reads what ``quality_traces.py`` wrote (the test searches and each recipe's rankings; nothing
is scored again). For each recipe and mode M1-M3, the searches whose nDCG@10 is lower than in
M0 are classified by the mode's top-1 document (not gold in the mode, gold in M0):

- ``question_entity``: its page title appears in the original question (the context pulled up
  a page the question names, which is not a gold supporting page);
- ``reasoning_entity``: its title appears in the agent's reasoning but not in the question;
- ``sub_query_match``: its title appears in the sub-query only;
- ``other``: none of these.

Also how often each mode wins, ties and loses against M0, by agent, and a few examples.

    .venv/bin/python -m benchmarks.quality_traces_errors

writes ``benchmarks/results/quality-traces-errors.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from acare_ray.data.io import read_parquet
from acare_ray.data.traces import page_key
from acare_ray.eval.ir_metrics import evaluate, rank_docs
from acare_ray.offline.evaluate import load_runs
from benchmarks.report import write_report

ROOT = Path(__file__).resolve().parents[1]
MODES = ("M0", "M1", "M2", "M3")


def _mentions(text: str | None, title_key: str) -> bool:
    return bool(text) and bool(title_key) and f" {title_key} " in f" {page_key(text)} "


def analyse(work: Path, recipe: str, n_examples: int) -> dict:
    rows = {r["search_id"]: r for r in read_parquet(work / "test.parquet").to_pylist()}
    runs, _ = load_runs(str(work / "eval" / recipe / "rerank"), MODES)
    qrels = {
        q: {c["doc_id"]: c["relevance"] for c in r["candidates"]}
        for q, r in rows.items()
        if any(c["relevance"] for c in r["candidates"])
    }
    per_query = {m: evaluate(qrels, runs[m], ("nDCG@10",)).per_query["nDCG@10"] for m in MODES}
    out = {}
    for mode in MODES[1:]:
        outcome, classes, by_agent, examples = Counter(), Counter(), Counter(), []
        for qid, base in per_query["M0"].items():
            value = per_query[mode][qid]
            kind = "win" if value > base + 1e-9 else "loss" if value < base - 1e-9 else "tie"
            outcome[kind] += 1
            if kind != "loss":
                continue
            row = rows[qid]
            by_agent[row["agent"]] += 1
            docs = {c["doc_id"]: c for c in row["candidates"]}
            top = docs[rank_docs(runs[mode][qid])[0]]
            top0 = docs[rank_docs(runs["M0"][qid])[0]]
            title = top["text"].split("\n", 1)[0]
            if top["relevance"]:
                label = "top1_gold_lower_ranks_worse"
            elif _mentions(row["question"], top["page"]):
                label = "question_entity"
            elif _mentions(row["reasoning"], top["page"]):
                label = "reasoning_entity"
            elif _mentions(row["sub_query"], top["page"]):
                label = "sub_query_match"
            else:
                label = "other"
            classes[label] += 1
            if len(examples) < n_examples and not top["relevance"] and top0["relevance"]:
                examples.append(
                    {
                        "search_id": qid,
                        "class": label,
                        "question": row["question"],
                        "sub_query": row["sub_query"],
                        "reasoning_end": (row["reasoning"] or "")[-240:],
                        "gold_pages": row["supporting_pages"],
                        "top1_M0": top0["text"].split("\n", 1)[0],
                        f"top1_{mode}": title,
                        "nDCG@10": {"M0": base, mode: value},
                    }
                )
        out[mode] = {
            "vs_M0": dict(outcome),
            "losses_by_agent": dict(by_agent),
            "loss_classes": dict(classes),
            "examples": examples,
        }
    return out


def markdown(result: dict) -> str:
    lines = [
        "| recipe | mode | wins / ties / losses vs M0 | losses: top-1 named in question | "
        "in reasoning | in sub-query | other | top-1 gold, rest worse |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for recipe, by_mode in result["recipes"].items():
        for mode, r in by_mode.items():
            o, c = r["vs_M0"], r["loss_classes"]
            lines.append(
                f"| {recipe} | {mode} | {o.get('win', 0)} / {o.get('tie', 0)} / "
                f"{o.get('loss', 0)} | {c.get('question_entity', 0)} | "
                f"{c.get('reasoning_entity', 0)} | {c.get('sub_query_match', 0)} | "
                f"{c.get('other', 0)} | {c.get('top1_gold_lower_ranks_worse', 0)} |"
            )
    for recipe, by_mode in result["recipes"].items():
        for mode, r in by_mode.items():
            for e in r["examples"][:3]:
                lines += [
                    "",
                    f"- **{recipe} {mode}**, `{e['search_id']}` ({e['class']}): question "
                    f'"{e["question"]}"; sub-query "{e["sub_query"]}"; gold pages '
                    f'{e["gold_pages"]}; M0 top-1 "{e["top1_M0"]}" (gold), {mode} top-1 '
                    f'"{e[f"top1_{mode}"]}"; reasoning ends "...{e["reasoning_end"][-160:]}"',
                ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "quality_traces"))
    parser.add_argument("--recipes", default="transfer,bottom7,hard7")
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default="quality-traces-errors")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    recipes = [r for r in args.recipes.split(",") if (work / "eval" / r / "rerank").is_dir()]
    result = {"recipes": {r: analyse(work, r, args.examples) for r in recipes}}
    write_report(result, Path(args.out), args.name, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
