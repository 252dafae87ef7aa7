"""Summaries, targets and the markdown table of a scorer benchmark run."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import numpy as np
import torch

METHODS = ("official", "strong", "ours")
REPO = Path(__file__).resolve().parents[1]


def repo_relative(value):
    """``value`` with paths inside the repository written relative to its root (results files
    are committed: they name no machine's folders)."""
    if isinstance(value, dict):
        return {k: repo_relative(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [repo_relative(v) for v in value]
    if isinstance(value, str):
        return value.replace(f"{REPO}{os.sep}", "").replace(str(REPO), ".")
    return value


def dump_json(report: dict, path: Path) -> None:
    """Write ``report`` as indented JSON, repository paths made relative."""
    path.write_text(json.dumps(repo_relative(report), indent=2) + "\n")


def machine() -> str:
    """The machine a benchmark ran on, in one line."""
    import platform

    return f"{platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}"


def machine_line() -> str:
    """Architecture, CPU count and Python version, the machine field of the agent and cluster
    benchmarks' results."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def git_commit() -> str:
    """The repository's HEAD commit (empty outside a git checkout)."""
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()


def commands_block(commands: list[str]) -> list[str]:
    """The markdown lines that end a results file: the commands that made it, in a bash block."""
    return ["", "Commands:", "", "```bash", *commands, "```", ""]


def write_report(report: dict, out: Path, label: str, markdown: str) -> None:
    """``<out>/<label>.json`` (repository paths made relative) and ``<out>/<label>.md``; prints
    the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    dump_json(report, out / f"{label}.json")
    (out / f"{label}.md").write_text(markdown)
    print(markdown)


def summarise(runs: list[dict], params: int, peak_flops: float | None) -> dict:
    """Totals over rounds of one method in one mode (rates = total pairs / total seconds)."""
    total = {k: sum(r[k] for r in runs) for k in ("pairs", "seconds", "cpu_seconds", "tokenize_s")}
    real = sum(r["real_tokens"] for r in runs)
    computed = sum(r["computed_tokens"] for r in runs)
    flops = 2.0 * params * real
    out = {
        "pairs": total["pairs"],
        "seconds": total["seconds"],
        "pairs_per_s": total["pairs"] / total["seconds"],
        "seconds_per_pair": total["seconds"] / total["pairs"],
        "pairs_per_s_by_round": [r["pairs"] / r["seconds"] for r in runs],
        "cpu_seconds": total["cpu_seconds"],
        "pairs_per_cpu_s": total["pairs"] / total["cpu_seconds"],
        "pairs_per_cpu_s_by_round": [r["pairs"] / r["cpu_seconds"] for r in runs],
        "tokenize_s": total["tokenize_s"],
        "tokenize_share": total["tokenize_s"] / total["seconds"],
        "real_tokens": real,
        "computed_tokens": computed,
        "padding_efficiency": real / computed,
        "real_tokens_per_pair": real / total["pairs"],
        "peak_mb": max(r["peak_mb"] for r in runs),
        "model_tflops_per_s": flops / total["seconds"] / 1e12,
    }
    if peak_flops:
        out["mfu"] = flops / total["seconds"] / peak_flops
    if "max_abs_diff_vs_ours" in runs[0]:
        out["max_abs_diff_vs_ours"] = max(r["max_abs_diff_vs_ours"] for r in runs)
    return out


def environment() -> dict:
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_name(),
        "load_average_start": os.getloadavg(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _target(value: float, threshold: float, at_least: bool) -> dict:
    met = value >= threshold if at_least else value <= threshold
    return {"value": value, "threshold": threshold, "met": bool(met)}


def targets(modes: dict, atol: float, basis: str) -> dict:
    """The issue's targets: 3x the strong baseline on M3, cost(M3)/cost(M0) <= 1.3, padding
    efficiency >= 0.9, scores equal within ``atol``; the baseline's cost ratio is context.

    ``basis``: ``"cpu"`` judges the ratios on this process's CPU seconds (on a shared CPU machine
    wall time mostly measures the other processes), ``"wall"`` on wall time (GPU runs). Both
    values are kept, with the per-round ratios on the chosen basis.
    """
    rate = "pairs_per_cpu_s" if basis == "cpu" else "pairs_per_s"

    def ratio(name: str, a: dict, b: dict, threshold: float, at_least: bool) -> None:
        values = {k: a[k] / b[k] for k in ("pairs_per_cpu_s", "pairs_per_s")}
        out[name] = _target(values[rate], threshold, at_least) | {
            "basis": basis,
            "cpu_time": values["pairs_per_cpu_s"],
            "wall": values["pairs_per_s"],
            "by_round": [x / y for x, y in zip(a[f"{rate}_by_round"], b[f"{rate}_by_round"])],
        }

    out: dict = {}
    if "M3" in modes:
        ratio("speedup_vs_strong_M3", modes["M3"]["ours"], modes["M3"]["strong"], 3.0, True)
    if {"M0", "M3"} <= modes.keys():
        for method in ("ours", "strong"):
            # cost ratio = M0 rate / M3 rate
            m0, m3 = modes["M0"][method], modes["M3"][method]
            ratio(f"cost_M3_over_M0_{method}", m0, m3, 1.3, False)
        out["cost_M3_over_M0_strong"] |= {"threshold": None, "met": None}  # context only
    out["padding_efficiency_ours"] = _target(
        min(m["ours"]["padding_efficiency"] for m in modes.values()), 0.9, at_least=True
    )
    diffs = [m[k]["max_abs_diff_vs_ours"] for m in modes.values() for k in METHODS[:2] if k in m]
    out["scores_match"] = _target(max(diffs), atol, at_least=False)
    return out


def markdown(report: dict) -> str:
    cfg, work, env = report["config"], report["workload"], report["environment"]
    hardware = env.get("gpu", env["cpu"])
    lines = [
        f"# Scorer benchmark: {report['label']}",
        "",
        f"Model: random-weight `{cfg['config']}`{' (shrunk)' if cfg['shrink'] else ''} shapes, layers={cfg['layers'] or 'all'}, "
        f"{report['non_embedding_params'] / 1e6:.1f}M non-embedding params, {cfg['dtype']}"
        f"{' (ours with torch.compile)' if cfg['compile'] else ''} on "
        f"{cfg['device']} ({hardware}, {env['threads']} threads; load average "
        f"{env['load_average_start'][0]:.1f} at start, {report['load_average_end'][0]:.1f} at end).",
        f"Workload: {work['kind']}, {work['searches']} searches x {work['candidates_per_search']} "
        f"candidates; document tokens mean {work['doc_tokens']['mean']:.0f} "
        f"(min {work['doc_tokens']['min']}, max {work['doc_tokens']['max']}) + "
        f"{work['suffix_tokens']} suffix; prefix tokens "
        + ", ".join(f"{m} {v:.0f}" for m, v in work["prefix_tokens"].items())
        + ".",
        f"Rounds: {cfg['rounds']}, interleaved (each round runs every method once, round r on "
        f"search r). ours: all candidates; strong: the candidates at stride "
        f"{cfg['baseline_stride']}; official: the first {cfg['official_pairs']} of those, round 0 only. Baselines use a "
        f"fixed batch size of {cfg['batch_size']} in input order.",
    ]
    if "reasoning" in work:
        lines.append(f"Reasoning text: {work['reasoning']}.")
    mfu = cfg["peak_flops"] is not None
    header = (
        "| mode | method | pairs | pairs/s | ours / method | s/pair | pairs/CPU-s | "
        "tokenize share | padding eff. | real tokens/pair | peak MB | model TFLOP/s |"
    )
    lines += [
        "",
        header + (" MFU |" if mfu else "") + " max abs diff vs ours |",
        "|---|---|" + "---:|" * (11 if mfu else 10) + "---:|",
    ]
    for mode, results in report["modes"].items():
        ours = results["ours"]["pairs_per_s"]
        for method in METHODS:
            if method not in results:
                continue
            r = results[method]
            lines.append(
                f"| {mode} | {method} | {r['pairs']} | {r['pairs_per_s']:.3g} | "
                f"{ours / r['pairs_per_s']:.2f}x | {r['seconds_per_pair'] * 1e3:.1f} ms | "
                f"{r['pairs_per_cpu_s']:.3g} | {r['tokenize_share']:.1%} | {r['padding_efficiency']:.3f} | "
                f"{r['real_tokens_per_pair']:.0f} | {r['peak_mb']:.0f} | "
                f"{r['model_tflops_per_s']:.3f} |"
                + (f" {r['mfu']:.1%} |" if mfu else "")
                + f" {r.get('max_abs_diff_vs_ours', 0.0):.1e} |"
            )
    spreads = ", ".join(
        f"{m} {r['score_spread']:.3g}" for m, r in report["modes"].items() if "score_spread" in r
    )
    if spreads:
        lines += [
            "",
            f"Spread of our scores (max - min): {spreads}; agreement tolerance "
            f"{report['targets']['scores_match']['threshold']:.3g}.",
        ]
    lines += ["", "Tokenizing only, all candidates of a search (ms per search, fastest of 3):", ""]
    for mode, results in report["modes"].items():
        t = results["tokenize_only"]
        lines.append(
            f"- {mode}: official recipe (every pair tokenized whole) "
            f"{t['official_s_per_search'] * 1e3:.1f}; ours (prefix once, documents in one "
            f"batched call) {t['ours_s_per_search'] * 1e3:.1f}"
        )
    basis = next((t["basis"] for t in report["targets"].values() if "basis" in t), "wall")
    judged = "CPU seconds of this process" if basis == "cpu" else "wall time"
    lines += [
        "",
        f"Ratio targets are judged on {judged} (totals over rounds); both bases are shown.",
        "",
        "| target | value | threshold | met | CPU time | wall | by round |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for name, t in report["targets"].items():
        by_round = ", ".join(f"{x:.3g}" for x in t.get("by_round", []))
        extra = [f"{t[k]:.4g}" if k in t else "" for k in ("cpu_time", "wall")]
        if t["met"] is None:
            threshold, met = "", "(context)"
        else:
            threshold, met = f"{t['threshold']:.4g}", "yes" if t["met"] else "NO"
        lines.append(
            f"| {name} | {t['value']:.4g} | {threshold} | {met} | {' | '.join(extra)} | "
            f"{by_round} |"
        )
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{report['label']}.json", out / f"{report['label']}.md"
    dump_json(report, json_path)
    md_path.write_text(markdown(report))
    return json_path, md_path


def score_gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max()) if len(a) else 0.0


def rerender(path: Path) -> None:
    """Recompute the targets of a saved JSON report and rewrite it and its markdown."""
    report = json.loads(path.read_text())
    cfg = report["config"]
    for results in report["modes"].values():
        for method in METHODS:
            if method in results:
                results[method].setdefault("pairs_per_cpu_s_by_round", [])
    basis = "wall" if cfg["device"].startswith("cuda") else "cpu"
    report["targets"] = targets(
        report["modes"], report["targets"]["scores_match"]["threshold"], basis
    )
    write(report, path.parent)


if __name__ == "__main__":
    import sys

    for name in sys.argv[1:]:
        rerender(Path(name))
