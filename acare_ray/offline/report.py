"""Presentation of an evaluation report: the printed table, the markdown file, the PNG chart.

All three read the report dict :func:`acare_ray.offline.evaluate.run` returns; nothing here
computes a metric. Rows are the report's systems (the modes, the fused systems, the first stage);
``*`` marks a difference from the first mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from acare_ray.eval.bands import bands_markdown


def systems(report: dict[str, Any]) -> list[str]:
    """The systems of a report, modes first (reports written before fusion have modes only)."""
    return list(report.get("systems") or report["modes"])


def _cell(entry: dict[str, float]) -> str:
    return f"{entry['mean']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def _marks(report: dict[str, Any]) -> dict[tuple[str, str], str]:
    """``(mode, measure) -> "*"`` where the mode differs significantly from the first mode."""
    base = report["modes"][0]
    out = {}
    for row in report["significance"]["comparisons"]:
        if row["a"] == base and row["significant"]:
            out[row["b"], row["measure"]] = "*"
    return out


def _queries(counts: dict[str, Any]) -> str:
    errored = ", ".join(f"{m} {n}" for m, n in counts.get("errored_rows", {}).items())
    return (
        f"{counts['evaluated']} evaluated of {counts['labelled']} labelled "
        f"(no relevant candidate: {counts['no_relevant_candidate']}, "
        f"not scored in every mode: {counts['not_scored_in_every_mode']}; "
        f"error rows per mode: {errored or 'none'})"
    )


def format_table(report: dict[str, Any]) -> str:
    """A fixed-width table: one row per mode, mean [CI] per measure, ``*`` = significantly
    different from the first mode (Holm-adjusted), then the query counts."""
    measures, modes = report["measures"], systems(report)
    marks = _marks(report)
    width = 26
    name = max(6, *(len(mode) + 2 for mode in modes))
    lines = [f"{'mode':<{name}}" + "".join(f"{m:<{width}}" for m in measures).rstrip()]
    for mode in modes:
        cells = [
            f"{_cell(report['metrics'][mode][m]) + marks.get((mode, m), ''):<{width}}"
            for m in measures
        ]
        lines.append(f"{mode:<{name}}" + "".join(cells).rstrip())
    sig = report["significance"]
    queries = report["queries"]
    lines.append(
        f"[{round(sig['confidence'] * 100)}% CI] = percentile bootstrap; "
        f"* = {sig['test']} test vs {modes[0]}, Holm-adjusted p <= {sig['alpha']}"
    )
    lines.append(f"queries: {_queries(queries)}")
    section = report.get("sessions")
    if section and "metrics" in section:
        lines.append("")
        lines.append(f"sessions ({_session_counts(section['counts'])}):")
        lines += _session_table(section, modes, markdown=False)
    return "\n".join(lines)


def _session_counts(counts: dict[str, int]) -> str:
    return (
        f"{counts['evaluated']} evaluated of {counts['sessions']} "
        f"({counts['searches']} searches; no gold page: {counts['no_gold_page']}, "
        f"not scored in every mode: {counts['not_scored_in_every_mode']})"
    )


def _session_table(section: dict[str, Any], modes: list[str], markdown: bool) -> list[str]:
    """Session measures per mode, ``*`` = differs from the first mode (session-paired, Holm)."""
    measures = section["measures"]
    marks = {
        (row["b"], row["measure"]): "*"
        for row in section["comparisons"]
        if row["a"] == modes[0] and row["significant"]
    }
    rows = []
    for mode in modes:
        cells = [
            _cell(section["metrics"][mode][m]) + marks.get((mode, m), "")
            for m in measures
            if m in section["metrics"][mode]
        ]
        rows.append((mode, cells))
    if markdown:
        out = ["| mode | " + " | ".join(measures) + " |", "|---" * (len(measures) + 1) + "|"]
        out += [f"| {mode} | " + " | ".join(cells) + " |" for mode, cells in rows]
        return out
    out = []
    name = max(6, *(len(mode) + 2 for mode in modes))
    for mode, cells in rows:
        out.append(f"{mode:<{name}}" + "  ".join(f"{m}={c}" for m, c in zip(measures, cells)))
    return out


def session_markdown(section: dict[str, Any], modes: list[str], title: str) -> list[str]:
    """The markdown of one session section: counts, measures, first-found, comparisons."""
    if "metrics" not in section:
        return ["", f"## {title}", "", f"- {section.get('note', '')}: {section['counts']}"]
    lines = ["", f"## {title}", "", f"- sessions: {_session_counts(section['counts'])}"]
    lines.append(
        f"- each search returns its top {section['depth']} documents not returned earlier in "
        "the session; tests are paired by session; * = differs from "
        f"{modes[0]} (Holm-adjusted)"
    )
    lines += [""] + _session_table(section, modes, markdown=True)
    lines += ["", "Search at which each gold page was first returned:", ""]
    keys = sorted(
        {k for h in section["first_found"].values() for k in h},
        key=lambda k: (k == "never", k.zfill(4)),
    )
    lines.append("| mode | " + " | ".join(keys) + " |")
    lines.append("|---" * (len(keys) + 1) + "|")
    for mode in modes:
        histogram = section["first_found"][mode]
        lines.append(f"| {mode} | " + " | ".join(str(histogram.get(k, 0)) for k in keys) + " |")
    lines += [
        "",
        "| measure | a | b | b - a [CI] | p | p (Holm) | sessions |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in section["comparisons"]:
        lines.append(
            f"| {row['measure']} | {row['a']} | {row['b']} | {row['diff']:+.4f} "
            f"[{row['ci_low']:+.4f}, {row['ci_high']:+.4f}] | {row['p_value']:.4g} | "
            f"{row['p_holm']:.4g} | {row['n_sessions']} |"
        )
    return lines


def _bands_section(section: dict[str, Any], modes: list[str]) -> list[str]:
    baseline, measure = section["baseline"], section["measure"]
    return [
        "",
        f"## By the first stage's own {measure}",
        "",
        f"Searches banded by {baseline}'s {measure}; each system's mean in the band and "
        f"(lost/won): searches below / above {baseline} there.",
        "",
        *bands_markdown(section["bands"], modes, baseline),
    ]


def write_markdown(report: dict[str, Any], path: str | Path) -> None:
    """``report.md``: settings, the metric table, every pairwise comparison, files."""
    measures, modes = report["measures"], systems(report)
    marks = _marks(report)
    sig = report["significance"]
    job = report["job"]
    lines = [
        "# ACARe evaluation",
        "",
        f"- model: `{report['model']}`",
        f"- input: `{report['input']}`",
        f"- queries: {_queries(report['queries'])}",
        f"- rerank job: {job['rows_in']} searches x {len(report['modes'])} modes; this run wrote "
        f"{job['written']} rows ({job['errored']} errored), "
        f"{job['already_written']} were already written",
    ]
    if report.get("fusion"):
        lines.append(f"- fusion (systems `<mode>+<fusion>`): {', '.join(report['fusion'])}")
    for key, value in report.get("input_notes", {}).items():
        lines.append(f"- input note `{key}`: {value}")
    if "wall_s" in report:
        lines.append(f"- wall time: {report['wall_s']:.1f} s")
    lines += [
        "",
        f"Mean [{round(sig['confidence'] * 100)}% bootstrap CI]; * = differs from "
        f"{modes[0]} ({sig['test']} test, {sig['correction']}, alpha {sig['alpha']}).",
        "",
        "| mode | " + " | ".join(measures) + " |",
        "|---" * (len(measures) + 1) + "|",
    ]
    for mode in modes:
        cells = [_cell(report["metrics"][mode][m]) + marks.get((mode, m), "") for m in measures]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Paired comparisons",
        "",
        "| measure | a | b | mean a | mean b | b - a [CI] | p | p (Holm) | significant |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sig["comparisons"]:
        lines.append(
            f"| {row['measure']} | {row['a']} | {row['b']} | {row['mean_a']:.4f} | "
            f"{row['mean_b']:.4f} | {row['diff']:+.4f} [{row['ci_low']:+.4f}, "
            f"{row['ci_high']:+.4f}] | {row['p_value']:.4g} | {row['p_holm']:.4g} | "
            f"{'yes' if row['significant'] else 'no'} |"
        )
    if "by_first_stage" in report:
        lines += _bands_section(report["by_first_stage"], modes)
    if "sessions" in report:
        lines += session_markdown(report["sessions"], modes, "Sessions")
    for value, group in report.get("groups", {}).items():
        lines += ["", f"## {report['config']['group_by']} = {value}", ""]
        if "metrics" in group:
            lines += [f"- searches: {group['queries']}", ""]
            lines.append("| mode | " + " | ".join(measures) + " |")
            lines.append("|---" * (len(measures) + 1) + "|")
            for mode in modes:
                cells = [_cell(group["metrics"][mode][m]) for m in measures]
                lines.append(f"| {mode} | " + " | ".join(cells) + " |")
        if "sessions" in group:
            lines += session_markdown(group["sessions"], modes, f"Sessions, {value}")
    files = report["files"]
    lines += ["", "## Files", "", f"- chart: `{files['chart']}`", f"- qrels: `{files['qrels']}`"]
    lines += [f"- TREC run {mode}: `{p}`" for mode, p in files["runs"].items()]
    lines.append(f"- rerank output (Parquet): `{files['rerank_output']}`")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_chart(report: dict[str, Any], path: str | Path) -> None:
    """``metrics.png``: grouped bars, one group per measure, one bar per mode, CI whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    measures, modes = report["measures"], systems(report)
    x = np.arange(len(measures))
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(1.6 + 1.9 * len(measures), 3.6), dpi=120)
    for k, mode in enumerate(modes):
        entries = [report["metrics"][mode][m] for m in measures]
        means = np.array([e["mean"] for e in entries])
        errors = np.array(
            [
                [e["mean"] - e["ci_low"] for e in entries],
                [e["ci_high"] - e["mean"] for e in entries],
            ]
        )
        ax.bar(
            x + (k - (len(modes) - 1) / 2) * width, means, width, yerr=errors, capsize=3, label=mode
        )
    ax.set_xticks(x, measures)
    ax.set_ylim(0, 1.18)
    ax.set_ylabel("mean over queries")
    ax.set_title(f"{Path(str(report['model'])).name}: {report['queries']['evaluated']} queries")
    ax.legend(ncols=min(len(modes), 4), loc="upper center", frameon=False, fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
