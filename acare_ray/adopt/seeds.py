"""``acare adopt --summarize-seeds 0,1,2``: one claim across training seeds.

A result holds only when it holds across seeds. This reads what each seed's stages wrote
(``<work_dir>/seed<N>/{fit,test,loop,report}.json``) and puts them side by side: per seed the
stored setting, the test's session-paired nDCG@10 of the stored (fused M3) system against the
first stage and against fused M0, the decision, and the agent loop's solved tasks and searches
per task against BM25; across seeds the mean, the spread (max - min), the standard deviation and
the worst seed. Then the verdict the adopt issue asks of the recipe:

- every seed's stored system at or above the first stage on test (session-paired mean);
- mean gain at least ``min_mean_gain`` (+0.02 nDCG@10);
- no seed significantly below the first stage (its 95% interval below 0 and Holm p < 0.05);
- mean fused M3 above mean fused M0;
- in the agent loop, mean over the seeds: the stored system solves at least as many tasks as
  BM25 with no more searches per task, or a seed stored the first-stage order (said).

Beside the verdict, not part of it: the reranker alone (unfused M3) per seed, on test against
the first stage and on the validation lists the fusion was fitted on, with its across-seed gain;
and the test searches banded by the first stage's own nDCG@10 (where a reranker can only lose,
where it can only gain), means over the seeds.

Writes ``<work_dir>/seeds.md`` and ``seeds.json``. Seeds whose test stage has not run are
listed as missing; the verdict needs them all.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acare_ray.adopt.report import validation_points

MIN_MEAN_GAIN = 0.02
ALPHA = 0.05


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _row(tests: list[dict[str, Any]], a: str, b: str) -> dict[str, Any] | None:
    return next((t for t in tests if t["a"] == a and t["b"] == b), None)


def seed_record(seed_dir: Path) -> dict[str, Any] | None:
    """One seed's figures from its stage files; None when its test stage has not run."""
    test = _read(seed_dir / "test.json")
    if test is None:
        return None
    stored = test["stored"]
    tests = test["tests"]
    vs_first = _row(tests, "first_stage", stored)
    if vs_first is None:
        raise ValueError(f"{seed_dir}/test.json has no first_stage vs {stored} test")
    vs_m0 = next((t for t in tests if t["a"].startswith("M0+") and t["b"] == stored), None)
    report = _read(seed_dir / "report.json") or {}
    fit = (_read(seed_dir / "fit.json") or {}).get("M3", {})
    record: dict[str, Any] = {
        "stored": stored,
        "fit_decision": (fit.get("fitted") or {}).get("decision"),
        "first_stage": vs_first["mean_a"],
        "fused_m3": vs_first["mean_b"],
        "gain": vs_first["diff"],
        "ci95": vs_first["ci95"],
        "p_holm": vs_first["p_holm"],
        "sessions": vs_first["sessions"],
        "fused_m0": vs_m0["mean_a"] if vs_m0 else None,
        "fused_m0_label": vs_m0["a"] if vs_m0 else None,
        "m3_over_m0": vs_m0["diff"] if vs_m0 else None,
        "m3_over_m0_p_holm": vs_m0["p_holm"] if vs_m0 else None,
        "decision": (report.get("overall") or {}).get("decision"),
    }
    alone = _row(tests, "first_stage", "M3")
    if alone is not None:
        record["unfused_m3"] = {
            "mean": alone["mean_b"],
            "gain": alone["diff"],
            "ci95": alone["ci95"],
            "p_holm": alone["p_holm"],
        }
    validation = validation_points(fit)
    if validation is not None:
        record["validation"] = validation
    bands = (test.get("by_first_stage") or {}).get("bands")
    if bands:
        record["bands"] = [_band(b, stored) for b in bands]
    loop = _read(seed_dir / "loop.json")
    if loop is not None:
        systems = loop["report"]["systems"]
        fused = [name for name in systems if name.startswith("M3")]
        if "bm25" in systems and fused:
            bm25, m3 = systems["bm25"], systems[fused[0]]
            record["loop"] = {
                "system": fused[0],
                "bm25_solved": bm25["solved"],
                "solved": m3["solved"],
                "tasks": m3["tasks"],
                "bm25_searches_per_task": bm25["searches_per_task"],
                "searches_per_task": m3["searches_per_task"],
            }
    return record


