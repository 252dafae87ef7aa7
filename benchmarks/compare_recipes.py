"""Two ``acare adopt`` recipes on the same test questions, seed by seed and session-paired: did
the head recipe (e.g. a self-mining round) move the reranker alone (M3) and the stored fused
list over the base recipe's, and where does each stand against the first stage?

    .venv/bin/python -m benchmarks.compare_recipes \\
        --base adopt_configs/r1-searcher-hotpotqa.yaml \\
        --head adopt_configs/r1-searcher-hotpotqa-mined.yaml --seeds 0,1,2 \\
        --name adopt-mined-vs-full-pass

reads each seed's ``test/report.json`` of both runs (a seed that either has not tested is
listed as missing), and writes ``benchmarks/results/<name>.{md,json}``. Both runs must share
the split: the first-stage (BM25 order) session means must agree, or the script stops.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESAMPLES = 10_000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base recipe's adopt config")
    parser.add_argument("--head", required=True, help="the recipe compared with it")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--name", default="adopt-recipes")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    return parser


def _paired(a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    from acare_ray.eval.ir_metrics import paired_bootstrap_test, paired_randomization_test

    common = sorted(set(a) & set(b))
    va, vb = {s: a[s] for s in common}, {s: b[s] for s in common}
    test = paired_randomization_test(va, vb, RESAMPLES, 0)
    boot = paired_bootstrap_test(va, vb, RESAMPLES, 0, 0.95)
    return {
        "sessions": len(common),
        "a": test.mean_a,
        "b": test.mean_b,
        "diff": test.mean_b - test.mean_a,
        "ci95": list(boot.ci) if boot.ci else None,
        "p": test.p_value,
    }


def compare_seed(base_dir: Path, head_dir: Path, session_of: dict[str, str]) -> dict[str, Any]:
    """One seed: per system (first stage, M3, the stored fused list) each run's session means,
    head vs base paired (Holm over the two reranker claims), each run vs the first stage."""
    from acare_ray.adopt.claims import report_session_means
    from acare_ray.eval.ir_metrics import holm_bonferroni

    runs = {}
    for side, folder in (("base", base_dir), ("head", head_dir)):
        report = json.loads((folder / "test" / "report.json").read_text())
        stored = json.loads((folder / "test.json").read_text())["stored"]
        runs[side] = {
            "stored": stored,
            "means": {
                name: report_session_means(report, system, session_of)
                for name, system in (
                    ("first_stage", "first_stage"),
                    ("M3", "M3"),
                    ("fused", stored),
                )
            },  # fmt: skip
        }
    first = runs["base"]["means"]["first_stage"]
    if not all(np.isclose(first[s], runs["head"]["means"]["first_stage"][s]) for s in first):
        raise ValueError("the two runs' first-stage session means differ: not the same split")
    out: dict[str, Any] = {"stored": {k: v["stored"] for k, v in runs.items()}, "rows": {}}
    for system in ("M3", "fused"):
        out["rows"][system] = {
            "head_vs_base": _paired(runs["base"]["means"][system], runs["head"]["means"][system]),
            "base_vs_first_stage": _paired(first, runs["base"]["means"][system]),
            "head_vs_first_stage": _paired(first, runs["head"]["means"][system]),
        }
    claims = [out["rows"][s]["head_vs_base"] for s in ("M3", "fused")]
    for row, adjusted in zip(claims, holm_bonferroni([c["p"] for c in claims]), strict=True):
        row["p_holm"] = adjusted
    return out


def markdown(report: dict[str, Any]) -> str:
    def cell(row: dict[str, Any], holm: bool = False) -> str:
        low, high = row["ci95"] or (float("nan"), float("nan"))
        p = row["p_holm"] if holm else row["p"]
        return f"{row['b']:.3f}: {row['diff']:+.3f} [{low:+.3f}, {high:+.3f}], p {p:.2g}"

    lines = [
        f"# {report['head']} vs {report['base']}",
        "",
        "Test questions, session-paired nDCG@10 (head vs base: Holm over M3 and fused within a "
        "seed).",
        "",
        "| seed | BM25 order | M3 base vs BM25 | M3 head vs BM25 | M3 head vs base | fused base "
        "vs BM25 | fused head vs BM25 | fused head vs base |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed, s in report["seeds"].items():
        m3, fused = s["rows"]["M3"], s["rows"]["fused"]
        lines.append(
            f"| {seed} | {m3['base_vs_first_stage']['a']:.3f} | {cell(m3['base_vs_first_stage'])} "
            f"| {cell(m3['head_vs_first_stage'])} | {cell(m3['head_vs_base'], True)} "
            f"| {cell(fused['base_vs_first_stage'])} | {cell(fused['head_vs_first_stage'])} "
            f"| {cell(fused['head_vs_base'], True)} |"
        )
    for name, values in report["across"].items():
        lines.append(
            f"\n{name} over {values['seeds']} seed(s): mean {values['mean']:+.3f}, spread "
            f"{values['spread']:.3f}, worst {values['worst']:+.3f}."
        )
    if report["missing"]:
        lines.append(f"\nNot yet tested in both runs: seed(s) {report['missing']}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from acare_ray.adopt.config import AdoptConfig
    from acare_ray.adopt.stages import primary_part, sessions_of
    from benchmarks.report import dump_json

    args = build_parser().parse_args(argv)
    base, head = AdoptConfig.read(args.base), AdoptConfig.read(args.head)
    session_of, _ = sessions_of(primary_part(base, "test"))
    report: dict[str, Any] = {"base": args.base, "head": args.head, "seeds": {}, "missing": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        folders = [c.work / f"seed{seed}" for c in (base, head)]
        if not all((f / "test" / "report.json").exists() for f in folders):
            report["missing"].append(seed)
            continue
        report["seeds"][str(seed)] = compare_seed(*folders, session_of)
    across = {
        "M3 unfused, head minus BM25": [
            s["rows"]["M3"]["head_vs_first_stage"]["diff"] for s in report["seeds"].values()
        ],
        "M3 unfused, head minus base": [
            s["rows"]["M3"]["head_vs_base"]["diff"] for s in report["seeds"].values()
        ],
        "fused, head minus BM25": [
            s["rows"]["fused"]["head_vs_first_stage"]["diff"] for s in report["seeds"].values()
        ],
    }  # fmt: skip
    report["across"] = {
        name: {"seeds": len(v), "mean": float(np.mean(v)), "spread": float(np.ptp(v)),
               "worst": float(np.min(v))}
        for name, v in across.items() if v
    }  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_json(report, out / f"{args.name}.json")
    (out / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
