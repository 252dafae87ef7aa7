"""The model revision setting (issue 21, part 6): a pinned Hub commit is what every surface loads.

Before the fix ``Scorer.from_pretrained`` had no ``revision`` and always loaded the default
branch, so a re-pushed model changed what the offline jobs, the trainer and the Serve app ran.
Here a Hugging Face cache with two commits of one model id is built on disk (offline, no
network): the pinned commit is the one scored, the default branch is the other, an unknown
commit fails. The surfaces (``acare rerank/relabel/eval --revision``, ``acare train
--revision``, the Serve app's ``args.revision``) are checked to hand the setting to
``Scorer.from_pretrained``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_support import KUBERAY, REPO, load_yaml_documents

from acare_ray.cli import build_parser

REPO_ID = "acare-test/tiny-reranker"
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
MISSING = "c" * 40

SCORE_SCRIPT = r"""
import json, sys
from acare_ray.scoring import AgentContext
from acare_ray.scoring import Scorer

out = {}
for label, name, revision in json.loads(sys.argv[1]):
    try:
        scorer = Scorer.from_pretrained(name, device="cpu", revision=revision)
        context = AgentContext(sub_query="golden bear 1998")
        out[label] = scorer.score(context, ["Central Station won the Golden Bear."]).tolist()
    except Exception as err:
        out[label] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> dict[str, Any]:
    """A Hub cache holding two commits of REPO_ID (different random weights); main is B."""
    from acare_ray.testing import build_random_qwen3

    root = tmp_path_factory.mktemp("hf-cache")
    local = {
        COMMIT_A: build_random_qwen3(root / "src-a", seed=1),
        COMMIT_B: build_random_qwen3(root / "src-b", seed=2),
    }
    repo = root / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    for commit, source in local.items():
        shutil.copytree(source, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT_B)
    return {"cache": root / "hub", "local": local}


def score_in_subprocess(cache: Path, loads: list[tuple[str, str, str | None]]) -> dict[str, Any]:
    """Scores per label, in a fresh interpreter whose Hub cache is ``cache`` (read at import)."""
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", SCORE_SCRIPT, json.dumps(loads)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_pinned_revision_loads_that_commit_not_the_default_branch(hub_cache):
    """Pins the defect: without ``revision`` the Hub id always resolved to main."""
    local = hub_cache["local"]
    scores = score_in_subprocess(
        hub_cache["cache"],
        [
            ("dir-a", str(local[COMMIT_A]), None),
            ("dir-b", str(local[COMMIT_B]), None),
            ("pinned-a", REPO_ID, COMMIT_A),
            ("pinned-b", REPO_ID, COMMIT_B),
            ("default", REPO_ID, None),
            ("missing", REPO_ID, MISSING),
        ],
    )
    assert isinstance(scores["dir-a"], list) and scores["dir-a"] != scores["dir-b"], scores
    assert scores["pinned-a"] == scores["dir-a"], scores
    assert scores["pinned-b"] == scores["dir-b"], scores
    assert scores["default"] == scores["dir-b"], scores
    assert isinstance(scores["missing"], str), scores
    assert scores["missing"].startswith("OSError"), scores["missing"]


class Loaded(Exception):
    """Raised by the fake ``Scorer.from_pretrained`` once it has recorded its arguments."""


@pytest.fixture
def recorded(monkeypatch) -> list[dict[str, Any]]:
    from acare_ray.scoring import Scorer

    calls: list[dict[str, Any]] = []

    def fake(name_or_path, **kwargs):
        calls.append({"model": name_or_path, **kwargs})
        raise Loaded

    monkeypatch.setattr(Scorer, "from_pretrained", staticmethod(fake))
    return calls


