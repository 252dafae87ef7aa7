"""``acare eval``: rerank a labelled search set in several modes and compare them.

One Ray Data job scores every search in every mode (``ScorerActor`` with several modes, into
``<report_dir>/rerank``, resumable); the driver then streams the labels and the rankings back,
computes the measures with :func:`acare_ray.eval.ir_metrics.evaluate` (trec_eval semantics), a
bootstrap CI per mode and measure, and paired tests between every two modes with Holm
correction per measure. It writes ``report.json``, ``report.md``, ``metrics.png``, one TREC run
per mode (``runs/<mode>.trec``) and ``qrels.trec``; :func:`format_table` prints the result.

Which queries count: searches with at least one candidate of relevance >= 1 that were scored
without error in every mode (so all modes are compared on the same queries). The others are
counted in the report (``queries``), never silently left out. Labels are the candidates'
``relevance``; a search whose relevant document the first stage missed has none and is
reported as ``no_relevant_candidate``.

**Systems.** Beside the modes the report has, on the same searches, measures and tests (session
replay and session-paired tests included): the fused systems ``<mode>+<fusion>`` (each mode's
scores of the one rerank pass fused with the first stage, :mod:`acare_ray.ranking.fusion`; no
rescoring), ``first_stage`` (the candidates' first-stage order: ``first_stage_rank``, then
``first_stage_score``, then list order) and ``agent_order`` where candidates carry
``agent_rank`` (agent passages in that order, then the rest in first-stage order). Every system
is ordered by the one tie rule of :func:`acare_ray.ranking.fusion.order` and evaluated from its order
(run files carry ``-rank`` as the score, so trec_eval's doc-id tie-break never acts).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from acare_ray.eval.bands import first_stage_bands
from acare_ray.eval.ir_metrics import (
    DEFAULT_MEASURES,
    bootstrap_ci,
    evaluate,
    parse_measure,
    write_trec_qrels,
    write_trec_run,
)
from acare_ray.offline.actor import ScorerActor
from acare_ray.offline.job import ActorPool, Job, JobCounts, actor_scorer, ray_session, run_job
from acare_ray.offline.report import format_table, write_chart, write_markdown
from acare_ray.offline.resume import storage_paths
from acare_ray.offline.session_eval import (
    Significance,
    load_column,
    load_sessions,
    paired_comparisons,
    session_section,
)
from acare_ray.ranking.checkpoint_settings import read_fusion
from acare_ray.ranking.fusion import (
    FusionConfig,
    first_stage_ranks,
    fuse,
    ranked_run,
    resolve_fusion,
)
from acare_ray.scoring import Mode, ScorerSettings, parse_mode

TESTS = ("randomization", "bootstrap")
FIRST_STAGE = "first_stage"


@dataclass(frozen=True)
class EvalConfig:
    """``input``: searches Parquet with candidate ``relevance`` labels; ``report_dir``: where
    the report, run files and the resumable rerank output go.

    ``test``: paired ``randomization`` (sign flip) or ``bootstrap`` test, ``n_resamples``
    draws; ``alpha`` applies to Holm-adjusted p-values; CIs are percentile bootstrap at
    ``confidence``.

    ``sessions``: also replay each session (:mod:`acare_ray.offline.session_eval`, each search
    returning its top ``session_depth`` unseen documents) and test session-paired.
    ``group_by``: an input column (e.g. ``agent``); every figure is also reported per value.

    ``fusion``: the fusion settings whose fused systems are reported for every mode (``auto``:
    the checkpoint's fitted setting, if it has one; ``none`` adds nothing); ``first_stage``:
    report the ``first_stage`` and ``agent_order`` systems.
    """

    input: str
    model: str
    report_dir: str
    modes: tuple[str, ...] = ("M0", "M2", "M3")
    measures: tuple[str, ...] = DEFAULT_MEASURES
    test: str = Significance.test
    n_resamples: int = Significance.n_resamples
    confidence: float = Significance.confidence
    alpha: float = Significance.alpha
    seed: int = Significance.seed
    pool: ActorPool = field(default_factory=ActorPool)
    revision: str | None = None
    scorer: ScorerSettings = field(default_factory=ScorerSettings)
    ray_address: str | None = None
    sessions: bool = False
    session_depth: int = 10
    group_by: str | None = None
    fusion: tuple[str, ...] = ("auto",)
    first_stage: bool = True

    def __post_init__(self) -> None:
        for setting in self.fusion:
            resolve_fusion(setting, None)
        if self.session_depth < 1:
            raise ValueError(f"session_depth must be >= 1, got {self.session_depth}")
        modes = tuple(parse_mode(m) for m in self.modes)
        if not modes or not all(isinstance(m, Mode) for m in modes):
            raise ValueError(f"modes must be one or more of M0..M3, got {self.modes!r}")
        if len(set(modes)) != len(modes):
            raise ValueError(f"modes repeat: {self.modes!r}")
        object.__setattr__(self, "modes", tuple(m.value for m in modes))
        measures = tuple(f"{kind}@{k}" for kind, k in map(parse_measure, self.measures))
        object.__setattr__(self, "measures", measures)
        if self.test not in TESTS:
            raise ValueError(f"test must be one of {TESTS}, got {self.test!r}")

    @property
    def significance(self) -> Significance:
        return Significance(self.test, self.n_resamples, self.seed, self.confidence, self.alpha)


def texts(array: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """A string array as Python strings; values that are not valid UTF-8 (a bad cell in the
    input) come back in :func:`~acare_ray.offline.resume.canonical_id` form instead of failing
    the whole evaluation (their search's rerank row already carries the error)."""
    try:
        return array.to_pylist()
    except UnicodeDecodeError:
        from acare_ray.offline.resume import canonical_id

        raw = pc.cast(array, pa.binary()).to_pylist()
        return [None if value is None else canonical_id(value) for value in raw]


def load_qrels(path: str) -> dict[str, dict[str, int]]:
    """``{search_id: {doc_id: relevance}}`` from the candidates' labels (unjudged left out),
    streaming the input in batches and reading only ids and labels from the candidate lists."""
    fs, inner, _ = storage_paths(path)
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    qrels: dict[str, dict[str, int]] = {}
    for batch in dataset.to_batches(columns=["search_id", "candidates"]):
        candidates = batch.column("candidates")
        flat = pc.list_flatten(candidates)
        parents = pc.list_parent_indices(candidates).to_pylist()
        doc_ids = texts(pc.struct_field(flat, "doc_id"))
        labels = pc.struct_field(flat, "relevance").to_pylist()
        ids = texts(batch.column("search_id"))
        for parent, doc_id, rel in zip(parents, doc_ids, labels):
            qid = ids[parent]
            if qid is not None and doc_id is not None and rel is not None:
                qrels.setdefault(qid, {})[doc_id] = int(rel)
    return qrels


def load_questions(path: str) -> dict[str, str]:
    """``{search_id: question key}`` (:func:`acare_ray.eval.splits.question_keys`), reading only the
    key columns of the input."""
    from acare_ray.eval.splits import KEY_COLUMNS, question_keys

    fs, inner, _ = storage_paths(path)
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    columns = [c for c in KEY_COLUMNS if c in dataset.schema.names]
    table = dataset.to_table(columns=columns)
    return dict(zip(texts(table.column("search_id")), question_keys(table), strict=True))


FirstStageLists = dict[str, tuple[list[str], list, list, list]]


def load_first_stage(path: str) -> FirstStageLists:
    """``{search_id: (doc_ids, first_stage_scores, first_stage_ranks, agent_ranks)}`` in
    candidate order (None where a candidate lacks the value), streamed from the input."""
    fs, inner, _ = storage_paths(path)
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    fields = {f.name for f in dataset.schema.field("candidates").type.value_type}
    out: FirstStageLists = {}
    for batch in dataset.to_batches(columns=["search_id", "candidates"]):
        candidates = batch.column("candidates")
        flat = pc.list_flatten(candidates)
        parents = pc.list_parent_indices(candidates).to_pylist()
        n = len(flat)
        values = [texts(pc.struct_field(flat, "doc_id"))] + [
            pc.struct_field(flat, name).to_pylist() if name in fields else [None] * n
            for name in ("first_stage_score", "first_stage_rank", "agent_rank")
        ]
        ids = texts(batch.column("search_id"))
        for parent, doc_id, score, rank, agent in zip(parents, *values):
            qid = ids[parent]
            if qid is None or doc_id is None:
                continue
            entry = out.setdefault(qid, ([], [], [], []))
            for column, value in zip(entry, (doc_id, score, rank, agent)):
                column.append(value)
    return out


def first_stage_runs(first: FirstStageLists) -> dict[str, dict[str, dict[str, float]]]:
    """The ``first_stage`` run of every search, and the ``agent_order`` run when any
    candidate has an ``agent_rank``."""
    runs: dict[str, dict[str, dict[str, float]]] = {FIRST_STAGE: {}}
    has_agent = any(a is not None for _, _, _, agents in first.values() for a in agents)
    if has_agent:
        runs["agent_order"] = {}
    for qid, (doc_ids, scores, ranks, agents) in first.items():
        try:
            fs_rank = first_stage_ranks(len(doc_ids), scores, ranks)
        except ValueError:
            continue  # an invalid row: the rerank job reports it as an error row
        runs[FIRST_STAGE][qid] = ranked_run(doc_ids, fs_rank.argsort())
        if has_agent:
            by_agent = sorted(
                range(len(doc_ids)), key=lambda i: (agents[i] is None, agents[i] or 0, fs_rank[i])
            )
            runs["agent_order"][qid] = ranked_run(doc_ids, by_agent)
    return runs


def ordered_runs(
    scores: dict[str, dict[str, dict[str, float]]],
    first: FirstStageLists,
    fusions: tuple[FusionConfig, ...] = (),
) -> dict[str, dict[str, dict[str, float]]]:
    """Each mode's run ordered by the tie rule, and ``<mode>+<fusion>`` for every fusion:
    ``-rank`` runs (:func:`acare_ray.ranking.fusion.ranked_run`) from the one set of raw scores."""
    runs: dict[str, dict[str, dict[str, float]]] = {}
    for mode, by_search in scores.items():
        systems = [(mode, FusionConfig())] + [(f"{mode}+{f.label}", f) for f in fusions]
        for name, _ in systems:
            runs[name] = {}
        for qid, by_doc in by_search.items():
            doc_ids, fs_scores, fs_ranks, _ = first.get(qid, (list(by_doc), None, None, None))
            if set(doc_ids) != set(by_doc):  # a ranking cut to top k: its own order only
                doc_ids, fs_scores, fs_ranks = list(by_doc), None, None
            values = [by_doc[d] for d in doc_ids]
            for name, fusion in systems:
                fused = fuse(values, fusion, fs_scores, fs_ranks)
                runs[name][qid] = ranked_run(doc_ids, fused.order)
    return runs


def load_runs(
    path: str, modes: tuple[str, ...]
) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, int]]:
    """``{mode: {search_id: {doc_id: score}}}`` (raw scores) of the rows scored without error,
    and the number of error rows per mode."""
    fs, inner, _ = storage_paths(path)
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    runs: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in modes}
    errored = dict.fromkeys(modes, 0)
    for batch in dataset.to_batches(columns=["search_id", "mode", "ranking", "error"]):
        failed = pc.is_valid(batch.column("error"))
        for mode in pc.filter(batch.column("mode"), failed).to_pylist():
            errored[mode] = errored.get(mode, 0) + 1
        batch = batch.filter(pc.and_(pc.invert(failed), pc.is_valid(batch.column("search_id"))))
        rankings = batch.column("ranking")
        flat = pc.list_flatten(rankings)
        parents = pc.list_parent_indices(rankings).to_pylist()
        doc_ids = pc.struct_field(flat, "doc_id").to_pylist()
        scores = pc.struct_field(flat, "score").to_pylist()
        ids, row_modes = batch.column("search_id").to_pylist(), batch.column("mode").to_pylist()
        for qid, mode in zip(ids, row_modes):
            if mode in runs:
                runs[mode][qid] = {}
        for parent, doc_id, score in zip(parents, doc_ids, scores):
            if row_modes[parent] in runs:
                runs[row_modes[parent]][ids[parent]][doc_id] = score
    return runs, errored


