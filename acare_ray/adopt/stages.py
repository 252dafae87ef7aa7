"""The stages of ``acare adopt``. Each writes ``<work_dir>/<stage>.json`` when it ends and is
skipped when that file exists, so a stopped run resumes stage by stage (a stage that was cut
short resumes its own jobs: Ray Data outputs and Ray Train runs resume by themselves).

- ``data``: each source read (traces imported, a searches file, or a built-in data set), split
  by question (the project's one split), LCE groups built from the train and validation parts.
- ``baseline``: the base reranker untrained, in ``baseline_modes``, beside the first stage and
  the agent's own order on the test questions (the zero-training control).
- ``mine`` (only with a ``mine`` section): the training searches scored by an earlier run's
  checkpoint of this seed (one round of self-mining) or by a sentence-embedding model (a second
  retriever), and the groups rebuilt with its hard negatives.
- ``train``: Ray Train until the validation nDCG@10 (M3) stops improving (patience), within a
  step and a time budget; the best checkpoint is the result.
- ``fit``: the fusion fitted on the validation questions by the safety rule, stored with the
  checkpoint (M3); the M0 fit is reported beside it, not stored.
- ``test``: every system side by side on the test questions, with session-paired tests (Holm),
  overall and per agent.
- ``cost``: latency and tokens per search at the configured candidate counts.
- ``loop`` (only with ``loop`` flags): ``acare agent-bench`` with the checkpoint.
- ``report``: the decision, as markdown and a PNG chart.

``data`` and ``baseline`` do not depend on the training seed and sit in ``work_dir``, as does
a dense miner's ``mine`` round (``work_dir/mine-dense``); the other stages sit in
``work_dir/seed<N>``, so the seeds of one config share their data and their dense mining.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acare_ray.adopt.config import AdoptConfig, SourceSpec
from acare_ray.data.io import read_parquet, write_parquet
from acare_ray.eval.splits import question_keys, split_values

if TYPE_CHECKING:
    from acare_ray.scoring import ScorerSettings

log = logging.getLogger("acare_ray.adopt")

MEASURES = ("nDCG@10", "Recall@10", "RR@10")
SELECT_METRIC = "val/nDCG@10/M3"
TRAIN_DEFAULTS: dict[str, Any] = {
    "workers": 2,
    "cpus_per_worker": 1,
    "batch_groups": 2,
    "grad_accum": 2,
    "lr": 1e-4,
    "temperature": 0.5,
    "max_steps": 660,
    "checkpoint_every": 30,
    "keep_checkpoints": 1,
    "patience": 4,
    "val_max_groups": 240,
    "max_failures": 3,
    "log_every": 10,
    "scorer": {"max_length": 320},
    "cpu_bf16": "auto",
    "time_budget_s": 14400.0,
}


SHARED_STAGES = ("data", "baseline")
"""Stages that do not depend on the training seed: under ``work_dir``; the others go under
``work_dir/seed<N>``."""


def mine_folder(config: AdoptConfig) -> Path:
    """Where the ``mine`` stage's report (``mine.json``) and groups (``groups/``) sit. A
    checkpoint miner is this seed's earlier run: ``work_dir/seed<N>``. A dense miner reads no
    checkpoint and its random negatives are drawn with the split seed, so its round is the same
    for every training seed: it is mined once, in ``work_dir/mine-dense``, and every seed trains
    on it (a seed folder that already holds its own round, mined before the round was shared,
    keeps it, so a stopped run resumes on the groups it started with)."""
    if config.mine is None or config.mine.dense is None:
        return config.seed_dir
    if (config.seed_dir / "mine.json").exists():
        return config.seed_dir
    return config.work / "mine-dense"


def stage_file(config: AdoptConfig, stage: str) -> Path:
    if stage == "mine":
        return mine_folder(config) / "mine.json"
    folder = config.work if stage in SHARED_STAGES else config.seed_dir
    return folder / f"{stage}.json"


def done(config: AdoptConfig, stage: str) -> dict[str, Any] | None:
    path = stage_file(config, stage)
    return json.loads(path.read_text()) if path.exists() else None


def finish(config: AdoptConfig, stage: str, result: dict[str, Any]) -> dict[str, Any]:
    path = stage_file(config, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(path)
    return result


# ---------------------------------------------------------------- data


def read_source(spec: SourceSpec) -> pa.Table:
    """The source's searches table (traces imported, with lost documents refused)."""
    if spec.traces:
        from acare_ray.data.traces import import_traces

        result = import_traces(spec.trace_files(), spec.format, spec.gold, spec.k)
        lost = [str(p) for p in result.problems if p.lost_documents]
        if lost:
            raise ValueError(
                f"sources[{spec.name!r}]: {len(lost)} search(es) lost their documents: "
                + "; ".join(lost[:5])
            )
        return result.table
    if spec.searches:
        return read_parquet(spec.searches)
    if spec.builtin == "musique":
        from acare_ray.data.musique import musique_searches

        return musique_searches("distractor")
    from acare_ray.data.hotpotqa import hotpotqa_searches

    return hotpotqa_searches()


