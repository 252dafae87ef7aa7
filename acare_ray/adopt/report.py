"""The decision report of ``acare adopt``: switch or not, overall and per agent, with the
numbers behind it (``<work_dir>/report.md``, ``report.json`` and ``report.png``).

The decision for a set of test sessions (all, or one agent's) reads two things: what the
safety rule stored (a fused setting, or the first-stage order), and the stored system's
session-paired nDCG@10 difference to the first stage on the test questions (never seen by
training or the fusion fit):

- **switch**: a fused setting is stored and its test gain's 95% interval is above 0;
- **no clear gain**: a fused setting is stored and its test gain is >= 0 but its interval
  reaches 0 or below: serving it is not worse on this test, but not shown better;
- **do not switch**: the safety rule stored the first-stage order (the checkpoint then serves
  the agent's list as it arrived), or the stored system is below the first stage on test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acare_ray.adopt.config import AdoptConfig
from acare_ray.data.dense import PREFIX as DENSE_PREFIX
from acare_ray.eval.bands import bands_markdown


def decide(fitted: dict[str, Any], row: dict[str, Any]) -> tuple[str, str]:
    """``(decision, reason)`` from the M3 fit's summary and the test row (first stage vs
    stored system)."""
    low, high = row["ci95"] or (float("nan"), float("nan"))
    numbers = (
        f"test nDCG@10 {row['mean_b']:.3f} vs first stage {row['mean_a']:.3f} "
        f"({row['diff']:+.3f} [{low:+.3f}, {high:+.3f}], {row['sessions']} sessions, "
        f"Holm p {row['p_holm']:.3g})"
    )
    if fitted.get("decision") == "pass-through":
        return "do not switch", f"the safety rule stored the first-stage order: {fitted['reason']}"
    if low > 0:
        return "switch", f"fused M3 beats the first stage: {numbers}"
    if row["diff"] >= 0:
        return "no clear gain", f"fused M3 is not worse but not shown better: {numbers}"
    return "do not switch", f"fused M3 is below the first stage on test: {numbers}"


def zero_training(baseline: dict[str, Any]) -> str:
    """One sentence on the untrained base reranker against the first stage: the cheap win (its
    best mode significantly above), noise (no mode distinguishable) or worse."""
    rows = [t for t in baseline["tests"] if t["a"] == "first_stage"]
    best = max(rows, key=lambda t: t["diff"])
    low = (best["ci95"] or [float("nan")])[0]
    numbers = (
        f"best mode {best['b']} {best['mean_b']:.3f} vs first stage {best['mean_a']:.3f} "
        f"({best['diff']:+.3f}, Holm p {best['p_holm']:.3g})"
    )
    if best["diff"] > 0 and best["p_holm"] < 0.05 and low > 0:
        return f"the base reranker with the context appended beats the first stage untrained, {numbers}: the cheap win; training is optional"
    if all(t["diff"] < 0 and t["p_holm"] < 0.05 for t in rows):
        return f"the base reranker untrained is below the first stage in every mode, {numbers}: it needs training"
    return f"the base reranker untrained is not distinguishable from the first stage, {numbers}: no cheap win here"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def validation_points(fit: dict[str, Any]) -> dict[str, float | None] | None:
    """A fusion fit's own grid read at three points, on the validation lists it was fitted on:
    ``first_stage`` (``linear:alpha=0``, the first-stage order), ``alone`` (``linear:alpha=1``,
    the reranker on its own) and ``stored`` (the stored setting; the pass-through setting is a
    grid point too). None when the grid lacks either end."""
    measure = (fit.get("fitted") or {}).get("objective", "nDCG@10")
    points = {row["fusion"]: row.get(measure) for row in fit.get("grid") or ()}
    first, alone = points.get("linear:alpha=0"), points.get("linear:alpha=1")
    if first is None or alone is None:
        return None
    return {"first_stage": first, "alone": alone, "stored": points.get(fit.get("label"))}


def _alone_line(mode: str, fit: dict[str, Any]) -> str:
    """`` On these questions: first stage x, M3 alone y, stored z.``: the reranker on its own
    on the validation lists, where the test section shows it on the test lists."""
    points = validation_points(fit)
    if points is None:
        return ""
    first, alone = points["first_stage"], points["alone"]
    return (
        f" On these questions (nDCG@10): first stage {_fmt(first)}, {mode} alone {_fmt(alone)}"
        f" ({alone - first:+.3f}), stored `{fit['label']}` {_fmt(points['stored'])}."
    )


def _system_table(metrics: dict[str, Any], sessions: dict[str, Any] | None) -> list[str]:
    lines = [
        "| system | nDCG@10 [95% CI] | Recall@10 | session recall |",
        "|---|---|---|---|",
    ]
    for name, m in metrics.items():
        ndcg = m.get("nDCG@10") or {}
        ci = f" [{ndcg['ci_low']:.3f}, {ndcg['ci_high']:.3f}]" if "ci_low" in ndcg else ""
        recall = (m.get("Recall@10") or {}).get("mean")
        session = ((sessions or {}).get(name) or {}).get("session_recall") or {}
        lines.append(
            f"| {name} | {_fmt(ndcg.get('mean'))}{ci} | {_fmt(recall)} "
            f"| {_fmt(session.get('mean'))} |"
        )
    return lines


def _tests_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| a | b | sessions | mean a | mean b | b - a [95% CI] | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in rows:
        ci = t["ci95"] or [float("nan")] * 2
        lines.append(
            f"| {t['a']} | {t['b']} | {t['sessions']} | {t['mean_a']:.3f} | {t['mean_b']:.3f} "
            f"| {t['diff']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] | {t['p']:.4f} | {t['p_holm']:.4f} |"
        )
    return lines


def report_markdown(config: AdoptConfig, results: dict[str, Any], decisions: dict[str, Any]) -> str:
    data, train, fit, test = (results.get(k) for k in ("data", "train", "fit", "test"))
    overall = decisions["overall"]
    lines = [
        f"# acare adopt: {overall['decision']}",
        "",
        f"**{overall['decision']}**: {overall['reason']}.",
        "",
    ]
    for agent, d in decisions["per_agent"].items():
        lines.append(f"- agent `{agent}`: **{d['decision']}**: {d['reason']}.")
    loop = results.get("loop")
    baseline = results.get("baseline")
    if baseline:
        lines += ["", f"Zero-training control: {zero_training(baseline)}."]
    if loop:
        systems = loop["report"]["systems"]
        shown = "; ".join(
            f"`{name}` solves {s['success_rate']:.2f} of tasks with {s['searches_per_task']:.2f} "
            "searches per task"
            for name, s in systems.items()
        )
        lines += ["", f"Agent loop: {shown}."]
    lines += [
        "",
        "The three numbers the adoption plan tracks: top-10 nDCG (above), searches per task and "
        "answer accuracy ("
        + ("the agent loop" if loop else "not measured: no `loop` stage configured")
        + ").",
        "",
        f"Base model `{config.model}`, training seed {config.seed}, split seed "
        f"{config.split_seed}.",
        "",
        "## Data (split by question)",
        "",
        "| source | train / validation / test searches | questions | groups | validation "
        "groups | weight | pairs cut |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in data["sources"].items():
        n, q, cuts = s["searches"], s["questions"], s.get("cuts")
        cut = f"{cuts['cut']} of {cuts['pairs']} ({cuts['share']:.1%})" if cuts else "-"
        lines.append(
            f"| {name} | {n['train']} / {n['validation']} / {n['test']} "
            f"| {q['train']} / {q['validation']} / {q['test']} | {s['groups']} "
            f"| {s['validation_groups']} | {s['weight']} | {cut} |"
        )
    if baseline:
        lines += [
            "",
            "## Zero-training control: the base reranker with the context appended",
            "",
            *_system_table(baseline["metrics"], baseline.get("sessions")),
            "",
            *_tests_table(baseline["tests"]),
        ]
    mine = results.get("mine")
    if mine:
        lines += [
            "",
            "## Hard negatives from a second retriever (one round)"
            if str(mine["miner"]).startswith(DENSE_PREFIX)
            else "## Self-mined hard negatives (one round)",
            "",
            f"Miner `{mine['miner']}` ({mine['mode']}): each group's {mine['hard']} hardest "
            f"negatives are the miner's"
            + (f", after its {mine['skip']} highest-scored left out" if mine.get("skip") else "")
            + f"; training starts from the {mine['init']}.",
            "",
            "| source | searches scored | errors | groups | hard negatives also first-stage-hard "
            "| positive below the miner's hardest negative |",
            "|---|---|---|---|---|---|",
        ]
        for name, m in mine["sources"].items():
            lines.append(
                f"| {name} | {m['scored']} of {m['searches']} | {m['error_count']} | {m['groups']} "
                f"| {m['hard_shared_with_first_stage']:.1%} | {m['positive_below_hardest']:.1%} |"
            )
        named = {k: m for k, m in mine["sources"].items() if "answer_searches" in m}
        if named:
            lines += [
                "",
                "Negatives that name the question's answer (often relevant but not judged so; "
                "searches whose answer is not yes/no):",
                "",
                "| source | searches | the miner's top negative | mined hard negatives "
                "| first-stage hard negatives |",
                "|---|---|---|---|---|",
                *(
                    f"| {name} | {m['answer_searches']} | {m['miner_top_negative_with_answer']:.1%} "
                    f"| {m['hard_with_answer']:.1%} | {m['first_stage_hard_with_answer']:.1%} |"
                    for name, m in named.items()
                ),
            ]
    if train:
        stopped = train.get("stopped") or {"reason": "step budget"}
        sel = train.get("selection") or {}
        lines += [
            "",
            "## Training",
            "",
            f"{train['steps']} steps ({stopped['reason']}), "
            f"{(train.get('train_seconds') or 0) / 60:.0f} min of training; best "
            f"{sel.get('metric', '-')} {_fmt(sel.get('best_value'))} at step "
            f"{sel.get('best_step', '-')} (the checkpoint kept).",
            "",
            "| step | train loss | val nDCG@10 M0 | val nDCG@10 M3 | val loss M3 |",
            "|---|---|---|---|---|",
        ]
        for h in train["history"]:
            lines.append(
                f"| {h['step']} | {_fmt(h.get('loss'), 4)} | {_fmt(h.get('val/nDCG@10/M0'))} "
                f"| {_fmt(h.get('val/nDCG@10/M3'))} | {_fmt(h.get('val/loss/M3'), 4)} |"
            )
    if fit:
        lines += ["", "## Fusion fit on the validation questions (safety rule)", ""]
        for mode in ("M3", "M0"):
            if mode not in fit:
                continue
            f = fit[mode]
            fitted = f["fitted"]
            cv = fitted.get("cv_gain") or {}
            lines.append(
                f"- {mode}: **{fitted.get('decision')}**, stored `{f['label']}`"
                + (" (reported only, not stored)" if mode != "M3" else "")
                + f"; chosen `{fitted.get('chosen')}`, cross-validated gain "
                f"{_fmt(cv.get('mean'), 4)} [{_fmt(cv.get('low'), 4)}, {_fmt(cv.get('high'), 4)}]"
                f" on {fitted.get('questions')} questions. {fitted.get('reason')}."
                + _alone_line(mode, f)
            )
    if test:
        lines += [
            "",
            "## Test questions: every system side by side",
            "",
            *_system_table(test["metrics"], test.get("sessions")),
            "",
            "Session-paired randomization tests of nDCG@10, one family, Holm:",
            "",
            *_tests_table(test["tests"]),
        ]
        for agent, rows in test["per_agent"].items():
            lines += ["", f"Agent `{agent}`:", "", *_tests_table(rows)]
        banded = test.get("by_first_stage")
        if banded:
            systems = ["first_stage", "M3", test["stored"]]
            lines += [
                "",
                f"Searches banded by the first stage's own {banded['measure']}: each system's "
                "mean in the band, (lost/won) against the first stage:",
                "",
                *bands_markdown(banded["bands"], systems, "first_stage"),
            ]
    cost = results.get("cost")
    if cost:
        lines += [
            "",
            f"## Cost per search (CPU, {cost['searches']} test searches)",
            "",
            "| mode | candidates | p50 ms | mean ms | tokens per search |",
            "|---|---|---|---|---|",
        ]
        for c in cost["by"]:
            lines.append(
                f"| {c['mode']} | {c['candidates']} | {c['p50_ms']:.0f} | {c['mean_ms']:.0f} "
                f"| {c['tokens_per_search']:.0f} |"
            )
        caps = ", ".join(f"{k} {v:.0%}" for k, v in cost["fields_at_cap"].items())
        lines += ["", f"Searches whose M3 prompt has a field cut at its token cap: {caps}."]
    if loop:
        from acare_ray.agent.bench import format_bench_table

        lines += [
            "",
            "## Agent loop",
            "",
            f"`{loop['command']}`",
            "",
            format_bench_table(loop["report"]),
        ]
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any], path: Path) -> Path | None:
    """Test nDCG@10 per system with its 95% interval (PNG); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    metrics = results["test"]["metrics"]
    names = list(metrics)
    means = [metrics[n]["nDCG@10"]["mean"] for n in names]
    low = [metrics[n]["nDCG@10"].get("ci_low", m) for n, m in zip(names, means, strict=True)]
    high = [metrics[n]["nDCG@10"].get("ci_high", m) for n, m in zip(names, means, strict=True)]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
    ax.barh(names, means, xerr=[[m - lo for m, lo in zip(means, low, strict=True)],
                                [hi - m for m, hi in zip(means, high, strict=True)]],
            color=["#888" if n in ("first_stage", "agent_order") else "#3a7" for n in names])  # fmt: skip
    ax.set_xlabel("test nDCG@10 (95% CI)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(config: AdoptConfig, results: dict[str, Any]) -> dict[str, Any]:
    fitted = results["fit"]["M3"]["fitted"]
    test = results["test"]
    overall_row = next(
        t for t in test["tests"] if t["a"] == "first_stage" and t["b"] == test["stored"]
    )
    decision, reason = decide(fitted, overall_row)
    decisions = {"overall": {"decision": decision, "reason": reason}, "per_agent": {}}
    for agent, rows in test["per_agent"].items():
        d, r = decide(fitted, rows[0])
        decisions["per_agent"][agent] = {"decision": d, "reason": r}
    out = config.seed_dir
    (out / "report.md").write_text(report_markdown(config, results, decisions))
    png = chart(results, out / "report.png")
    summary = {
        **decisions,
        "files": {"markdown": str(out / "report.md"), "png": str(png) if png else None},
    }
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
