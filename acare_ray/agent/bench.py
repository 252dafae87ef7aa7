"""``acare agent-bench``: :class:`AgentBenchConfig` -> :func:`run` -> JSON + markdown + PNG.

Each compared system (``bm25``, ``oracle``, one reranker mode such as ``M3``, or a mode fused
with the BM25 first stage such as ``M3+rrf:k=60,weight=0.5``) runs every task in closed-loop
sessions (:mod:`acare_ray.agent.simulate`). Reported per system: task success
rate, searches per task (mean over all tasks, and over the tasks every compared system solved),
searches per solved step (searches spent on the steps that were solved / solved steps), session
recall of the gold paragraphs, reranker time per task, search latency p50/p95/p99 (first stage +
rerank) and throughput (searches and tasks per second of wall time). Systems are compared by
task with paired randomization tests (success, searches per task, session recall), Holm-corrected
over the pairs of each measure.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from acare_ray.agent.rerankers import (
    AgentReranker,
    EndpointReranker,
    FirstStageOrder,
    OracleReranker,
    ScorerReranker,
    fusion_setting,
)
from acare_ray.agent.simulate import TaskResult, progress_printer, run_sessions
from acare_ray.agent.tasks import (
    SPLITS,
    Corpus,
    Task,
    build_tasks,
    records_by_id,
    select_records,
    write_corpus,
)
from acare_ray.eval.ir_metrics import holm_bonferroni, paired_randomization_test
from acare_ray.ranking.fusion import FusionConfig, resolve_fusion

RERANKERS = ("none", "oracle", "model", "endpoint")
MODES = ("M0", "M1", "M2", "M3", "auto")
CORPORA = ("all", "tasks")
TESTED = ("success", "searches", "session_recall")


@dataclass(frozen=True)
class AgentBenchConfig:
    """``reranker``: ``none`` (BM25 order), ``oracle``, ``model`` (in-process ``model`` in each
    of ``modes``) or ``endpoint`` (``endpoint`` URL in each of ``modes``). ``baseline`` adds the
    BM25 system beside an oracle, model or endpoint. ``task_ids``, when given, is the task list
    itself (MuSiQue ids, in that order) instead of a draw of ``tasks`` by ``seed`` from
    ``split``. ``fusion``: settings (text form, or ``auto``: the model's fitted one, or the
    endpoint's) that each add the fused system ``<mode>+<setting>`` beside every mode.
    ``search_endpoint`` (a base URL serving ``/v1/search`` over this run's corpus) adds
    ``<mode> (search)`` for each of ``modes`` (and each fused setting): server-side first stage,
    rerank and session memory; ``mcp`` (an ``acare mcp`` URL or stdio command) adds
    ``auto (mcp)``, its ``search`` tool (:mod:`acare_ray.agent.searchers`)."""

    out: str
    tasks: int = 100
    seed: int = 0
    split: str = "dev"
    reranker: str = "none"
    model: str | None = None
    modes: tuple[str, ...] = ("auto",)
    endpoint: str | None = None
    endpoint_model: str = "acare"
    api_key: str | None = field(default=None, repr=False)
    baseline: bool = True
    agents: int = 1
    ramp_s: float = 0.0
    budget: int = 3
    depth: int = 10
    first_stage_k: int = 100
    device: str | None = None
    max_batch_tokens: int | None = None
    n_resamples: int = 10_000
    progress_every: int = 10
    data_dir: str | None = None
    task_ids: tuple[str, ...] | None = None
    corpus: str = "all"
    fusion: tuple[str, ...] = ()
    fused_only: bool = False
    search_endpoint: str | None = None
    mcp: str | None = None

    def __post_init__(self) -> None:
        if self.corpus not in CORPORA:
            raise ValueError(f"corpus must be one of {', '.join(CORPORA)}, got {self.corpus!r}")
        if self.reranker not in RERANKERS:
            raise ValueError(
                f"reranker must be one of {', '.join(RERANKERS)}, got {self.reranker!r}"
            )
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if (self.reranker == "model") != (self.model is not None):
            raise ValueError("--model goes with the model reranker (and only with it)")
        if (self.reranker == "endpoint") != (self.endpoint is not None):
            raise ValueError("--endpoint goes with the endpoint reranker (and only with it)")
        if self.reranker in ("model", "endpoint") or self.search_endpoint is not None:
            bad = [m for m in self.modes if m not in MODES]
            if not self.modes or bad or len(set(self.modes)) != len(self.modes):
                raise ValueError(f"--modes must be distinct values of {', '.join(MODES)}")
        if (
            self.fusion
            and self.reranker not in ("model", "endpoint")
            and self.search_endpoint is None
        ):
            raise ValueError("--fusion goes with --model, --endpoint or --search-endpoint")
        for name in ("search_endpoint", "mcp"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise ValueError(f"--{name.replace('_', '-')} is empty")
        for setting in self.fusion:
            try:
                fusion_setting(setting)
            except ValueError as err:
                raise ValueError(f"--fusion {setting!r}: {err}") from None
        for name in ("tasks", "agents", "budget", "depth", "first_stage_k", "n_resamples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.ramp_s >= 0:
            raise ValueError(f"ramp_s must be >= 0, got {self.ramp_s}")

    def public(self) -> dict[str, Any]:
        """The config as recorded in the report (no API key)."""
        out = asdict(self)
        out.pop("api_key")
        out["modes"] = list(self.modes)
        out["fusion"] = list(self.fusion)
        if self.task_ids is not None:
            out["task_ids"] = list(self.task_ids)
        return out


def make_rerankers(config: AgentBenchConfig, tasks: list[Task]) -> list[AgentReranker]:
    """The compared systems, baseline first."""
    systems: list[AgentReranker] = []
    if config.reranker == "none" or config.baseline:
        systems.append(FirstStageOrder())
    if config.reranker == "oracle":
        gold = {(t.task_id, k): g for t in tasks for k, g in enumerate(t.gold_steps)}
        systems.append(OracleReranker(gold))
    elif config.reranker == "model":
        from acare_ray.scoring import Scorer

        options = {}
        if config.max_batch_tokens is not None:
            options["max_batch_tokens"] = config.max_batch_tokens
        fusions = model_fusions(config)
        scorer = Scorer.from_pretrained(config.model, device=config.device, **options)
        lock = threading.Lock()
        for mode in config.modes:
            if not (config.fused_only and fusions):
                systems.append(ScorerReranker(scorer, mode, lock))
            systems += [ScorerReranker(scorer, mode, lock, fusion) for fusion in fusions]
    elif config.reranker == "endpoint":
        settings = list(dict.fromkeys(filter(None, map(fusion_setting, config.fusion))))
        for mode in config.modes:
            for fusion in [None, *settings] if not (config.fused_only and settings) else settings:
                systems.append(
                    EndpointReranker(
                        config.endpoint, mode, config.endpoint_model, config.api_key, fusion=fusion
                    )
                )
    try:
        if config.search_endpoint is not None:
            from acare_ray.agent.searchers import SearchEndpoint

            settings = list(dict.fromkeys(filter(None, map(fusion_setting, config.fusion))))
            for mode in config.modes:
                for fusion in [None, *settings]:
                    systems.append(
                        SearchEndpoint(config.search_endpoint, mode, config.api_key, fusion=fusion)
                    )
        if config.mcp is not None:
            from acare_ray.agent.searchers import McpSearch

            systems.append(McpSearch(config.mcp))
    except BaseException:
        close_all(systems)
        raise
    return systems


def close_all(systems: list[Any]) -> None:
    for system in systems:
        close = getattr(system, "close", None)
        if close is not None:
            close()


def model_fusions(config: AgentBenchConfig) -> list[FusionConfig]:
    """The in-process fused settings, ``auto`` resolved to the model's fitted one, once each."""
    from acare_ray.ranking.checkpoint_settings import read_fusion

    fitted = read_fusion(config.model) if "auto" in map(str.strip, config.fusion) else None
    out: list[FusionConfig] = []
    for setting in config.fusion:
        if setting.strip() == "auto" and fitted is None:
            raise ValueError(f"--fusion auto: {config.model} has no fitted fusion (acare.json)")
        fusion = resolve_fusion(setting, fitted)
        if fusion.enabled and fusion not in out:
            out.append(fusion)
    return out


def phase_stats(values: list[float | None]) -> dict[str, float] | None:
    """Mean, p50 and p95 in ms of per-search times in seconds (None: the phase was not
    measured for this system)."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    array = np.asarray(known) * 1000
    p50, p95 = np.percentile(array, [50, 95])
    return {"mean": float(array.mean()), "p50": float(p50), "p95": float(p95)}


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    p50, p95, p99 = np.percentile(np.asarray(values) * 1000, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99)}


def summarize_system(results: list[TaskResult], wall_s: float, common: set[str]) -> dict[str, Any]:
    """One system's measures; ``common``: the ids of the tasks every compared system solved."""
    n = len(results)
    searches = [r.n_searches for r in results]
    solved_steps = sum(r.steps_solved for r in results)
    solved_step_searches = sum(sum(r.searches_per_step[: r.steps_solved]) for r in results)
    on_common = [r.n_searches for r in results if r.task_id in common]
    total = sum(searches)
    return {
        "tasks": n,
        "solved": sum(r.solved for r in results),
        "success_rate": sum(r.solved for r in results) / n,
        "searches_per_task": total / n,
        "searches_per_task_common": float(np.mean(on_common)) if on_common else None,
        "common_tasks": len(common),
        "searches_per_solved_step": solved_step_searches / solved_steps if solved_steps else None,
        "steps_solved": solved_steps,
        "steps": sum(r.n_steps for r in results),
        "session_recall": float(np.mean([r.session_recall for r in results])),
        "rerank_s_per_task": sum(r.rerank_s for r in results) / n,
        "rerank_tokens_per_task": sum(r.tokens for r in results) / n,
        "latency_ms": _percentiles([s.latency_s for r in results for s in r.searches]),
        "phases_ms": {
            "search": phase_stats([s.latency_s for r in results for s in r.searches]),
            "first_stage": phase_stats([s.first_stage_s for r in results for s in r.searches]),
            "session": phase_stats([s.session_s for r in results for s in r.searches]),
            "rerank": phase_stats([s.rerank_s for r in results for s in r.searches]),
        },
        "searches": total,
        "wall_s": wall_s,
        "searches_per_s": total / wall_s if wall_s > 0 else None,
        "tasks_per_s": n / wall_s if wall_s > 0 else None,
    }


def per_task_values(results: list[TaskResult]) -> dict[str, dict[str, float]]:
    return {
        "success": {r.task_id: float(r.solved) for r in results},
        "searches": {r.task_id: float(r.n_searches) for r in results},
        "session_recall": {r.task_id: r.session_recall for r in results},
    }


def paired_tests(
    per_system: dict[str, list[TaskResult]], n_resamples: int, seed: int
) -> list[dict[str, Any]]:
    """Every pair of systems on every tested measure; Holm over the pairs of each measure."""
    names = list(per_system)
    if len(names) < 2 or len(next(iter(per_system.values()))) < 2:
        return []
    values = {name: per_task_values(results) for name, results in per_system.items()}
    tests = []
    for measure in TESTED:
        rows = []
        for a, b in itertools.combinations(names, 2):
            t = paired_randomization_test(
                values[a][measure], values[b][measure], n_resamples=n_resamples, seed=seed
            )
            rows.append(
                {
                    "measure": measure,
                    "a": a,
                    "b": b,
                    "mean_a": t.mean_a,
                    "mean_b": t.mean_b,
                    "mean_diff": t.mean_diff,
                    "p_value": t.p_value,
                    "n_tasks": t.n_queries,
                }
            )
        for row, adjusted in zip(rows, holm_bonferroni([r["p_value"] for r in rows])):
            row["p_holm"] = adjusted
        tests += rows
    return tests


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_bench_table(report: dict[str, Any]) -> str:
    header = (
        "| system | success | searches/task | on common | searches/solved step | session recall"
        " | rerank s/task | tokens/task | p50 ms | p95 ms | p99 ms | searches/s |"
    )
    lines = [header, "|" + "---|" * 12]
    for name, s in report["systems"].items():
        lat = s["latency_ms"]
        lines.append(
            f"| {name} | {_fmt(s['success_rate'])} ({s['solved']}/{s['tasks']}) "
            f"| {_fmt(s['searches_per_task'], 2)} | {_fmt(s['searches_per_task_common'], 2)} "
            f"| {_fmt(s['searches_per_solved_step'], 2)} | {_fmt(s['session_recall'])} "
            f"| {_fmt(s['rerank_s_per_task'])} | {s['rerank_tokens_per_task']:.0f} "
            f"| {_fmt(lat['p50'], 1)} | {_fmt(lat['p95'], 1)} "
            f"| {_fmt(lat['p99'], 1)} | {_fmt(s['searches_per_s'], 1)} |"
        )
    return "\n".join(lines)


def format_phases(report: dict[str, Any]) -> str:
    """Per search, mean / p50 / p95 ms of each phase (``-``: not measured for that system)."""

    def cell(stats: dict[str, float] | None) -> str:
        if stats is None:
            return "-"
        return f"{stats['mean']:.1f} / {stats['p50']:.1f} / {stats['p95']:.1f}"

    lines = [
        "| system | search | first stage | session store | rerank |",
        "|---|---|---|---|---|",
    ]
    for name, s in report["systems"].items():
        phases = s["phases_ms"]
        lines.append(
            f"| {name} | {cell(phases['search'])} | {cell(phases['first_stage'])} "
            f"| {cell(phases['session'])} | {cell(phases['rerank'])} |"
        )
    return "\n".join(lines)


def write_bench_markdown(report: dict[str, Any], path: Path) -> None:
    config = report["config"]
    lines = [
        "# agent-bench",
        "",
        f"{report['n_tasks']} MuSiQue tasks ("
        + (
            "from --task-ids"
            if config.get("task_ids") is not None
            else f"{config['split']}, seed {config['seed']}"
        )
        + f"), corpus {report['corpus_size']} paragraphs ({config['corpus']}), "
        f"BM25 top-{config['first_stage_k']} -> reranker -> "
        f"top {config['depth']} unseen, budget {config['budget']} searches per step, "
        f"{config['agents']} agents in flight"
        + (f" (started over {config['ramp_s']:g} s)" if config.get("ramp_s") else "")
        + f". Reranker: {config['reranker']}"
        + (f" `{config['model']}`" if config["model"] else "")
        + (f" `{config['endpoint']}`" if config["endpoint"] else "")
        + (
            f"; server-side search `{config['search_endpoint']}`"
            if config.get("search_endpoint")
            else ""
        )
        + (f"; MCP `{config['mcp']}`" if config.get("mcp") else "")
        + ".",
        "",
        f"Common tasks (solved by every system): {report['common_tasks']}.",
        "",
        format_bench_table(report),
        "",
        "## Time per search by phase (ms, mean / p50 / p95)",
        "",
        "Search: as the agent waits for it. Client-side systems: first stage = BM25 and the"
        " unseen filter in the bench. Server-side systems (`(search)`, `(mcp)`): the server's"
        " own `usage` times (first stage, session store read + write, rerank).",
        "",
        format_phases(report),
    ]
    if report["tests"]:
        lines += [
            "",
            "## Paired randomization tests by task (Holm over the pairs of each measure)",
            "",
            "| measure | a | b | mean a | mean b | b - a | p | p (Holm) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in report["tests"]:
            lines.append(
                f"| {t['measure']} | {t['a']} | {t['b']} | {t['mean_a']:.3f} | {t['mean_b']:.3f} "
                f"| {t['mean_diff']:+.3f} | {t['p_value']:.4f} | {t['p_holm']:.4f} |"
            )
    files = report["files"]
    lines += ["", f"Chart: `{files['chart']}`; JSON: `{files['json']}`.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def write_bench_chart(per_system: dict[str, list[TaskResult]], budget_cap: int, path: Path) -> None:
    """Grouped bars: number of tasks by searches per task, one bar per system; failed tasks in
    their own group at the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r.n_searches for rs in per_system.values() for r in rs if r.solved})
    labels = [str(c) for c in counts] + ["failed"]
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(per_system))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 + 0.7 * len(labels)), 3.6), dpi=120)
    for k, (name, results) in enumerate(per_system.items()):
        heights = [sum(r.solved and r.n_searches == c for r in results) for c in counts]
        heights.append(sum(not r.solved for r in results))
        ax.bar(x + (k - (len(per_system) - 1) / 2) * width, heights, width, label=name)
    ax.set_xticks(x, labels)
    ax.set_xlabel("searches per task (solved tasks); failed tasks")
    ax.set_ylabel("tasks")
    ax.set_title(f"agent-bench: {len(next(iter(per_system.values())))} tasks, budget {budget_cap}")
    ax.legend(ncols=min(4, len(per_system)), loc="upper right", frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def load_tasks(config: AgentBenchConfig) -> tuple[list[Task], Corpus]:
    """The run's tasks and corpus (``--task-ids`` or the draw, ``--corpus``)."""
    from acare_ray.data.musique import load_musique

    everything = load_musique(config.data_dir)
    if config.task_ids is not None:
        records = records_by_id(everything, config.task_ids)
    else:
        records = select_records(everything, config.tasks, config.seed, config.split)
    return build_tasks(records, everything if config.corpus == "all" else ())


def export_corpus(config: AgentBenchConfig, path: str | Path) -> int:
    """Write the corpus ``config`` would search as ``acare index`` input (``write_corpus``);
    the number of documents."""
    return write_corpus(load_tasks(config)[1], path)


def run_systems(
    config: AgentBenchConfig, tasks: list[Task], corpus: Corpus, systems: list[AgentReranker]
) -> tuple[dict[str, list[TaskResult]], dict[str, float]]:
    """Every system's sessions over ``tasks`` (each system closed after): the results and the
    wall seconds, by system name."""
    per_system: dict[str, list[TaskResult]] = {}
    walls: dict[str, float] = {}
    try:
        for reranker in systems:
            progress = progress_printer(reranker.name, len(tasks), config.progress_every)
            per_system[reranker.name], walls[reranker.name] = run_sessions(
                tasks,
                corpus,
                reranker,
                agents=config.agents,
                ramp_s=config.ramp_s,
                budget=config.budget,
                depth=config.depth,
                first_stage_k=config.first_stage_k,
                progress=progress,
            )
    finally:
        close_all(systems)
    return per_system, walls


def retries(systems: list[AgentReranker], ran: set[str]) -> dict[str, dict[str, Any]]:
    """The answers each endpoint system that ran had to send again: ``refused_retried``
    (503/429) and, where it counts them, ``server_errors_retried`` (500/502)."""
    out: dict[str, dict[str, Any]] = {}
    for reranker in systems:
        refused = getattr(reranker, "refused", None)
        if refused is not None and reranker.name in ran:
            out.setdefault(reranker.name, {})["refused_retried"] = refused
            resent = getattr(reranker, "server_errors", None)
            if resent is not None:
                out[reranker.name]["server_errors_retried"] = resent
    return out


def run(config: AgentBenchConfig) -> dict[str, Any]:
    """Run every system on the same tasks and write ``agent_bench.{json,md,png}`` into ``out``."""
    started = time.perf_counter()
    tasks, corpus = load_tasks(config)
    systems = make_rerankers(config, tasks)
    per_system, walls = run_systems(config, tasks, corpus, systems)
    common = set.intersection(*({r.task_id for r in rs if r.solved} for rs in per_system.values()))
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "json": str(out / "agent_bench.json"),
        "markdown": str(out / "agent_bench.md"),
        "chart": str(out / "agent_bench.png"),
    }
    summaries_extra = retries(systems, set(per_system))
    report = {
        "config": config.public(),
        "n_tasks": len(tasks),
        "corpus_size": len(corpus),
        "systems": {
            name: summarize_system(results, walls[name], common) | summaries_extra.get(name, {})
            for name, results in per_system.items()
        },
        "common_tasks": len(common),
        "tests": paired_tests(per_system, config.n_resamples, config.seed),
        "tasks": {
            name: [r.outcome() | {"rerank_s": r.rerank_s, "tokens": r.tokens} for r in results]
            for name, results in per_system.items()
        },
        "files": files,
    }
    write_bench_chart(per_system, config.budget, Path(files["chart"]))
    report["wall_s"] = time.perf_counter() - started
    Path(files["json"]).write_text(json.dumps(report, indent=1), encoding="utf-8")
    write_bench_markdown(report, Path(files["markdown"]))
    return report
