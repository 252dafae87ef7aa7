"""Checkpoints that serve: a Hugging Face model folder plus what resuming needs.

Layout of one checkpoint directory::

    config.json, model.safetensors, tokenizer files   # save_pretrained (model + tokenizer)
    acare.json                                         # Scorer.acare_config(): backend, template,
                                                       # caps, max_length, yes/no ids
    training.json                                      # step, run config, metric history,
                                                       # steps at which relaunches resumed
    trainer_state.pt                                   # optimizer + LR scheduler state

``Scorer.from_pretrained(<checkpoint>)`` (and so the Serve app) loads it as any model folder;
the last two files only matter to a relaunch that resumes the run. ``training.json`` is written
last, into a hidden temp folder that is renamed into place when whole (:func:`write_checkpoint`),
so a checkpoint folder either is complete or does not exist. A relaunch whose checkpoint lacks
``trainer_state.pt`` resumes from its weights with fresh optimizer state
(:func:`read_trainer_state` returns None, the trainer logs it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from acare_ray.scoring import ACARE_CONFIG_FILE, Scorer
from acare_ray.scoring.golden import write_golden

TRAINING_FILE = "training.json"
TRAINER_STATE_FILE = "trainer_state.pt"
STAGING_DIR = ".acare-staging"

log = logging.getLogger("acare_ray.training")


def run_dir(storage_path: str | os.PathLike, name: str) -> Path:
    """The folder of the run ``name`` under ``storage_path``: its checkpoints and Ray Train's
    record of them."""
    return Path(storage_path).expanduser() / name


def staging_root(storage_path: str | os.PathLike, name: str) -> Path:
    """Where a run stages checkpoints before Ray Train persists them: inside the run's own
    storage folder (``<storage>/<name>/.acare-staging``), which is sized for checkpoints,
    not the node's ``/tmp``."""
    return run_dir(storage_path, name) / STAGING_DIR


def hf_model(scorer: Scorer) -> nn.Module:
    """The Hugging Face ``PreTrainedModel`` inside a scorer."""
    return scorer.backend.hf_model


def hf_tokenizer(scorer: Scorer) -> Any:
    return scorer.backend.tokenizer


@contextlib.contextmanager
def full_parameters(model: nn.Module) -> Iterator[None]:
    """Inside, every rank's module holds full (unsharded) parameters.

    A no-op for DDP and single-process models, whose parameters are always whole; an FSDP2
    (``fully_shard``) model is unsharded on entry and resharded on exit. All ranks must enter.
    """
    if is_sharded(model):
        model.unshard()
        try:
            yield
        finally:
            model.reshard()
    else:
        yield


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` is FSDP2-sharded (its ``state_dict`` holds shards, not weights)."""
    return hasattr(model, "unshard") and hasattr(model, "reshard")


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU, keyed as in the wrapped Hugging Face model.

    Collective under FSDP (every rank must call it). The training module holds the Hugging Face
    model one attribute down (``PrefixSharedYesNo.lm``, ``PairScorer.model``), so that first
    name is dropped from each key.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return {key.split(".", 1)[1]: value for key, value in state.items()}


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state keyed by parameter name (gathered on every rank under FSDP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=options)


def write_checkpoint(
    directory: str | os.PathLike,
    scorer: Scorer,
    *,
    info: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
    model_state: dict[str, torch.Tensor] | None = None,
    golden: dict[str, Any] | None = None,
) -> Path:
    """Write a servable checkpoint of ``scorer``'s current weights into ``directory``, atomically.

    ``info`` (JSON-serialisable: step, config, history) goes to ``training.json``;
    ``trainer_state`` (optimizer/scheduler state dicts) to ``trainer_state.pt``. Weights are the
    scorer's own, or ``model_state`` when given (a sharded model's gathered weights, see
    :func:`full_model_state`). ``golden`` (:func:`acare_ray.scoring.golden.record` of these
    weights) goes to ``golden.json``. Everything is written to a hidden temp folder beside
    ``directory`` and renamed to ``directory`` once complete (an existing ``directory`` is
    replaced); a writer that dies leaves only the temp folder. One rank writes.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = directory.parent / f".{directory.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        partial.mkdir()
        model = hf_model(scorer)
        if model_state is not None:
            model_state = _without_tied_copies(model, model_state)
        model.save_pretrained(partial, state_dict=model_state)
        hf_tokenizer(scorer).save_pretrained(partial)
        config = json.dumps(scorer.acare_config(), indent=2) + "\n"
        (partial / ACARE_CONFIG_FILE).write_text(config)
        if trainer_state is not None:
            torch.save(trainer_state, partial / TRAINER_STATE_FILE)
        if golden is not None:
            write_golden(partial, golden)
        (partial / TRAINING_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        partial.rename(directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return directory


def _without_tied_copies(
    model: nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` with each tied parameter under its first name only, as ``save_pretrained``
    writes it (a gathered state dict repeats tied weights, e.g. ``lm_head.weight``)."""
    first: dict[int, str] = {}
    repeats = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            repeats.add(name)
    return {key: value for key, value in state.items() if key not in repeats}


def read_training_info(directory: str | os.PathLike) -> dict[str, Any]:
    """``training.json`` of a checkpoint (step, epoch, config, history)."""
    path = Path(directory) / TRAINING_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a training checkpoint (no {TRAINING_FILE})")
    return json.loads(path.read_text())


def read_trainer_state(directory: str | os.PathLike) -> dict[str, Any] | None:
    """``trainer_state.pt`` of a checkpoint; None (with a warning) when the checkpoint has
    none: the relaunch resumes from the weights and restarts optimizer and scheduler state."""
    path = Path(directory) / TRAINER_STATE_FILE
    if not path.is_file():
        log.warning(
            "%s is missing: resuming from the checkpoint's weights; optimizer state "
            "(moments) restarts from zero and the learning rate schedule is fast-forwarded",
            path,
        )
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