@pytest.mark.parametrize("command", ["rerank", "relabel", "eval"])
def test_offline_revision_flag_reaches_the_actor_scorer(command, recorded):
    from acare_ray.offline.actor import load_scorer
    from acare_ray.offline.cli import eval_command, relabel_command, rerank_command
    from acare_ray.offline.evaluate import EvalConfig
    from acare_ray.offline.relabel import RelabelConfig
    from acare_ray.offline.rerank import RerankConfig

    argv = [command, "--input", "in", "--model", REPO_ID, "--revision", COMMIT_A]
    argv += {"rerank": ["--output", "o"], "relabel": ["--output", "o"], "eval": []}[command]
    argv += ["--report-dir", "r"] if command == "eval" else []
    args = build_parser().parse_args(argv)
    built = {}
    config_classes = {"rerank": RerankConfig, "relabel": RelabelConfig, "eval": EvalConfig}
    commands = {"rerank": rerank_command, "relabel": relabel_command, "eval": eval_command}
    module = sys.modules[config_classes[command].__module__]

    def capture(config):
        built["config"] = config
        raise Loaded

    original = module.run
    module.run = capture
    try:
        with pytest.raises(Loaded):
            commands[command](args)
    finally:
        module.run = original
    from acare_ray.offline.job import actor_scorer

    options = actor_scorer(built["config"].scorer, built["config"].revision)
    assert options["revision"] == COMMIT_A
    with pytest.raises(Loaded):
        load_scorer(REPO_ID, 1, options)
    assert recorded[-1]["revision"] == COMMIT_A


def test_offline_jobs_without_revision_pass_none_of_it():
    from acare_ray.offline.job import actor_scorer
    from acare_ray.scoring import ScorerSettings

    assert "revision" not in actor_scorer(ScorerSettings(), None)


def test_train_revision_flag_reaches_from_pretrained(recorded, monkeypatch):
    import ray.train
    import ray.train.torch
    import torch

    from acare_ray.training import trainer
    from acare_ray.training.cli import config_from_args

    args = build_parser().parse_args(
        ["train", "--data", "g", "--model", REPO_ID, "--revision", COMMIT_A]
    )
    config = config_from_args(args)
    assert config.revision == COMMIT_A

    class Context:
        def get_world_rank(self):
            return 0

        def get_world_size(self):
            return 1

    monkeypatch.setattr(ray.train, "get_context", Context)
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(trainer, "load_splits", lambda c: ([], [], (0,)))
    monkeypatch.setattr(trainer, "steps_per_epoch", lambda n, c: 1)
    monkeypatch.setattr(trainer, "total_steps", lambda n, c: 1)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(Loaded):
            trainer.WorkerRun(config)
    finally:
        torch.set_num_threads(threads)
    assert recorded[-1]["model"] == REPO_ID and recorded[-1]["revision"] == COMMIT_A


def test_a_run_relaunched_at_another_revision_does_not_resume():
    from acare_ray.training.config import TrainConfig

    saved = TrainConfig(data="g", model=REPO_ID, revision=COMMIT_A).to_dict()
    now = TrainConfig(data="g", model=REPO_ID, revision=COMMIT_B)
    assert any(m.startswith("revision:") for m in now.resume_mismatches(saved))


def test_serve_app_revision_reaches_from_pretrained(recorded):
    from acare_ray.testing import replica_class

    own = replica_class()  # the replica's own constructor, not serve.ingress's async one
    with pytest.raises(Loaded):
        own.__init__(
            object.__new__(own),
            {"model": REPO_ID, "revision": COMMIT_A, "allow_unauthenticated": True},
        )
    assert recorded[-1]["model"] == REPO_ID and recorded[-1]["revision"] == COMMIT_A


def gpu_serve_args() -> list[dict[str, Any]]:
    gpu = yaml.safe_load((REPO / "serve_configs" / "gpu.yaml").read_text(encoding="utf-8"))
    (service,) = load_yaml_documents(KUBERAY / "rayservice.yaml")
    embedded = yaml.safe_load(service["spec"]["serveConfigV2"])
    return [app["args"] for config in (gpu, embedded) for app in config["applications"]]


def test_gpu_serve_config_pins_a_full_commit_of_its_hub_model():
    """The production config (and the RayService built from it) loads a fixed commit."""
    for args in gpu_serve_args():
        assert "/" in args["model"] and not Path(args["model"]).exists(), args["model"]
        revision = args.get("revision")
        assert revision and len(revision) == 40, f"args.revision must be a commit: {revision!r}"
        int(revision, 16)
