"""What the Serve tests of this folder share: the repository's local Serve config made ready for
a test (a test model, a free port, no API key, half a CPU per replica)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

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