def split_source(spec: SourceSpec, table: pa.Table, seed: int) -> dict[str, pa.Table]:
    """``{"train", "validation", "test"}`` rows of a source, by question (``split_by`` names
    the key column where given); BM25 first-stage scores added to the non-test rows when
    ``bm25`` (pooled over them, so test documents never shape the training data)."""
    if spec.split_by:
        if spec.split_by not in table.column_names:
            raise ValueError(f"sources[{spec.name!r}]: split_by column {spec.split_by!r} missing")
        keys = [str(k) for k in table.column(spec.split_by).to_pylist()]
    else:
        keys = question_keys(table)
    parts = split_values(keys, test=spec.test, validation=spec.validation, seed=seed)
    labels = pa.array([parts[k] for k in keys], pa.string())
    test = table.filter(pc.equal(labels, "test"))
    rest = table.filter(pc.not_equal(labels, "test"))
    rest_labels = labels.filter(pc.not_equal(labels, "test"))
    if spec.bm25:
        from acare_ray.data.groups import with_bm25_scores

        rest = with_bm25_scores(rest)
    return {
        "train": rest.filter(pc.equal(rest_labels, "train")),
        "validation": rest.filter(pc.equal(rest_labels, "validation")),
        "test": test,
    }


def _labels_from_gold(table: pa.Table) -> pa.Table:
    """Groups are labelled by the question's gold pages, not the agent's judgement: a failed
    trajectory's searches are as well labelled as a successful one's (``judge_ok`` cleared)."""
    if "judge_ok" not in table.column_names:
        return table
    index = table.schema.get_field_index("judge_ok")
    return table.set_column(index, "judge_ok", pa.nulls(table.num_rows, pa.bool_()))


def count_cuts(groups: pa.Table, model: str, settings: ScorerSettings) -> dict[str, Any]:
    """(M3 prompt, document) pairs longer than the scorer's room, i.e. cut when scored."""
    from acare_ray.scoring import AgentContext, Scorer
    from acare_ray.scoring.untrusted import encode_capped

    backend = Scorer.from_settings(model, settings).backend
    pairs = cut = 0
    for row in groups.to_pylist():
        context = AgentContext(row["sub_query"], row["question"], row["reasoning"])
        mode = context.resolve_mode("auto")
        room = backend.document_room(backend.context_tokens(context.for_mode(mode), mode))
        docs = [row["positive"]["text"], *(d["text"] for d in row["negatives"])]
        lengths = [len(ids) for ids in encode_capped(backend.inert, docs, [room + 1] * len(docs))]
        pairs += len(docs)
        cut += sum(n > room for n in lengths)
    return {"pairs": pairs, "cut": cut, "share": cut / max(pairs, 1)}