def select_queries(
    qrels: dict[str, dict[str, int]], runs: dict[str, dict[str, dict[str, float]]]
) -> tuple[list[str], dict[str, int]]:
    """Queries with a relevant candidate and a ranking in every mode; counts of the rest."""
    relevant = {q for q, judged in qrels.items() if any(r > 0 for r in judged.values())}
    scored = set.intersection(*(set(run) for run in runs.values()))
    chosen = sorted(relevant & scored)
    counts = {
        "labelled": len(qrels),
        "evaluated": len(chosen),
        "no_relevant_candidate": len(set(qrels) - relevant),
        "not_scored_in_every_mode": len(relevant - scored),
    }
    return chosen, counts


def compare_modes(
    per_query: dict[str, dict[str, dict[str, float]]], config: EvalConfig
) -> list[dict[str, Any]]:
    """Paired tests (by search) for every two systems and every measure; Holm across the pairs
    of a measure (:func:`acare_ray.offline.session_eval.paired_comparisons`)."""
    return paired_comparisons(
        per_query, list(per_query), config.measures, config.significance, "n_queries"
    )


def _input_notes(path: str) -> dict[str, Any]:
    """``acare.*`` entries of the input's schema metadata (e.g. BM25 recall of the open set)."""
    fs, inner, _ = storage_paths(path)
    metadata = pads.dataset(inner, filesystem=fs, format="parquet").schema.metadata or {}
    notes = {}
    for key, value in metadata.items():
        if key.startswith(b"acare."):
            try:
                notes[key.decode()] = json.loads(value)
            except ValueError:
                notes[key.decode()] = value.decode(errors="replace")
    return notes


