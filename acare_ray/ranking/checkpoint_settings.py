"""A checkpoint's serving settings in its ``acare.json``: the fitted fusion and the relevance
calibration per mode (read and written here, torch-free, so that the jobs, the Serve app,
agent-bench and the MCP server read a checkpoint's settings without the trainer).

The file itself is the scoring core's (:func:`acare_ray.scoring.read_acare_config`: prompt
caps, template, yes/no ids); this module adds and reads the entries the layers above it store.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from acare_ray.ranking.calibration import Calibration
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.scoring.config import ACARE_CONFIG_FILE, read_acare_config

FUSION_KEY = "fusion"
CALIBRATION_KEY = "calibration"


def read_fusion(model: str | os.PathLike) -> FusionConfig | None:
    """The fusion setting fitted for a checkpoint (``fusion`` in its ``acare.json``), or None
    when it has none (an unfitted checkpoint, a Hub id, an alias)."""
    path = Path(model)
    if not path.is_dir():
        return None
    saved = read_acare_config(str(path)).get(FUSION_KEY)
    if not saved:
        return None
    try:
        return FusionConfig.from_dict(saved)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path / ACARE_CONFIG_FILE}: {FUSION_KEY} is not valid: {err}") from None


def write_fusion(
    directory: str | os.PathLike, config: FusionConfig, fitted: dict[str, Any] | None = None
) -> Path:
    """Store ``config`` (and how it was fitted) as the checkpoint's default fusion, in its
    ``acare.json`` (other entries kept; the file is replaced whole, never half-written)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: fusion can only be stored with a local checkpoint folder")
    saved = read_acare_config(str(directory))
    saved[FUSION_KEY] = {**config.as_dict(), **({"fitted": fitted} if fitted else {})}
    return _replace(directory, saved)


def _replace(directory: Path, saved: dict[str, Any]) -> Path:
    """Write ``saved`` as the folder's ``acare.json`` whole (never half-written)."""
    path = directory / ACARE_CONFIG_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(saved, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_calibration(model: str | os.PathLike) -> dict[str, Calibration]:
    """``{mode: Calibration}`` fitted for a checkpoint (``calibration`` in its ``acare.json``);
    empty when it has none (relevance is then plain sigmoid)."""
    path = Path(model)
    if not path.is_dir():
        return {}
    saved = read_acare_config(str(path)).get(CALIBRATION_KEY) or {}
    try:
        return {mode: Calibration.from_dict(value) for mode, value in saved.items()}
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path / ACARE_CONFIG_FILE}: {CALIBRATION_KEY} is not valid: {err}"
        ) from None


def write_calibration(
    directory: str | os.PathLike,
    mode: str,
    calibration: Calibration,
    fitted: dict[str, Any] | None = None,
) -> Path:
    """Store the relevance calibration of one mode (the other modes' entries kept)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: a calibration is stored with a local checkpoint folder")
    saved = read_acare_config(str(directory))
    entries = dict(saved.get(CALIBRATION_KEY) or {})
    entries[mode] = {**calibration.as_dict(), **({"fitted": fitted} if fitted else {})}
    saved[CALIBRATION_KEY] = entries
    return _replace(directory, saved)