def data_stage(config: AdoptConfig) -> dict[str, Any]:
    from acare_ray.data.groups import group_stats, searches_to_groups

    work = config.work
    summary: dict[str, Any] = {"sources": {}, "negatives": config.negatives, "hard": config.hard}
    val_tables = []
    settings = scorer_settings(config)
    for spec in config.sources:
        parts = split_source(spec, read_source(spec), config.split_seed)
        for name, part in parts.items():
            write_parquet(part, work / "data" / f"{spec.name}_{name}.parquet")
        groups = searches_to_groups(
            _labels_from_gold(parts["train"]), config.negatives, config.split_seed, config.hard
        )
        val = searches_to_groups(
            _labels_from_gold(parts["validation"]),
            config.negatives,
            config.split_seed,
            config.hard,
        )
        write_parquet(groups, work / "groups" / f"{spec.name}.parquet")
        val_tables.append(val.replace_schema_metadata(None))
        summary["sources"][spec.name] = {
            "searches": {name: part.num_rows for name, part in parts.items()},
            "questions": {
                name: len(set(question_keys(p))) if p.num_rows else 0 for name, p in parts.items()
            },  # fmt: skip
            "groups": groups.num_rows,
            "validation_groups": val.num_rows,
            "skipped": vars(group_stats(groups)),
            "weight": spec.weight,
            "cuts": count_cuts(groups, config.model, settings) if groups.num_rows else None,
        }
        log.info("[data] %s: %s", spec.name, summary["sources"][spec.name])
    write_parquet(pa.concat_tables(val_tables), work / "groups" / "validation.parquet")
    return summary


# ---------------------------------------------------------------- self-mined hard negatives


def _miner_scores(folder: Path) -> tuple[dict[str, dict[str, float]], list[str]]:
    """``({search_id: {doc_id: score}}, [search ids whose row carries an error])`` of a rerank
    job's output folder."""
    scores, errors = {}, []
    for row in read_parquet(str(folder)).to_pylist():
        if row["error"]:
            errors.append(row["search_id"])
            continue
        scores[row["search_id"]] = {r["doc_id"]: float(r["score"]) for r in row["ranking"]}
    return scores, errors


def with_miner_scores(table: pa.Table, scores: dict[str, dict[str, float]]) -> pa.Table:
    """``table`` (``SEARCHES``-shaped) with each scored candidate's ``first_stage_score`` set to
    the miner's score, so :func:`acare_ray.data.groups.searches_to_groups` takes its hard
    negatives from the miner; a search the miner could not score keeps its own scores."""
    rows = table.to_pylist()
    for row in rows:
        mined = scores.get(row["search_id"])
        if mined is None:
            continue
        for candidate in row["candidates"]:
            candidate["first_stage_score"] = mined.get(candidate["doc_id"])
    return pa.Table.from_pylist(rows, schema=table.schema)


def _mined_signal(
    mined: pa.Table, first_stage: pa.Table, scores: dict[str, dict[str, float]], hard: int
) -> dict[str, Any]:
    """How much the mined groups differ from the first-stage ones: the share of mined hard
    negatives that were first-stage-hard too, and the share of groups whose positive the miner
    scores below its hardest negative (the errors a second round can learn from)."""
    before = {
        row["group_id"]: {d["doc_id"] for d in row["negatives"][:hard]}
        for row in first_stage.to_pylist()
    }  # fmt: skip
    shared = total = wrong = 0
    for row in mined.to_pylist():
        hardest = [d["doc_id"] for d in row["negatives"][:hard]]
        shared += len(set(hardest) & before.get(row["group_id"], set()))
        total += len(hardest)
        group = row["group_id"]  # the search id, "#k" added when a search has k positives
        search = scores.get(group) or scores.get(group.rsplit("#", 1)[0], {})
        top = max((search.get(d) for d in hardest if d in search), default=None)
        positive = search.get(row["positive"]["doc_id"])
        wrong += top is not None and positive is not None and top > positive
    return {
        "hard_shared_with_first_stage": shared / max(total, 1),
        "positive_below_hardest": wrong / max(mined.num_rows, 1),
    }


def _folded(text: Any) -> str:
    """Lower-cased, runs of white space made one space: how answers and pages are compared."""
    return " ".join(str(text or "").lower().split())


def _usable_answer(answer: Any) -> str | None:
    """The answer as a lower-cased string a page can be checked for, or None where a match
    would say nothing (no answer, yes/no, one character)."""
    text = _folded(answer)
    return None if len(text) < 2 or text in ("yes", "no") else text