def _restrict(per_query: dict, qids: list[str]) -> dict:
    return {
        mode: {m: {q: values[q] for q in qids} for m, values in by_measure.items()}
        for mode, by_measure in per_query.items()
    }


def _metrics(per_query: dict, qids: list[str], config: EvalConfig) -> dict[str, dict]:
    """``{mode: {measure: {mean, ci_low, ci_high}}}`` over ``qids``."""
    metrics: dict[str, dict] = {}
    for mode in per_query:
        metrics[mode] = {}
        for measure in config.measures:
            values = [per_query[mode][measure][q] for q in qids]
            mean, low, high = bootstrap_ci(
                values, config.n_resamples, config.seed, config.confidence
            )
            metrics[mode][measure] = {"mean": mean, "ci_low": low, "ci_high": high}
    return metrics


def _by_first_stage(per_query: dict, config: EvalConfig) -> dict[str, Any] | None:
    """Every system's mean per band of the first stage's own value of the first measure
    (:mod:`acare_ray.eval.bands`); None without the first stage."""
    if FIRST_STAGE not in per_query:
        return None
    measure = config.measures[0]
    values = {system: by_measure[measure] for system, by_measure in per_query.items()}
    return {
        "measure": measure,
        "baseline": FIRST_STAGE,
        "bands": first_stage_bands(values, FIRST_STAGE),
    }


