"""Golden scores and ``acare verify`` (issue 35): a checkpoint that scores as it was saved
passes; a corrupted weight file, a swapped tokenizer or a changed prompt fails with the case and
both numbers named; a base model gets the reference check against the official recipe."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from acare_ray.cli import main
from acare_ray.online.service import RerankService
from acare_ray.scoring import AgentContext, Mode, Scorer
from acare_ray.scoring.golden import (
    GOLDEN_FILE,
    GoldenMismatchError,
    read_golden,
    record,
    tolerance,
)
from acare_ray.training.checkpoint import write_checkpoint

VALIDATION = [
    (AgentContext("river Paris", question="Which river flows through Paris?", reasoning="Hm."),
     "The Seine flows through Paris.", Mode.M3),
]  # fmt: skip


@pytest.fixture
def checkpoint(tiny_qwen3_dir, tmp_path) -> Path:
    """A checkpoint as the trainer writes it, with its golden record."""
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu")
    return write_checkpoint(
        tmp_path / "ckpt", scorer, info={"step": 1}, golden=record(scorer, VALIDATION)
    )


def _verify(model: Path, capsys) -> tuple[int, str]:
    code = main(["verify", str(model), "--device", "cpu"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_saved_checkpoint_verifies(checkpoint, capsys):
    cases = read_golden(checkpoint)
    assert len(cases) == 7 and {c.source for c in cases} == {"synthetic", "validation"}
    code, out = _verify(checkpoint, capsys)
    assert code == 0 and "verified: 7 golden cases" in out


def test_a_corrupted_weight_file_fails(checkpoint, capsys):
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    for i in range(header + 1000, len(data) - 1000, 997):  # garble bytes across the tensors
        data[i] ^= 0x5A
    weights.write_bytes(bytes(data))
    code, out = _verify(checkpoint, capsys)
    assert code == 1
    assert "golden cases do not score as the checkpoint recorded" in out or "does not load" in out


def test_a_swapped_tokenizer_fails(checkpoint, capsys):
    path = checkpoint / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    for a, b in (("Ġthe", "Ġof"), ("ĠParis", "ĠFrance"), ("Ġriver", "Ġcity")):
        if a in vocab and b in vocab:
            vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(tokenizer))
    code, out = _verify(checkpoint, capsys)
    assert code == 1 and "FAILED" in out and "golden case" in out


def test_a_changed_prompt_fails_naming_the_case_and_both_numbers(checkpoint, capsys):
    path = checkpoint / "acare.json"
    config = json.loads(path.read_text())
    config["instruction"] = "Judge whether the Document is long."
    path.write_text(json.dumps(config))
    code, out = _verify(checkpoint, capsys)
    assert code == 1
    assert "golden case 0 (synthetic, M0, document 'Paris is the capital" in out
    assert "scored " in out and "the checkpoint recorded " in out and "tolerance" in out


def test_a_replica_with_a_mismatching_checkpoint_refuses_to_serve(checkpoint):
    cases = read_golden(checkpoint)
    scorer = Scorer.from_pretrained(str(checkpoint), device="cpu")
    service = RerankService(scorer, "ckpt", golden=cases)
    service.probe()  # the health check re-verifies: passes while the model is sound
    wrong = [c.__class__(**{**c.__dict__, "score": c.score + 1.0}) for c in cases]
    with pytest.raises(GoldenMismatchError, match="7 of 7 golden cases"):
        RerankService(scorer, "ckpt", golden=wrong)
    service.golden = wrong
    with pytest.raises(GoldenMismatchError):
        service.probe()


def test_a_base_model_gets_the_reference_check(tiny_qwen3_dir, tmp_path, capsys):
    code, out = _verify(tiny_qwen3_dir, capsys)
    assert code == 0 and "equal the official recipe" in out
    base = Path(shutil.copytree(tiny_qwen3_dir, tmp_path / "base"))
    (base / "acare.json").write_text(json.dumps({"instruction": "Say yes to everything."}))
    assert not (base / GOLDEN_FILE).exists()
    code, out = _verify(base, capsys)
    assert code == 1 and "differ from the official recipe" in out


def test_tolerance_grows_with_lower_precision():
    import torch

    f32 = tolerance(torch.float32, "cpu", 2.0)
    assert f32 < tolerance(torch.float32, "cuda", 2.0) < tolerance(torch.bfloat16, "cuda", 2.0)
    assert tolerance(torch.float16, "cuda", 2.0) < tolerance(torch.bfloat16, "cuda", 2.0)