def answer_signal(table: pa.Table, groups: pa.Table, first_stage: pa.Table, hard: int) -> dict:
    """How often a "negative" names the question's answer: a page that does may be relevant
    though not judged so (the multi-hop question's answer page is one gold page of several, and
    other pages name it too). ``table`` holds the searches with the miner's scores as
    ``first_stage_score`` (:func:`with_miner_scores`); over searches with a usable answer (not
    yes/no), the share of the miner's top-scored negative, of the mined hard negatives and of
    the first stage's that contain the answer."""
    rows = table.to_pylist()
    answers = {r["search_id"]: _usable_answer(r.get("answer")) for r in rows}
    top = tops = 0
    for row in rows:
        answer = answers[row["search_id"]]
        negatives = [c for c in row["candidates"]
                     if c["relevance"] is not None and c["relevance"] <= 0
                     and c["first_stage_score"] is not None]  # fmt: skip
        if answer is None or not negatives:
            continue
        best = max(negatives, key=lambda c: c["first_stage_score"])
        tops += 1
        top += answer in _folded(best["text"])

    def share(groups: pa.Table) -> float:
        hits = total = 0
        for row in groups.to_pylist():
            answer = answers.get(row["group_id"].rsplit("#", 1)[0])
            if answer is None:
                continue
            for doc in row["negatives"][:hard]:
                total += 1
                hits += answer in _folded(doc["text"])
        return hits / max(total, 1)

    return {
        "answer_searches": tops,
        "miner_top_negative_with_answer": top / max(tops, 1),
        "hard_with_answer": share(groups),
        "first_stage_hard_with_answer": share(first_stage),
    }


def mine_stage(config: AdoptConfig) -> dict[str, Any]:
    """One round of mined hard negatives (:class:`~acare_ray.adopt.config.MineSpec`): every
    source's training searches scored by the miner (the checkpoint of this seed of an earlier
    run, with ``acare rerank`` on Ray Data, or a ``dense:`` sentence-embedding model,
    :mod:`acare_ray.data.dense`), then each source's groups rebuilt with the miner's hard
    negatives, under :func:`mine_folder` (``work_dir/seed<N>``, or ``work_dir/mine-dense`` for
    every seed of a dense miner)."""
    from acare_ray.data.dense import DenseEncoder, dense_scores
    from acare_ray.data.groups import group_stats, searches_to_groups

    spec = config.mine
    encoder = DenseEncoder.load(spec.dense) if spec.dense else None
    miner = spec.miner if spec.dense else spec.checkpoint(config.seed)
    out: dict[str, Any] = {"miner": miner, "mode": spec.mode, "hard": spec.hard,
                           "skip": spec.skip, "init": spec.init, "sources": {}}  # fmt: skip
    for source in config.sources:
        searches = read_parquet(str(config.work / "data" / f"{source.name}_train.parquet"))
        started = time.perf_counter()
        if encoder is not None:
            scores, errors = dense_scores(searches.to_pylist(), encoder, spec.mode)
            searched = searches.num_rows
        else:
            scores, errors, searched = _rerank_scores(config, source.name, miner)
        table = _labels_from_gold(with_miner_scores(searches, scores))
        groups = searches_to_groups(
            table, config.negatives, config.split_seed, spec.hard, spec.skip
        )
        write_parquet(groups, mine_folder(config) / "groups" / f"{source.name}.parquet")
        first_stage = read_parquet(str(config.work / "groups" / f"{source.name}.parquet"))
        out["sources"][source.name] = {
            "searches": searched,
            "scored": len(scores),
            "errors": errors[:20],
            "error_count": len(errors),
            "seconds": round(time.perf_counter() - started, 1),
            "groups": groups.num_rows,
            "skipped": vars(group_stats(groups)),
            **_mined_signal(groups, first_stage, scores, spec.hard),
            **answer_signal(table, groups, first_stage, spec.hard),
        }
        log.info("[mine] %s: %s", source.name, out["sources"][source.name])
    return out


def _rerank_scores(
    config: AdoptConfig, source: str, checkpoint: str
) -> tuple[dict[str, dict[str, float]], list[str], int]:
    """The miner checkpoint's scores of one source's training searches (``acare rerank`` on
    Ray Data, written under ``seed<N>/mine``), the ids of rows it reported, and the rows read."""
    from acare_ray.offline.rerank import RerankConfig, run

    scored = config.seed_dir / "mine" / source
    counts = run(
        RerankConfig(
            input=str(config.work / "data" / f"{source}_train.parquet"),
            output=str(scored),
            model=checkpoint,
            mode=config.mine.mode,
            fusion="none",
            pool=_pool(config),
            scorer=scorer_settings(config),
        )
    )
    scores, errors = _miner_scores(scored)
    return scores, errors, counts.rows_in


