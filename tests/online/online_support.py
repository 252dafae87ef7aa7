"""What the tests of this folder share: the repository's local Serve config made ready for a
test (a test model, a free port, no API key, half a CPU per replica), and, for the HTTP app
without Ray, admission wired the way the deployment wires it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from acare_ray.online.admission import Admission
from acare_ray.online.service import RerankService
from acare_ray.online.serving import inline_score

REPO = Path(__file__).resolve().parents[2]


def local_serve_config(model: str | Path, port: int, name: str) -> tuple[dict, dict[str, Any]]:
    """``serve_configs/local.yaml`` with HTTP on ``127.0.0.1:port`` and its one application
    named ``name`` at ``/``, serving ``model`` without an API key, its deployment on half a CPU
    (so several apps fit the test cluster). Returns ``(config, that application)``; callers
    change or copy the application to add their own."""
    config = yaml.safe_load((REPO / "serve_configs" / "local.yaml").read_text())
    config["http_options"].update(host="127.0.0.1", port=port)
    (app,) = config["applications"]
    app.update(name=name, route_prefix="/")
    app["args"].update(model=str(model), api_key_env=None, allow_unauthenticated=True)
    app["deployments"][0]["ray_actor_options"] = {"num_cpus": 0.5}
    return config, app


def admitted_scoring(service: RerankService, admission: Admission):
    """A ``score`` callback for ``create_api`` with ``admission`` wired as the deployment wires
    it (admitted by the job's token bound, refused with the decision's refusal, done once
    answered), scoring inline on a thread; a job the service answers with an error raises it."""

    scored = inline_score(service)

    async def score(job, client):
        decision = admission.admit(job.bound, client)
        if not decision.admitted:
            raise decision.refusal(admission.deadline_s)
        try:
            return await scored(job, client)
        finally:
            admission.done(job.bound, client)

    return score


def admission_screen(admission: Admission):
    """A ``screen`` callback for ``create_api``: ``admission``'s early refusal, else None."""

    def screen(client: str):
        decision = admission.screen(client)
        return None if decision.admitted else decision.refusal(admission.deadline_s)

    return screen


def cohere_rerank(base: str, model: str, documents: list[str], top_n: int | None = None, **fields):
    """The ``cohere`` v2 client's rerank of ``QUERY`` against the app at ``base``, the agent
    context (``original_question``, ``reasoning``) sent as extra body fields, as a user sends
    them; returns the client's response."""
    import cohere
    from scoring_support import QUERY

    co = cohere.ClientV2(api_key="unused", base_url=base)
    options = {} if top_n is None else {"top_n": top_n}
    return co.rerank(
        model=model,
        query=QUERY,
        documents=documents,
        request_options={"additional_body_parameters": fields},
        **options,
    )
