"""benchmarks/ is a package that measures through the product: its modules import each other
as ``benchmarks.<name>``, never by bare name or through ``sys.path``, and every one imports."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest
from benchmarks_import import BENCHMARKS

NAMES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__")


def test_no_benchmark_imports_another_by_bare_name_or_edits_sys_path():
    bare, path_edits = [], []
    for name in NAMES:
        source = (BENCHMARKS / f"{name}.py").read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            bare += [f"{name}: {t}" for t in targets if t.split(".")[0] in NAMES]
        if "sys.path" in source:
            path_edits.append(name)
    assert (bare, path_edits) == ([], [])
    assert len(NAMES) > 15  # the scan saw the scripts


@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_imports_as_a_module_of_the_package(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert Path(module.__file__).resolve() == BENCHMARKS / f"{name}.py"


def test_the_trace_benchmark_trains_with_a_config_the_trainer_accepts(tmp_path, monkeypatch):
    """quality_traces' train stage, up to the trainer: the config it builds is a valid one."""
    import acare_ray.training as training
    from benchmarks import quality_traces

    seen = []
    monkeypatch.setattr(training, "run", lambda config: seen.append(config) or tmp_path / "ckpt")
    (tmp_path / "train").mkdir()
    args = quality_traces.parse_args(["--max-length", "192", "--transfer-checkpoint", "ckpt"])
    checkpoint, info = quality_traces.train("r", tmp_path / "groups", tmp_path, args)
    assert checkpoint == tmp_path / "ckpt"
    (config,) = seen
    assert config.scorer.max_length == 192 and config.model == quality_traces.BACKBONE
    assert json.loads((tmp_path / "train" / "r.json").read_text())["checkpoint"] == str(checkpoint)