def primary_part(config: AdoptConfig, part: str) -> str:
    return str(config.work / "data" / f"{config.primary.name}_{part}.parquet")


# ---------------------------------------------------------------- evaluation helpers


def _pool(config: AdoptConfig):
    from acare_ray.offline.job import ActorPool

    return ActorPool(min_size=config.actors, max_size=config.actors, batch_size=8)


def _group_by(path: str) -> str | None:
    import pyarrow.parquet as pq

    return "agent" if "agent" in pq.read_schema(path).names else None


def evaluate_systems(
    config: AdoptConfig, model: str, modes: tuple[str, ...], fusion: tuple[str, ...], out: str
) -> dict[str, Any]:
    from acare_ray.offline.evaluate import EvalConfig, run

    report_file = Path(out) / "report.json"
    if report_file.exists():
        return json.loads(report_file.read_text())
    test = primary_part(config, "test")
    return run(
        EvalConfig(
            input=test,
            model=model,
            report_dir=out,
            modes=modes,
            measures=MEASURES,
            n_resamples=config.resamples,
            pool=_pool(config),
            sessions=True,
            group_by=_group_by(test),
            fusion=fusion,
        )
    )


def sessions_of(path: str) -> tuple[dict[str, str], dict[str, str | None]]:
    """``({search_id: session}, {session: agent or None})`` of a searches file."""
    table = read_parquet(path)
    ids = table.column("search_id").to_pylist()
    sessions = [s or i for s, i in zip(table.column("session_id").to_pylist(), ids, strict=True)]
    agents = (
        table.column("agent").to_pylist() if "agent" in table.column_names else [None] * len(ids)
    )
    return dict(zip(ids, sessions, strict=True)), dict(zip(sessions, agents, strict=True))


def _metric_summary(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "systems": report["systems"],
        "metrics": report["metrics"],
        "sessions": (report.get("sessions") or {}).get("metrics"),
        "groups": {k: g.get("metrics") for k, g in (report.get("groups") or {}).items()},
        "queries": report["queries"],
    }


def baseline_stage(config: AdoptConfig) -> dict[str, Any]:
    from acare_ray.adopt.claims import claim_tests

    report = evaluate_systems(
        config, config.model, config.baseline_modes, ("none",), str(config.work / "baseline")
    )
    session_of, _ = sessions_of(primary_part(config, "test"))
    claims = [("first_stage", mode) for mode in config.baseline_modes]
    return {
        "model": config.model,
        **_metric_summary(report),
        "tests": claim_tests(report, claims, session_of, config.resamples),
    }


# ---------------------------------------------------------------- training


def train_settings(config: AdoptConfig) -> dict[str, Any]:
    """The TrainConfig fields: adopt's defaults, the config's ``train`` over them (its
    ``scorer`` section setting by setting)."""
    scorer = {**TRAIN_DEFAULTS["scorer"], **(config.train.get("scorer") or {})}
    return {**TRAIN_DEFAULTS, **config.train, "scorer": scorer}


def scorer_settings(config: AdoptConfig) -> ScorerSettings:
    """How every stage loads the model: the training's scorer section."""
    from acare_ray.scoring import ScorerSettings

    return ScorerSettings.parse(train_settings(config)["scorer"])


def train_config(config: AdoptConfig):
    from acare_ray.training import TrainConfig

    work = config.work
    settings = train_settings(config)
    settings.setdefault("eval_modes", config.modes)
    if isinstance(settings["eval_modes"], list):
        settings["eval_modes"] = tuple(settings["eval_modes"])
    # With a mining round, its groups (the miner's hard negatives); validation stays.
    groups = mine_folder(config) / "groups" if config.mine else work / "groups"
    mined_init = config.mine is not None and config.mine.init == "miner"
    return TrainConfig(
        data=tuple(str(groups / f"{s.name}.parquet") for s in config.sources),
        data_weights=tuple(float(s.weight) for s in config.sources),
        val_data=str(work / "groups" / "validation.parquet"),
        model=config.mine.checkpoint(config.seed) if mined_init else config.model,
        output=str(work / "train"),
        name=f"seed{config.seed}",
        seed=config.seed,
        select_metric=settings.pop("select_metric", SELECT_METRIC),
        **settings,
    )


