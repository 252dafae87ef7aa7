"""The Serve app of the ``test_serve_*`` modules: deployed once per module, with the apps the
module names in ``SERVE_APPS`` (tests/online/serve_support.py describes each)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from serve_support import FITTED, make_config

from acare_ray.ranking.checkpoint_settings import write_fusion
from acare_ray.scoring import ACARE_CONFIG_FILE, Scorer
from acare_ray.testing import deploy_serve_config, free_port


@pytest.fixture(scope="module")
def checkpoint(tiny_qwen3_dir, tiny_scorer, tmp_path_factory) -> Path:
    """The tiny model as the trainer saves it: HF weights + tokenizer + ``acare.json``, with a
    fusion stored the way ``acare fit-fusion`` stores it."""
    folder = Path(shutil.copytree(tiny_qwen3_dir, tmp_path_factory.mktemp("ckpt") / "final"))
    (folder / ACARE_CONFIG_FILE).write_text(json.dumps(tiny_scorer.acare_config()))
    write_fusion(folder, FITTED, {"measure": "nDCG@10", "note": "test fixture"})
    return folder


@pytest.fixture(scope="module")
def scorer(checkpoint) -> Scorer:
    return Scorer.from_pretrained(str(checkpoint), device="cpu")


@pytest.fixture(scope="module")
def served(request, ray_local, checkpoint):
    from ray import serve

    config = make_config(checkpoint, free_port(), getattr(request.module, "SERVE_APPS", ("main",)))
    deploy_serve_config(config)
    base = f"http://127.0.0.1:{config['http_options']['port']}"
    yield {"base": base, "config": config}
    serve.shutdown()


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served["base"], timeout=60) as client:
        yield client
