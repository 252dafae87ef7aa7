"""Checkpoint files without Ray: atomic writes, staging place, a missing trainer state."""

from __future__ import annotations

import json
import logging

import pytest

from acare_ray.scoring import Scorer
from acare_ray.training import checkpoint as ckpt


def test_a_checkpoint_is_renamed_into_place_only_when_whole(tiny_scorer, tmp_path, monkeypatch):
    """Pins: checkpoints were written file by file into their final folder, so a writer that
    died left a folder that looked like a checkpoint. A failed write leaves nothing."""
    target = tmp_path / "checkpoint_0000004"
    tokenizer = ckpt.hf_tokenizer(tiny_scorer)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(tokenizer, "save_pretrained", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ckpt.write_checkpoint(target, tiny_scorer, info={"step": 4}, trainer_state={"x": 1})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    ckpt.write_checkpoint(target, tiny_scorer, info={"step": 4}, trainer_state={"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    assert ckpt.read_training_info(target)["step"] == 4
    assert ckpt.read_trainer_state(target) == {"x": 1}
    assert Scorer.from_pretrained(str(target), device="cpu").backend is not None

    ckpt.write_checkpoint(target, tiny_scorer, info={"step": 8})  # replaces the old one whole
    assert ckpt.read_training_info(target)["step"] == 8
    assert not (target / ckpt.TRAINER_STATE_FILE).exists()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_checkpoint_without_trainer_state_resumes_from_weights(tiny_scorer, tmp_path, caplog):
    """Pins: a missing trainer_state.pt raised FileNotFoundError on every relaunch."""
    target = ckpt.write_checkpoint(tmp_path / "c", tiny_scorer, info={"step": 4})
    with caplog.at_level(logging.WARNING, logger="acare_ray.training"):
        assert ckpt.read_trainer_state(target) is None
    assert "optimizer state (moments) restarts" in caplog.text
    assert json.loads((target / ckpt.TRAINING_FILE).read_text()) == {"step": 4}


def test_checkpoints_are_staged_in_the_runs_own_storage(tmp_path):
    """Pins: checkpoints were staged in the node's /tmp (tens of GB for a 4B model)."""
    root = ckpt.staging_root(tmp_path / "runs", "my-run")
    assert root == tmp_path / "runs" / "my-run" / ckpt.STAGING_DIR