def train_stage(config: AdoptConfig) -> dict[str, Any]:
    from acare_ray.training import run
    from acare_ray.training.checkpoint import read_training_info

    train = train_config(config)
    started = time.perf_counter()
    checkpoint = run(train)
    seconds = time.perf_counter() - started
    run_dir = checkpoint.parent
    latest = max((p for p in run_dir.glob("checkpoint_*") if p.is_dir()), key=lambda p: p.name)
    info = read_training_info(latest)
    return {
        "checkpoint": str(checkpoint),
        "seconds_this_launch": seconds,
        "train_seconds": info["history"][-1].get("elapsed_s"),
        "steps": info["step"],
        "stopped": info.get("stopped"),
        "selection": info.get("selection"),
        "history": info["history"],
        "config": train.to_dict(),
    }


# ---------------------------------------------------------------- fusion fit and test


def fit_stage(config: AdoptConfig, checkpoint: str) -> dict[str, Any]:
    from acare_ray.offline.fit_fusion import FitFusionConfig, run

    out = {}
    for mode in ("M3", "M0") if "M0" in config.modes else ("M3",):
        out[mode] = run(
            FitFusionConfig(
                input=primary_part(config, "validation"),
                model=checkpoint,
                work_dir=str(config.seed_dir / f"fit-{mode}"),
                mode=mode,
                write=mode == "M3",
                safety=config.fusion,
                pool=_pool(config),
            )
        )
    return out


def test_stage(config: AdoptConfig, checkpoint: str, fits: dict[str, Any]) -> dict[str, Any]:
    from acare_ray.adopt.claims import claim_tests

    m3 = fits["M3"]["label"]
    fusions = [m3] + ([fits["M0"]["label"]] if "M0" in fits else [])
    report = evaluate_systems(
        config,
        checkpoint,
        config.modes,
        tuple(dict.fromkeys(fusions)),
        str(config.seed_dir / "test"),
    )
    stored = f"M3+{m3}"
    claims = [("first_stage", stored), ("first_stage", "M3")]
    if "M0" in fits:
        claims += [(f"M0+{fits['M0']['label']}", stored), ("M0", "M3")]
    if "agent_order" in report["systems"]:
        claims.append(("agent_order", stored))
    session_of, agent_of = sessions_of(primary_part(config, "test"))
    result = {
        "stored": stored,
        **_metric_summary(report),
        "tests": claim_tests(report, claims, session_of, config.resamples),
        "per_agent": {},
    }
    if "by_first_stage" in report:
        result["by_first_stage"] = report["by_first_stage"]
    for agent in sorted({a for a in agent_of.values() if a is not None}):
        mine = {s for s, a in agent_of.items() if a == agent}
        result["per_agent"][agent] = claim_tests(
            report, claims[:1], session_of, config.resamples, sessions=mine
        )
    return result


# ---------------------------------------------------------------- cost


def cost_stage(config: AdoptConfig, checkpoint: str) -> dict[str, Any]:
    """Per search: wall seconds to score ``n`` candidates and the tokens the model ran, over
    ``cost.searches`` test searches (candidates topped up from other searches where a search
    has fewer than ``n``), each mode; and the share of prompts at the field caps."""
    from acare_ray.scoring import AgentContext, Mode, Scorer
    from acare_ray.scoring.tokens import TokenLayout

    scorer = Scorer.from_settings(checkpoint, scorer_settings(config), device="cpu")
    layout = TokenLayout(scorer)
    rows = read_parquet(primary_part(config, "test")).to_pylist()[: config.cost.searches]
    pool = [c["text"] for row in rows for c in row["candidates"]]
    capped: dict[str, int] = {"sub_query": 0, "question": 0, "reasoning": 0}
    caps: dict[str, int] = {}
    for row in rows:
        context = AgentContext(row["sub_query"], row.get("question"), row.get("reasoning"))
        for name, cap in layout.cut_fields(context, Mode.M3).items():
            capped[name] += 1
            caps[name] = cap
    out: dict[str, Any] = {
        "searches": len(rows),
        "fields_at_cap": {k: v / max(len(rows), 1) for k, v in capped.items()},
        "field_caps_tokens": caps,
        "by": [],
    }
    for mode in config.cost.modes:
        for n in config.cost.candidates:
            seconds, tokens = [], []
            for i, row in enumerate(rows):
                docs = [c["text"] for c in row["candidates"]][:n]
                docs += [pool[(i * 7 + j) % len(pool)] for j in range(n - len(docs))]
                context = AgentContext(row["sub_query"], row.get("question"), row.get("reasoning"))
                before = scorer.stats.real_tokens
                started = time.perf_counter()
                scorer.score(context, docs, mode)
                seconds.append(time.perf_counter() - started)
                tokens.append(scorer.stats.real_tokens - before)
            out["by"].append(
                {
                    "mode": mode,
                    "candidates": n,
                    "p50_ms": float(np.percentile(seconds, 50) * 1000),
                    "mean_ms": float(np.mean(seconds) * 1000),
                    "tokens_per_search": float(np.mean(tokens)),
                }
            )
    return out


