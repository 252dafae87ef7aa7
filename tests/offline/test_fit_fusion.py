"""``acare fit-fusion`` on a real local Ray cluster: fit, store with the checkpoint, default."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from acare_ray.cli import main
from acare_ray.data.io import write_parquet
from acare_ray.data.synthetic import SYNTHETIC_SEARCHES, synthetic_searches
from acare_ray.eval.ir_metrics import evaluate
from acare_ray.offline.evaluate import (
    EvalConfig,
    first_stage_runs,
    fusions,
    load_first_stage,
    load_qrels,
)
from acare_ray.offline.rerank import RerankConfig
from acare_ray.ranking.checkpoint_settings import read_fusion
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.ranking.fusion_fit import PASS_THROUGH

pytestmark = pytest.mark.slow


def test_fit_fusion_stores_the_best_grid_point_and_every_surface_defaults_to_it(
    ray_local, tiny_qwen3_copy, tmp_path, capsys
):
    """Issue 20: the fitted setting stored with a checkpoint is the default of rerank and eval
    (serve reads it through the same read_fusion). ``--rule best``: the grid's best point; the
    default safe rule on the same 6 searches stores the first-stage order (issue 32)."""
    path = tmp_path / "train.parquet"
    rows = synthetic_searches(6, seed=5).to_pylist()
    write_parquet(pa.Table.from_pylist(rows, schema=SYNTHETIC_SEARCHES), path)
    work = tmp_path / "fit"
    before = {"note": "an entry fit-fusion must keep"}
    (tiny_qwen3_copy / "acare.json").write_text(json.dumps(before))
    argv = ["fit-fusion", "--input", str(path), "--model", str(tiny_qwen3_copy)]
    argv += ["--work-dir", str(work), "--mode", "M3", "--actors", "1", "--batch-size", "4"]
    assert main([*argv, "--rule", "best"]) == 0
    result = json.loads((work / "fit.json").read_text())
    assert len(result["grid"]) == 22
    values = [row["nDCG@10"] for row in result["grid"]]
    best = result["grid"][values.index(max(values))]["fusion"]
    assert result["label"] == best and result["fitted"]["value"] == max(values)
    stored = read_fusion(tiny_qwen3_copy)
    assert stored == FusionConfig.from_dict(result["fusion"]) and stored.label == best
    saved = json.loads((tiny_qwen3_copy / "acare.json").read_text())
    assert saved["note"] == before["note"]
    assert saved["fusion"]["fitted"]["objective"] == "nDCG@10"
    assert f"fitted fusion: {best}" in capsys.readouterr().out
    # rrf with weight 0 is the first stage alone: its grid value is the first_stage system's
    qrels = load_qrels(str(path))
    judged = {q: j for q, j in qrels.items() if any(r > 0 for r in j.values())}
    first = first_stage_runs(load_first_stage(str(path)))["first_stage"]
    alone = evaluate(judged, {q: first[q] for q in judged}, ["nDCG@10"]).mean["nDCG@10"]
    assert result["grid"][0]["fusion"] == "rrf:k=60,weight=0"
    assert result["grid"][0]["nDCG@10"] == pytest.approx(alone)
    # the defaults of eval and rerank resolve to the stored setting; an explicit one wins
    eval_config = EvalConfig(input=str(path), model=str(tiny_qwen3_copy), report_dir=str(work))
    assert fusions(eval_config) == (stored,)
    assert fusions(EvalConfig(**{**eval_config.__dict__, "fusion": ("none",)})) == ()
    rerank = RerankConfig(input=str(path), output=str(work / "r"), model=str(tiny_qwen3_copy))
    assert rerank.resolved_fusion() == stored
    assert RerankConfig(**{**rerank.__dict__, "fusion": "rrf"}).resolved_fusion() == FusionConfig(
        "rrf"
    )
    # the safe rule (the default) on 6 questions cannot cross-validate: it stores the
    # first-stage order, says why, and the surfaces default to it (scoring is reused)
    assert main(argv) == 0
    safe = json.loads((work / "fit.json").read_text())
    assert safe["fitted"]["decision"] == "pass-through" and safe["fitted"]["rule"] == "safe"
    assert read_fusion(tiny_qwen3_copy) == PASS_THROUGH == rerank.resolved_fusion()
    assert all({"gain", "gain_low", "gain_high"} <= set(row) for row in safe["grid"])
    assert "decision: pass-through (stored rrf:k=60,weight=0)" in capsys.readouterr().out
