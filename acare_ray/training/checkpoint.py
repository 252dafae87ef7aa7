"""Checkpoints that serve: a Hugging Face model folder plus what resuming needs.

Layout of one checkpoint directory::

    config.json, model.safetensors, tokenizer files   # save_pretrained (model + tokenizer)
    acare.json                                         # Scorer.acare_config(): backend, template,
                                                       # caps, max_length, yes/no ids
    training.json                                      # step, run config, metric history,
                                                       # steps at which relaunches resumed
    trainer_state.pt                                   # optimizer + LR scheduler state

``Scorer.from_pretrained(<checkpoint>)`` (and so the Serve app) loads it as any model folder;
the last two files only matter to a relaunch that resumes the run.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from acare_ray.scorer import ACARE_CONFIG_FILE

TRAINING_FILE = "training.json"
TRAINER_STATE_FILE = "trainer_state.pt"


def hf_model(scorer: Any) -> nn.Module:
    """The Hugging Face ``PreTrainedModel`` inside a scorer."""
    backend = scorer.backend
    return backend.module.lm if backend.name == "causal_lm" else backend.model


def hf_tokenizer(scorer: Any) -> Any:
    backend = scorer.backend
    return backend.encoder.tokenizer if backend.name == "causal_lm" else backend.tokenizer


@contextlib.contextmanager
def full_parameters(model: nn.Module) -> Iterator[None]:
    """Inside, every rank's module holds full (unsharded) parameters.

    A no-op for DDP and single-process models, whose parameters are always whole; an FSDP2
    (``fully_shard``) model is unsharded on entry and resharded on exit. All ranks must enter.
    """
    if hasattr(model, "unshard") and hasattr(model, "reshard"):
        model.unshard()
        try:
            yield
        finally:
            model.reshard()
    else:
        yield


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
    scorer: Any,
    *,
    info: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
) -> Path:
    """Write a servable checkpoint of ``scorer``'s current weights into ``directory``.

    ``info`` (JSON-serialisable: step, config, history) goes to ``training.json``;
    ``trainer_state`` (optimizer/scheduler state dicts) to ``trainer_state.pt``. The caller makes
    sure the weights are whole (see :func:`full_parameters`) and that one rank writes.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_model(scorer).save_pretrained(directory)
    hf_tokenizer(scorer).save_pretrained(directory)
    (directory / ACARE_CONFIG_FILE).write_text(json.dumps(scorer.acare_config(), indent=2) + "\n")
    (directory / TRAINING_FILE).write_text(json.dumps(info, indent=2) + "\n")
    if trainer_state is not None:
        torch.save(trainer_state, directory / TRAINER_STATE_FILE)
    return directory


def read_training_info(directory: str | os.PathLike) -> dict[str, Any]:
    """``training.json`` of a checkpoint (step, epoch, config, history)."""
    path = Path(directory) / TRAINING_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a training checkpoint (no {TRAINING_FILE})")
    return json.loads(path.read_text())


def read_trainer_state(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / TRAINER_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint has no optimizer state to resume from")
    return torch.load(path, map_location="cpu", weights_only=True)
