"""Issue 35: a checkpoint that does not score its golden cases as recorded never turns healthy in
Serve (the replica refuses to start, and the deployment fails naming the case); the same
checkpoint unchanged deploys and serves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from online_support import local_serve_config
from ray import serve

from acare_ray.scoring import AgentContext, Mode, Scorer
from acare_ray.scoring.golden import record
from acare_ray.testing import deploy_serve_config, free_port
from acare_ray.training.checkpoint import write_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoints(tiny_qwen3_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("golden-serve")
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu")
    golden = record(scorer, [(AgentContext("q", question="Q?", reasoning="r"), "doc", Mode.M3)])
    sound = write_checkpoint(root / "sound", scorer, info={"step": 1}, golden=golden)
    broken = Path(shutil.copytree(sound, root / "broken"))
    config = json.loads((broken / "acare.json").read_text())
    config["instruction"] = "Judge whether the Document mentions a colour."  # the wrong prompt
    (broken / "acare.json").write_text(json.dumps(config))
    return {"sound": sound, "broken": broken}


@pytest.fixture(scope="module")
def serving(ray_local):
    """The module's HTTP port: Serve's proxy keeps the port of the first config it is given."""
    yield free_port()
    serve.shutdown()


def test_a_mismatching_checkpoint_never_turns_healthy(serving, checkpoints):
    config, _ = local_serve_config(checkpoints["broken"], serving, "broken")
    with pytest.raises(AssertionError, match="deploy failed"):
        deploy_serve_config(config, timeout_s=240)
    status = serve.status().applications["broken"]
    assert status.status == "DEPLOY_FAILED"
    message = status.deployments["Reranker"].message
    assert "golden cases do not score as the checkpoint recorded" in message
    assert "golden case 0 (synthetic, M0" in message
    serve.delete("broken")


def test_the_sound_checkpoint_deploys_and_its_health_check_verifies(serving, checkpoints):
    port = serving
    config, _ = local_serve_config(checkpoints["sound"], port, "sound")
    deploy_serve_config(config, timeout_s=240)
    response = httpx.post(
        f"http://127.0.0.1:{port}/v1/rerank",
        json={"query": "q", "documents": ["doc", "other"]},
        timeout=60,
    )
    assert response.status_code == 200 and len(response.json()["results"]) == 2
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