# ---------------------------------------------------------------- agent loop


def loop_stage(config: AdoptConfig, checkpoint: str) -> dict[str, Any]:
    out = config.seed_dir / "loop"
    report = out / "agent_bench.json"
    command = [*config.loop, "--model", checkpoint, "--out", str(out)]
    if config.loop_tasks:
        table = read_parquet(str(config.work / "data" / f"{config.loop_tasks}_test.parquet"))
        tasks = out.parent / "loop_task_ids.txt"
        tasks.parent.mkdir(parents=True, exist_ok=True)
        tasks.write_text("\n".join(sorted(set(table.column("session_id").to_pylist()))) + "\n")
        command += ["--task-ids", str(tasks)]
    if not report.exists():
        subprocess.run([sys.executable, "-m", "acare_ray.cli", *command], check=True)
    return {"command": "acare " + " ".join(command), "report": json.loads(report.read_text())}


def run_stages(config: AdoptConfig, stages: tuple[str, ...]) -> dict[str, Any]:
    """Run ``stages`` in order (the earlier ones each needs are run, or read when done)."""
    from acare_ray.adopt.report import write_report

    results: dict[str, Any] = {}

    def stage(name: str, fn, *args, ray: bool = False) -> dict[str, Any]:
        found = done(config, name)
        if found is not None:
            return found
        log.info("[adopt] stage %s", name)
        started = time.perf_counter()
        result = _with_ray(config, lambda: fn(config, *args)) if ray else fn(config, *args)
        result["stage_seconds"] = time.perf_counter() - started
        return finish(config, name, result)

    wanted = set(stages)
    results["data"] = stage("data", data_stage)
    if "baseline" in wanted:
        results["baseline"] = stage("baseline", baseline_stage, ray=True)
    later = {"train", "fit", "test", "cost", "loop", "report"}
    if config.mine is not None and wanted & (later | {"mine"}):
        results["mine"] = stage("mine", mine_stage, ray=True)
    if wanted & later:
        results["train"] = stage("train", train_stage, ray=True)
        checkpoint = results["train"]["checkpoint"]
    if wanted & (later - {"train"}):
        results["fit"] = stage("fit", fit_stage, checkpoint, ray=True)
    if wanted & {"test", "report"}:
        results["test"] = stage("test", test_stage, checkpoint, results["fit"], ray=True)
    if "cost" in wanted or "report" in wanted:
        results["cost"] = stage("cost", cost_stage, checkpoint)
    if config.loop and ("loop" in wanted or "report" in wanted):
        results["loop"] = stage("loop", loop_stage, checkpoint)
    for name in ("baseline", "loop"):
        if name not in results and done(config, name) is not None:
            results[name] = done(config, name)
    if "report" in wanted:
        results["report"] = write_report(config, results)
    return results


def _with_ray(config: AdoptConfig, fn):
    """Run ``fn`` with a local Ray instance of ``actors + 1`` CPUs (the scoring actors and the
    read/write tasks), unless one is up or ``RAY_ADDRESS`` names a cluster."""
    import os

    import ray

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return fn()
    from acare_ray.training.trainer import start_local_ray

    start_local_ray(num_cpus=config.actors + 1)
    try:
        return fn()
    finally:
        ray.shutdown()