def _band(band: dict[str, Any], stored: str) -> dict[str, Any]:
    """One band of the test's first-stage banding, for the first stage, M3 alone and the
    stored system (means; lost/won against the first stage)."""
    out: dict[str, Any] = {"band": band["band"], "queries": band["queries"]}
    for key, system in (("first_stage", "first_stage"), ("m3", "M3"), ("stored", stored)):
        if system in band["mean"]:
            out[key] = band["mean"][system]
            if key != "first_stage":
                out[f"{key}_lost"], out[f"{key}_won"] = band["lost"][system], band["won"][system]
    return out


def _across_bands(records: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Per band, the seeds' mean of each figure and the worst seed's M3 alone; None unless
    every seed has the same bands over the same number of searches."""
    shapes = {tuple((b["band"], b["queries"]) for b in r.get("bands", ())) for r in records}
    if len(shapes) != 1 or not next(iter(shapes)):
        return None
    out = []
    for i, (label, queries) in enumerate(next(iter(shapes))):
        entry: dict[str, Any] = {"band": label, "queries": queries}
        for key in ("first_stage", "m3", "stored", "m3_lost", "m3_won", "stored_lost"):
            values = [r["bands"][i][key] for r in records if key in r["bands"][i]]
            if len(values) == len(records):
                entry[key] = statistics.fmean(values)
                if key == "m3":
                    entry["m3_worst"] = min(values)
        out.append(entry)
    return out


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "spread": max(values) - min(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "worst": min(values),
    }


def summarize_seeds(
    work: Path, seeds: Sequence[int], min_mean_gain: float = MIN_MEAN_GAIN
) -> dict[str, Any]:
    """The per-seed records, the across-seed statistics and the verdict (see the module
    docstring)."""
    records = {seed: seed_record(work / f"seed{seed}") for seed in seeds}
    done = {seed: r for seed, r in records.items() if r is not None}
    missing = [seed for seed, r in records.items() if r is None]
    out: dict[str, Any] = {"seeds": list(seeds), "missing": missing, "per_seed": done}
    if not done:
        out["verdict"] = {"holds": None, "reason": "no seed has finished its test stage"}
        return out
    gains = [r["gain"] for r in done.values()]
    across = {
        "gain": _spread(gains),
        "fused_m3": _spread([r["fused_m3"] for r in done.values()]),
        "first_stage": _spread([r["first_stage"] for r in done.values()]),
    }
    unfused = [r["unfused_m3"]["gain"] for r in done.values() if "unfused_m3" in r]
    if len(unfused) == len(done):
        across["unfused_gain"] = _spread(unfused)
    bands = _across_bands(list(done.values()))
    if bands is not None:
        across["bands"] = bands
    m0 = [r["fused_m0"] for r in done.values() if r["fused_m0"] is not None]
    if len(m0) == len(done):
        across["fused_m0"] = _spread(m0)
    worst_seed = min(done, key=lambda s: done[s]["gain"])
    loops = [r["loop"] for r in done.values() if "loop" in r]
    if len(loops) == len(done):
        across["loop"] = {
            "bm25_solved": statistics.fmean(x["bm25_solved"] for x in loops),
            "solved": statistics.fmean(x["solved"] for x in loops),
            "bm25_searches_per_task": statistics.fmean(x["bm25_searches_per_task"] for x in loops),
            "searches_per_task": statistics.fmean(x["searches_per_task"] for x in loops),
        }
    checks = {
        "every seed at or above the first stage": all(g >= 0 for g in gains),
        f"mean gain at least {min_mean_gain:+.2f}": across["gain"]["mean"] >= min_mean_gain,
        "no seed significantly below the first stage": not any(
            r["ci95"] and r["ci95"][1] < 0 and r["p_holm"] < ALPHA for r in done.values()
        ),
    }
    if "fused_m0" in across:
        checks["mean fused M3 above mean fused M0"] = (
            across["fused_m3"]["mean"] > across["fused_m0"]["mean"]
        )
    if "loop" in across:
        loop = across["loop"]
        passed = [r for r in done.values() if r["fit_decision"] == "pass-through"]
        checks["agent loop: solves as many tasks as BM25 with no more searches"] = bool(passed) or (
            loop["solved"] >= loop["bm25_solved"]
            and loop["searches_per_task"] <= loop["bm25_searches_per_task"]
        )
    failed = [name for name, ok in checks.items() if not ok]
    if missing:
        holds, reason = None, f"seeds {missing} have not finished their test stage"
    elif failed:
        holds, reason = False, "not met: " + "; ".join(failed)
    else:
        holds, reason = True, "every check holds across the seeds"
    out |= {
        "across": across,
        "worst_seed": worst_seed,
        "checks": checks,
        "verdict": {"holds": holds, "reason": reason},
    }
    return out


def _f(value: float | None, digits: int = 3, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def seeds_markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# acare adopt across seeds",
        "",
        "Test split, session-paired nDCG@10 (each seed's stored system, fused M3, against the "
        "first stage and against fused M0, Holm-corrected within the seed); agent loop on the "
        "loop tasks.",
        "",
        "| seed | stored | first stage | fused M3 | gain [95% CI] | Holm p | fused M0 | "
        "decision | loop solved (BM25) | searches/task (BM25) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, r in summary["per_seed"].items():
        low, high = r["ci95"] or (None, None)
        loop = r.get("loop")
        lines.append(
            f"| {seed} | {r['stored']} | {_f(r['first_stage'])} | {_f(r['fused_m3'])} | "
            f"{_f(r['gain'], sign=True)} [{_f(low, sign=True)}, {_f(high, sign=True)}] | "
            f"{r['p_holm']:.3g} | {_f(r['fused_m0'])} | {r['decision'] or '-'} | "
            + (
                f"{loop['solved']}/{loop['tasks']} ({loop['bm25_solved']}) | "
                f"{loop['searches_per_task']:.2f} ({loop['bm25_searches_per_task']:.2f}) |"
                if loop
                else "- | - |"
            )
        )
    if summary["missing"]:
        lines += ["", f"Missing (test stage not run): seeds {summary['missing']}."]
    across = summary.get("across")
    if across:
        gain = across["gain"]
        lines += [
            "",
            f"Across {len(summary['per_seed'])} seeds: gain mean {gain['mean']:+.3f}, spread "
            f"{gain['spread']:.3f}, sd {gain['sd']:.3f}, worst {gain['worst']:+.3f} (seed "
            f"{summary['worst_seed']}); fused M3 mean {across['fused_m3']['mean']:.3f}"
            + (f", fused M0 mean {across['fused_m0']['mean']:.3f}" if "fused_m0" in across else "")
            + f", first stage {across['first_stage']['mean']:.3f}.",
        ]
        if "loop" in across:
            loop = across["loop"]
            lines.append(
                f"Agent loop, mean over seeds: solved {loop['solved']:.1f} vs BM25 "
                f"{loop['bm25_solved']:.1f}; searches per task {loop['searches_per_task']:.2f} "
                f"vs {loop['bm25_searches_per_task']:.2f}."
            )
        lines += _unfused_lines(summary)
        lines += _band_lines(across.get("bands"), len(summary["per_seed"]))
        lines += ["", "| check | holds |", "|---|---|"]
        lines += [f"| {name} | {'yes' if ok else 'no'} |" for name, ok in summary["checks"].items()]
    verdict = summary["verdict"]
    word = {True: "holds", False: "does not hold", None: "undecided"}[verdict["holds"]]
    lines += ["", f"**Verdict: the claim {word}** ({verdict['reason']})."]
    return "\n".join(lines) + "\n"


def _unfused_lines(summary: dict[str, Any]) -> list[str]:
    """The reranker alone (unfused M3) per seed: on test against the first stage, and on the
    validation lists the fusion was fitted on; then its across-seed gain. Reported beside the
    verdict (which judges the stored system), not part of it."""
    rows = [(seed, r) for seed, r in summary["per_seed"].items() if "unfused_m3" in r]
    if not rows:
        return []
    lines = [
        "",
        "The reranker alone (unfused M3), beside the verdict, not part of it: on test against "
        "the first stage (session means, paired, Holm within the seed) and on the validation "
        "lists the fusion was fitted on (search means, the fit's grid: `linear:alpha=0` and "
        "`alpha=1`).",
        "",
        "| seed | test: first stage | M3 alone | gain [95% CI] | Holm p | validation: first "
        "stage | M3 alone | gain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed, r in rows:
        u, v = r["unfused_m3"], r.get("validation") or {}
        low, high = u["ci95"] or (None, None)
        first, alone = v.get("first_stage"), v.get("alone")
        lines.append(
            f"| {seed} | {_f(r['first_stage'])} | {_f(u['mean'])} | {_f(u['gain'], sign=True)} "
            f"[{_f(low, sign=True)}, {_f(high, sign=True)}] | {u['p_holm']:.3g} | {_f(first)} | "
            f"{_f(alone)} | "
            + (_f(alone - first, sign=True) if first is not None and alone is not None else "-")
            + " |"
        )
    gain = (summary.get("across") or {}).get("unfused_gain")
    if gain:
        lines += [
            "",
            f"Unfused M3 across {len(rows)} seeds: gain mean {gain['mean']:+.3f}, spread "
            f"{gain['spread']:.3f}, worst {gain['worst']:+.3f}.",
        ]
    return lines


def _band_lines(bands: list[dict[str, Any]] | None, seeds: int) -> list[str]:
    """Where the reranker gains and loses on test: searches banded by the first stage's own
    nDCG@10, means over the seeds."""
    if not bands:
        return []
    lines = [
        "",
        f"Where it gains and loses (test searches banded by the first stage's own nDCG@10; "
        f"nDCG@10 means over the {seeds} seeds; lost/won: searches below / above the first "
        "stage, mean over seeds):",
        "",
        "| first-stage band | searches | first stage | M3 alone | M3 alone, worst seed | "
        "M3 lost/won | stored | stored lost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in bands:
        if not b["queries"]:
            lines.append(f"| {b['band']} | 0 | - | - | - | - | - | - |")
            continue
        lost_won = (
            f"{b['m3_lost']:.1f}/{b['m3_won']:.1f}" if "m3_lost" in b and "m3_won" in b else "-"
        )
        stored_lost = f"{b['stored_lost']:.1f}" if "stored_lost" in b else "-"
        lines.append(
            f"| {b['band']} | {b['queries']} | {_f(b.get('first_stage'))} | {_f(b.get('m3'))} | "
            f"{_f(b.get('m3_worst'))} | {lost_won} | {_f(b.get('stored'))} | {stored_lost} |"
        )
    return lines


def write_summary(work: Path, seeds: Sequence[int]) -> dict[str, Any]:
    """:func:`summarize_seeds`, written to ``<work>/seeds.json`` and ``seeds.md``."""
    summary = summarize_seeds(work, seeds)
    (work / "seeds.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (work / "seeds.md").write_text(seeds_markdown(summary))
    summary["files"] = {"json": str(work / "seeds.json"), "markdown": str(work / "seeds.md")}
    return summary