def _sessions(data, runs, per_query, config: EvalConfig, keep=None) -> dict[str, Any]:
    """The session section over every system (``runs``' keys)."""
    options = {"keep": keep} if keep is not None else {}
    return session_section(
        data,
        runs,
        per_query,
        list(runs),
        depth=config.session_depth,
        significance=config.significance,
        **options,
    )


def _groups(group_of, qids, sessions, runs, per_query, config: EvalConfig) -> dict[str, Any]:
    """The per-search figures (and the session section) for each value of ``group_by``."""
    out = {}
    for value in sorted({group_of.get(q) for q in qids}, key=str):
        chosen = [q for q in qids if group_of.get(q) == value]
        section: dict[str, Any] = {"queries": len(chosen)}
        if len(chosen) >= 2:
            restricted = _restrict(per_query, chosen)
            section["metrics"] = _metrics(restricted, chosen, config)
            section["comparisons"] = compare_modes(restricted, config)
        if sessions is not None:
            section["sessions"] = _sessions(
                sessions,
                runs,
                per_query,
                config,
                keep=lambda s, v=value: sessions.group_of.get(s) == v,
            )
        out[str(value)] = section
    return out


def fusions(config: EvalConfig) -> tuple[FusionConfig, ...]:
    """The enabled fusion settings of ``config`` (``auto`` resolved for its model), once each."""
    fitted = read_fusion(config.model)
    out: list[FusionConfig] = []
    for setting in config.fusion:
        fusion = resolve_fusion(setting, fitted)
        if fusion.enabled and fusion not in out:
            out.append(fusion)
    return tuple(out)


def _file_name(system: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+=-]", "_", system)


@dataclass(frozen=True)
class Judged:
    """Every system's ranking of the searches that can be compared: ``qids`` (a relevant
    candidate, scored in every mode; ``query_counts`` says why the others are not), their
    ``qrels``, ``runs`` (``{system: {search_id: {doc_id: score}}}``, every scored search),
    ``errored`` rerank rows and the ``fusions`` whose fused systems are in ``runs``."""

    qrels: dict[str, dict[str, int]]
    runs: dict[str, dict[str, dict[str, float]]]
    qids: list[str]
    query_counts: dict[str, int]
    errored: int
    fusions: tuple[FusionConfig, ...]

    @property
    def systems(self) -> list[str]:
        return list(self.runs)


def _score(config: EvalConfig, rerank_dir: str) -> JobCounts:
    """The rerank job scoring every input search in every mode into ``rerank_dir``."""
    options = actor_scorer(config.scorer, config.revision)
    job = Job(
        "eval",
        config.input,
        rerank_dir,
        ScorerActor,
        actor_kwargs={"model": config.model, "modes": config.modes, "scorer_options": options},
        manifest={"model": config.model, "modes": list(config.modes), "scorer": options},
        key_column="mode",
        rows_per_input=len(config.modes),
    )
    with ray_session(config.ray_address):
        return run_job(job, config.pool)


def _judged(config: EvalConfig, rerank_dir: str) -> Judged:
    """Every system's ranking (modes, fused, first stage) and the searches to compare them on;
    fewer than 2 such searches is a ValueError."""
    qrels = load_qrels(config.input)
    scores, errored = load_runs(rerank_dir, config.modes)
    first = load_first_stage(config.input)
    fused_with = fusions(config)
    runs = ordered_runs(scores, first, fused_with)
    if config.first_stage:
        runs |= first_stage_runs(first)
    qids, query_counts = select_queries(qrels, runs)
    if len(qids) < 2:
        raise ValueError(
            f"{config.input}: only {len(qids)} searches have a relevant candidate and were "
            f"scored in every mode ({query_counts}); need at least 2 to compare modes"
        )
    chosen = {q: qrels[q] for q in qids}
    return Judged(chosen, runs, qids, query_counts, errored, fused_with)


def _write_trec(judged: Judged, config: EvalConfig, out: Path) -> tuple[dict[str, Any], dict]:
    """The qrels and each system's run as TREC files under ``out``, and the per-search
    measures of each system: (files, ``{system: {measure: {search_id: value}}}``)."""
    files: dict[str, Any] = {"qrels": str(out / "qrels.trec"), "runs": {}}
    write_trec_qrels(judged.qrels, files["qrels"])
    per_query = {}
    for system in judged.systems:
        files["runs"][system] = str(out / "runs" / f"{_file_name(system)}.trec")
        chosen_run = {q: judged.runs[system][q] for q in judged.qids}
        write_trec_run(chosen_run, files["runs"][system], tag=f"acare-{system}")
        per_query[system] = evaluate(judged.qrels, chosen_run, config.measures).per_query
    return files, per_query


def _report(config: EvalConfig, judged: Judged, per_query: dict, counts: JobCounts) -> dict:
    """The report's figures (``report.json`` less its files and wall time)."""
    sessions = load_sessions(config.input, config.group_by) if config.sessions else None
    group_of = None
    if config.group_by is not None:
        group_of = load_column(config.input, config.group_by)
    runs, qids = judged.runs, judged.qids
    return {
        "model": config.model,
        "input": config.input,
        "input_notes": _input_notes(config.input),
        "modes": list(config.modes),
        "systems": judged.systems,
        "fusion": [f.label for f in judged.fusions],
        "measures": list(config.measures),
        "queries": {**judged.query_counts, "errored_rows": judged.errored},
        "metrics": _metrics(per_query, qids, config),
        "significance": {
            "test": config.test,
            "n_resamples": config.n_resamples,
            "correction": "holm (per measure, across system pairs)",
            "alpha": config.alpha,
            "confidence": config.confidence,
            "comparisons": compare_modes(per_query, config),
        },
        "job": counts.as_dict(),
        **({"by_first_stage": bands} if (bands := _by_first_stage(per_query, config)) else {}),
        **({"sessions": _sessions(sessions, runs, per_query, config)} if sessions else {}),
        **(
            {"groups": _groups(group_of, qids, sessions, runs, per_query, config)}
            if group_of
            else {}
        ),
        "config": {**asdict(config)},
    }


def run(config: EvalConfig) -> dict[str, Any]:
    """Rerank in every mode, evaluate, write the report files; returns the report (the content
    of ``report.json``)."""
    started = time.perf_counter()
    out = Path(config.report_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    rerank_dir = str(out / "rerank")
    counts = _score(config, rerank_dir)
    judged = _judged(config, rerank_dir)
    files, per_query = _write_trec(judged, config, out)
    report = _report(config, judged, per_query, counts)
    report["files"] = files
    files |= {
        "json": str(out / "report.json"),
        "markdown": str(out / "report.md"),
        "chart": str(out / "metrics.png"),
        "rerank_output": rerank_dir,
    }
    write_chart(report, files["chart"])
    report["wall_s"] = time.perf_counter() - started
    write_markdown(report, files["markdown"])
    Path(files["json"]).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


__all__ = ["EvalConfig", "format_table", "run"]
